"""Where ``ebpo train``'s configuration comes from, and where it goes.

``load_config`` layers the defaults of :class:`ebpo.trainer.config.TrainConfig`, a run's saved ``config.yaml``
(``--resume``), a YAML file or a preset shipped in ``src/ebpo/configs/`` (``--config grpo``) and ``key=value``
overrides, reading earlier spellings of keys as their present ones (:data:`RENAMED`); ``save_config`` writes
a run's configuration. Nothing heavy at import (``TrainConfig``, which needs torch, and PyYAML are imported on
use), so that ``ebpo train --help`` lists the presets without importing torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ebpo import settings
from ebpo.errors import ConfigError
from ebpo.persist import write_text_atomic

if TYPE_CHECKING:
    from ebpo.trainer.config import TrainConfig

PRESETS_DIR = Path(__file__).resolve().parents[1] / "configs"

RENAMED = {"algorithm.loss_options": "algorithm.loss"}
"""Earlier spellings of keys, read as their present ones; so is ``algorithm.estimator_options`` as
``algorithm.ebpo`` when the estimator is ``ebpo`` (:func:`load_config`; for other estimators it holds their
own options)."""


def list_presets() -> list[str]:
    """Names of the presets shipped with the package (``src/ebpo/configs/<name>.yaml``), sorted."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def resolve_config(name_or_path: str | Path) -> Path:
    """The YAML file of ``--config``: an existing file as given, else the shipped preset of that name
    (``grpo`` or ``grpo.yaml``); neither raises ``ConfigError`` listing the presets."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    text = str(name_or_path)
    stem = text[: -len(".yaml")] if text.endswith(".yaml") else text
    if "/" not in stem and (PRESETS_DIR / f"{stem}.yaml").is_file():
        return PRESETS_DIR / f"{stem}.yaml"
    raise ConfigError(
        f"--config {text}: no such file and no preset of that name; presets: {', '.join(list_presets())}"
    )


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    *,
    base: dict[str, Any] | None = None,
) -> TrainConfig:
    """Defaults <- ``base`` (a nested dict: a run's saved config.yaml) <- the YAML file ``path`` (a file, or a
    preset name: :func:`resolve_config`) <- ``overrides`` (``key=value``), each checked; ``ConfigError`` names
    the key at fault (and the file, when it came from one). The plugins of ``run.plugins`` are imported before
    the config is built."""
    from ebpo.trainer.config import TrainConfig

    layers = [base or {}]
    if path is not None:
        path = resolve_config(path)
        layers.append(settings.read_yaml(path))
    overrides = list(overrides or [])
    # algorithm.estimator_options is EBPO's section only when the estimator is ebpo: find the estimator first
    algorithm = settings.merge(layers, overrides).get("algorithm")
    estimator = algorithm.get("estimator", "ebpo") if isinstance(algorithm, dict) else "ebpo"
    renames = {
        **RENAMED,
        **({"algorithm.estimator_options": "algorithm.ebpo"} if estimator == "ebpo" else {}),
    }
    try:
        values = settings.merge(layers, overrides, renames)
        _load_plugins(values)
        return settings.build(TrainConfig, values)
    except ConfigError as err:
        where = f" (in {path})" if path is not None else ""
        raise ConfigError(f"{err}{where}") from None


def _load_plugins(values: dict[str, Any]) -> None:
    """Import the plugins ``run.plugins`` names (``ebpo.plugins``), before any name in the config is checked,
    and put them back resolved (files absolute: a resume from another directory loads the same ones). A value
    that is not a list of names is left for the config's own check to name."""
    from ebpo.plugins import load_plugins

    run = values.get("run")
    if not isinstance(run, dict):
        return
    names = run.get("plugins")
    if isinstance(names, list) and all(isinstance(name, str) for name in names):
        run["plugins"] = load_plugins(names)


def save_config(cfg: TrainConfig, path: str | Path, comment: str = "") -> None:
    """Write ``cfg`` as YAML, atomically (a kill leaves the old file or the new one, never half of one), with
    ``comment`` (YAML comment lines: a run's config changes on resume) at the end."""
    import yaml

    write_text_atomic(path, yaml.safe_dump(cfg.to_dict(), sort_keys=False) + comment)
