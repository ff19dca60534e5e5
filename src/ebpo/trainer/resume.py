"""What a resume may change: the settings a checkpoint was trained under against those a resume asks for, and
the run's record of what changed at which step.

A resume continues the state of a checkpoint (the model, the optimizer, the estimator's prior, the sampler's
cursor, every RNG) under the config it is given. :func:`check_resume` compares that config with the one the
checkpoint was trained under, key by key: a difference in a key that shapes training refuses the resume in one
line naming each such key with its saved and requested values, unless the config says
``run.resume_overrides=allow``. The keys a run is extended with (:data:`EXTENDING_KEYS`: how long it runs,
how often it validates and saves, where it logs) change freely. Every change a resume makes, allowed or
extending, is one line of ``config_history.jsonl`` in the run directory (:func:`record_changes`): the step it
took effect at, the checkpoint and each key's saved and requested values; ``config.yaml`` holds the latest
values and ends with the same history as comments (:func:`history_comment`).
"""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ebpo.errors import ConfigError
from ebpo.persist import Journal
from ebpo.run_directory import RunDirectory
from ebpo.trainer.checkpoint import load_trainer_state
from ebpo.trainer.config_files import save_config

if TYPE_CHECKING:
    import torch

    from ebpo.trainer.config import OptimConfig, TrainConfig

HISTORY = RunDirectory.CONFIG_HISTORY
"""One JSON line per resume that changed the config: ``{"step", "checkpoint", "allowed", "changed": {key:
[saved, requested]}, "time"}``."""

EXTENDING_KEYS = frozenset(
    {
        "run.steps",
        "run.eval_every",
        "run.save_every",
        "run.report_to",
        "run.progress",
        "run.plot",
        "run.step_kl",
        "run.out_dir",
        "run.name",
        "run.plugins",
        "run.resume_overrides",
    }
)
"""Keys a resume changes without ``run.resume_overrides=allow``: how long the run goes on (``run.steps``), when
it validates and saves, the trackers and console output, ``actor/step_kl``'s tokens (a metric only), where a
new run directory would go and the files plugins come from (the names they register are compared where the
config uses them). None of them changes what a step computes."""

ALLOW = "allow"


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; an empty mapping is a value of its own."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def _resolved(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved config as this release reads it: earlier spellings renamed, keys added since at their defaults
    (what a run written before they existed ran with). One that this release no longer accepts is compared
    as written, over the defaults."""
    from ebpo.trainer.config import TrainConfig
    from ebpo.trainer.config_files import load_config

    try:
        return flatten(load_config(None, [], base=saved).to_dict())
    except ConfigError:
        return {**flatten(TrainConfig().to_dict()), **flatten(saved)}


def changed_settings(saved: dict[str, Any], requested: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved value, requested value)}`` for every key whose value differs (None where a key is absent
    from one side), in the order of the config's keys."""
    before, after = _resolved(saved), flatten(requested.to_dict())
    keys = list(after) + [key for key in before if key not in after]
    return {key: (before.get(key), after.get(key)) for key in keys if before.get(key) != after.get(key)}


