"""The presets shipped with the package (``src/ebpo/configs/<name>.yaml``) and how ``--config`` finds a file.

Standard library only, so that ``ebpo train --help`` can list the presets without importing torch.
"""

from __future__ import annotations

from pathlib import Path

from ebpo.errors import ConfigError

PRESETS_DIR = Path(__file__).resolve().parents[1] / "configs"


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
