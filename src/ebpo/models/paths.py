"""The model a path names, :func:`find_model`: a model directory, a checkpoint or a run directory, the same for
every command that takes a model (``ebpo eval``, ``ebpo train model.path=``; the built-in models' names are read
first by :func:`ebpo.models.names.resolve_model`)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from ebpo.errors import ConfigError
from ebpo.persist import DamagedFile, StrPath, read_manifest
from ebpo.run_directory import RunDirectory

__all__ = ["FoundModel", "checkpoint_step", "find_model"]


class FoundModel(NamedTuple):
    """The model directory behind a path a user gave (:func:`find_model`)."""

    path: Path
    """The directory ``from_pretrained`` loads: config, weights, tokenizer."""
    checkpoint: Path | None
    """The training checkpoint holding it (whose manifest covers ``model/``), or None."""
    note: str
    """Which model was picked, in one line, where the path was not the model directory itself; else ""."""


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def checkpoint_step(checkpoint: StrPath) -> int | None:
    """The step a checkpoint's manifest records; None without a (readable) manifest."""
    try:
        manifest = read_manifest(checkpoint)
    except DamagedFile:
        return None
    step = manifest.get("step") if manifest is not None else None
    return step if isinstance(step, int) else None


def _at_step(checkpoint: Path) -> str:
    step = checkpoint_step(checkpoint)
    return "" if step is None else f" (step {step})"


def find_model(path: StrPath) -> FoundModel:
    """The model a user means by ``path``, the same for every command that takes a model:

    - a model directory (``config.json`` and weights): itself;
    - a checkpoint (``checkpoints/<name>``): its ``model/``;
    - a run directory (or its ``checkpoints/``): its best checkpoint's model (the one ``ebpo train``
      reports), else its last one's; the note names both.

    Anything else is one :class:`ConfigError` saying what was expected."""
    given = Path(path)
    if not given.exists():
        raise ConfigError(f"{given} does not exist; give a model directory, a checkpoint or a run directory")
    if _is_model_dir(given):
        inside = given.name == RunDirectory.MODEL and given.parent.parent.name == RunDirectory.CHECKPOINTS
        return FoundModel(given, given.parent if inside else None, "")
    if _is_model_dir(given / RunDirectory.MODEL):
        model = given / RunDirectory.MODEL
        return FoundModel(model, given, f"{given} is a checkpoint{_at_step(given)}: using its model, {model}")
    run = given.parent if given.name == RunDirectory.CHECKPOINTS else given
    found = [
        run / RunDirectory.CHECKPOINTS / name
        for name in (RunDirectory.BEST, RunDirectory.LAST)
        if _is_model_dir(run / RunDirectory.CHECKPOINTS / name / RunDirectory.MODEL)
    ]
    if found:
        picked, model = found[0], found[0] / RunDirectory.MODEL
        note = f"{given} is a run directory: using its {picked.name} checkpoint{_at_step(picked)}, {model}"
        if len(found) > 1:
            note += f"; its {found[1].name} checkpoint{_at_step(found[1])} is {found[1]}"
        return FoundModel(model, picked, note)
    raise ConfigError(
        f"{given} holds no model: expected a model directory (config.json and weights), a checkpoint "
        f"({RunDirectory.MODEL}/ inside) or a run directory ({RunDirectory.CHECKPOINTS}/{RunDirectory.BEST} "
        f"or {RunDirectory.CHECKPOINTS}/{RunDirectory.LAST})"
    )