def training_changes(changes: dict[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    """The changes outside :data:`EXTENDING_KEYS`: those that change what a step computes."""
    return {key: pair for key, pair in changes.items() if key not in EXTENDING_KEYS}


def saved_config(state: dict[str, Any], checkpoint: Path) -> dict[str, Any] | None:
    """The config ``checkpoint`` was trained under: the one its trainer state holds, else (a checkpoint of
    ebpo 0.1.0, whose state holds none) its run's ``config.yaml``; None where neither is there (a 0.1.0
    checkpoint copied out of its run directory: nothing to compare, with a warning)."""
    from ebpo.settings import read_yaml
    from ebpo.trainer.checkpoint import run_dir_of

    if isinstance(state.get("config"), dict):
        return state["config"]
    path = run_dir_of(checkpoint) / RunDirectory.CONFIG
    if path.is_file():
        return read_yaml(path)
    warnings.warn(
        f"{checkpoint}: no config beside it ({path}) to compare this resume's settings with; resuming under "
        "the settings given",
        RuntimeWarning,
        stacklevel=3,
    )
    return None


def as_saved(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` as a run saves it: ``run.resume_overrides`` back at ``refuse``, so that an ``allow`` holds for
    the one resume that gave it."""
    saved = copy.deepcopy(cfg)
    saved.run.resume_overrides = "refuse"
    return saved


def under_options(saved: Any, current: Any) -> Any:
    """An estimator's saved state with the options it records (``state["options"]``, as EBPO's does) replaced by
    the estimator's own: the saved state taken under the new options (``run.resume_overrides=allow``)."""
    if isinstance(saved, dict) and isinstance(current, dict) and "options" in saved and "options" in current:
        return {**saved, "options": current["options"]}
    return saved


def apply_optimizer_settings(optimizer: torch.optim.Optimizer, scheduler: Any, o: OptimConfig) -> None:
    """After the optimizer's and scheduler's saved states are loaded (AdamW's moments, the step count), put
    ``optim``'s settings in place of the saved ones: the learning rate (the scheduler's base, and the current
    rate at its step under the new warm-up), betas, eps and weight decay."""
    for group, lr_lambda in zip(optimizer.param_groups, scheduler.lr_lambdas, strict=True):
        group.update(betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay, initial_lr=o.lr)
        group["lr"] = o.lr * lr_lambda(scheduler.last_epoch)
    scheduler.base_lrs = [o.lr for _ in optimizer.param_groups]
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]  # noqa: SLF001 - get_last_lr()


@contextmanager
def keeping(checkpoint: Path, component: str, changes: dict[str, tuple[Any, Any]]) -> Iterator[None]:
    """Around loading one component's saved state under allowed changes: a state it refuses under the new
    settings (a sampler's cursor for another batch size) is one :class:`ConfigError` naming it."""
    try:
        yield
    except ValueError as err:
        changed = training_changes(changes)
        if not changed:
            raise
        raise ConfigError(
            f"--resume {checkpoint}: the {component}'s saved state does not carry over to the new settings "
            f"({', '.join(changed)}): {err}; resume without changing them, or start a new run"
        ) from None


def read_checkpoint(checkpoint: Path, cfg: TrainConfig) -> tuple[dict[str, Any], dict[str, tuple[Any, Any]]]:
    """A checkpoint's trainer state and the settings ``cfg`` changes against those it was trained under
    (:func:`changed_settings`); a change the config does not allow is refused here, before anything loads
    (:func:`check_resume`)."""
    state = load_trainer_state(checkpoint)
    saved = saved_config(state, checkpoint)
    changes = changed_settings(saved, cfg) if saved is not None else {}
    check_resume(changes, cfg, checkpoint)
    return state, changes


def load_components(
    state: dict[str, Any],
    checkpoint: Path,
    changes: dict[str, tuple[Any, Any]],
    cfg: TrainConfig,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    estimator: Any,
    sampler: Any,
) -> None:
    """Load a checkpoint's trainer ``state`` into the optimizer, scheduler, estimator and sampler, under the
    settings this resume changes (``changes``, already allowed by :func:`check_resume`): changed ``optim.``
    settings apply to the loaded optimizer and scheduler, another estimator starts from its own state, the same
    estimator under other options reads the saved prior under them (:func:`under_options`); a state that does
    not fit names the changed keys (:func:`keeping`)."""
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    estimator_state, changed = state["estimator"], training_changes(changes)
    if any(key.startswith("optim.") for key in changed):  # allowed: the new settings apply
        apply_optimizer_settings(optimizer, scheduler, cfg.optim)
    if "algorithm.estimator" in changed:  # allowed: another estimator starts from its own state
        estimator_state = estimator.state_dict()
    elif changed:  # allowed: the saved prior, read under the new options
        estimator_state = under_options(estimator_state, estimator.state_dict())
    with keeping(checkpoint, "estimator", changes):
        estimator.load_state_dict(estimator_state)
    with keeping(checkpoint, "sampler", changes):
        sampler.load_state_dict(state["sampler"])


def _value(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def check_resume(changes: dict[str, tuple[Any, Any]], cfg: TrainConfig, checkpoint: Path) -> None:
    """Refuse a resume whose config differs from the checkpoint's in a key outside :data:`EXTENDING_KEYS`:
    one :class:`ConfigError` naming each such key, its saved and requested values, and the two ways on;
    nothing with ``run.resume_overrides=allow``."""
    refused = training_changes(changes)
    if not refused or cfg.run.resume_overrides == ALLOW:
        return
    listed = "; ".join(
        f"{key}: saved {_value(saved)}, requested {_value(wanted)}"
        for key, (saved, wanted) in refused.items()
    )
    raise ConfigError(
        f"--resume {checkpoint}: the checkpoint was trained with other settings ({listed}); drop those "
        "overrides to continue it as it was, or add run.resume_overrides=allow to continue its state under "
        f"the new settings (recorded in the run's {HISTORY})"
    )


def history(run_dir: Path) -> list[dict[str, Any]]:
    """The lines of the run's ``config_history.jsonl`` (none where it has none)."""
    return _journal(run_dir).read()


def _journal(run_dir: Path) -> Journal:
    return Journal(run_dir / HISTORY, fix="the file is damaged: repair or delete that line", sort_keys=True)


def record_changes(
    run_dir: Path, step: int, checkpoint: Path, changes: dict[str, tuple[Any, Any]], allowed: bool
) -> None:
    """Append one line to the run's ``config_history.jsonl``: the config changed by a resume from
    ``checkpoint`` (at ``step``), each key's saved and requested values; nothing when nothing changed.
    ``allowed``: the resume took ``run.resume_overrides=allow``."""
    changes = {key: pair for key, pair in changes.items() if key != "run.resume_overrides"}
    if not changes:
        return
    journal = _journal(run_dir)
    journal.read(repair=True)  # a line torn by a kill goes before this one is appended
    row = {
        "step": step,
        "checkpoint": str(checkpoint),
        "allowed": allowed,
        "changed": {key: [saved, wanted] for key, (saved, wanted) in changes.items()},
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    journal.append([row])


def save_run_config(
    run_dir: Path, cfg: TrainConfig, step: int, checkpoint: Path | None, changes: dict[str, tuple[Any, Any]]
) -> None:
    """``config.yaml`` for a run starting (or resuming at ``step`` from ``checkpoint``): a resume's ``changes``
    recorded first (:func:`record_changes`), then the config as saved (:func:`as_saved`), ending with the run's
    history of changes as comments (:func:`history_comment`)."""
    if checkpoint is not None:
        allowed = cfg.run.resume_overrides == ALLOW
        record_changes(run_dir, step, checkpoint, changes, allowed)
    save_config(as_saved(cfg), run_dir / RunDirectory.CONFIG, history_comment(run_dir))


def history_comment(run_dir: Path) -> str:
    """The run's ``config_history.jsonl`` as YAML comment lines for the end of ``config.yaml`` ("" where the
    config never changed)."""
    lines = []
    for entry in history(run_dir):
        changed = ", ".join(
            f"{key} {_value(saved)} -> {_value(wanted)}" for key, (saved, wanted) in entry["changed"].items()
        )
        lines.append(f"# step {entry['step']} (resumed from {entry['checkpoint']}): {changed}")
    if not lines:
        return ""
    return f"# config changes on resume (from {HISTORY}):\n" + "\n".join(lines) + "\n"
