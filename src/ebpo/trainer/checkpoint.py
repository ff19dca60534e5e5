"""Checkpoints of the reference trainer: what ``checkpoints/<name>`` holds, writing one that survives a kill,
finding it again for ``--resume``, the trainer state, every RNG state.

A checkpoint (in a :class:`ebpo.persist.RunDirectory`, ``checkpoints/last`` and ``checkpoints/best``) holds
``model/`` (model + tokenizer, ``from_pretrained`` loads it), ``trainer_state.pt`` and any extra files
(``best.json``). It is written whole by :func:`ebpo.persist.replace_dir` with fixed spare names: into
``checkpoints/.<name>.tmp``, whose ``trainer_state.pt`` goes last (atomically), so a checkpoint directory
that holds ``trainer_state.pt`` is complete; then two renames swap it in (``<name>`` -> ``.<name>.old``,
``.<name>.tmp`` -> ``<name>``) and the old copy is removed. Between the two renames there is no ``<name>``;
:func:`find_checkpoint` then moves the complete ``.<name>.tmp`` (or, failing that, ``.<name>.old``) into
place. A kill at any moment thus leaves a resumable run.
"""

from __future__ import annotations

import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ebpo.errors import ConfigError
from ebpo.persist import RunDirectory, replace_dir, save_torch_atomic

LAST = "last"
BEST = "best"
STATE_FILE = "trainer_state.pt"
STATE_KEYS = ("step", "optimizer", "scheduler", "estimator", "sampler", "rng", "best_score", "best_step")
"""Keys a trainer state must hold to resume from it."""


# ---------------------------------------------------------------------------------------------------
# checkpoints


def _is_complete(checkpoint: Path) -> bool:
    return (checkpoint / STATE_FILE).is_file()


def _spares(final: Path) -> tuple[Path, Path]:
    """The new copy being written and the old copy being removed, beside ``checkpoints/<name>``."""
    return final.with_name(f".{final.name}.tmp"), final.with_name(f".{final.name}.old")


def save_checkpoint(
    run_dir: Path,
    name: str,
    model: Any,
    tokenizer: Any,
    state: dict[str, Any],
    extra_files: dict[str, str] | None = None,
) -> Path:
    """Write ``checkpoints/<name>``: ``model/`` (model + tokenizer, ``from_pretrained`` loads it), the trainer
    ``state`` and ``extra_files`` (name -> text); a kill at any moment leaves a complete checkpoint (module
    docstring). Returns its path."""

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp / "model")
        tokenizer.save_pretrained(tmp / "model")
        for file_name, text in (extra_files or {}).items():
            (tmp / file_name).write_text(text, encoding="utf-8")
        save_torch_atomic(state, tmp / STATE_FILE)  # from here on, tmp is complete

    final = run_dir / RunDirectory.CHECKPOINTS / name
    return replace_dir(final, fill, spares=_spares(final))


def _recover(final: Path) -> bool:
    """True if ``final`` is a complete checkpoint, after moving a complete spare copy into its place when a
    kill fell between the two renames of a save."""
    if _is_complete(final):
        return True
    if final.exists():
        return False
    for spare in _spares(final):
        if _is_complete(spare):
            os.replace(spare, final)
            for stale in _spares(final):  # the other copy, now out of date (the moved one is gone)
                shutil.rmtree(stale, ignore_errors=True)
            warnings.warn(
                f"{final}: recovered the checkpoint from {spare.name} (a save was interrupted)",
                RuntimeWarning,
                stacklevel=3,
            )
            return True
    return False


def run_dir_of(resume: str | Path) -> Path:
    """The run directory that ``--resume`` points into (a run directory, its ``checkpoints/`` or one
    checkpoint), read from the path alone: :func:`find_checkpoint` may repair the directory, so the run's
    lock is taken first."""
    path = Path(resume)
    if (path / RunDirectory.CHECKPOINTS).is_dir():
        return path
    return path.parent if path.name == RunDirectory.CHECKPOINTS else path.parent.parent


def find_checkpoint(resume: str | Path) -> Path:
    """The complete checkpoint for ``--resume``: ``resume`` itself, ``resume/last`` or
    ``resume/checkpoints/last``."""
    path = Path(resume)
    for candidate in (path, path / LAST, path / RunDirectory.CHECKPOINTS / LAST):
        if _recover(candidate):
            return candidate
    raise ConfigError(
        f"--resume {resume}: no checkpoint there (looked for {RunDirectory.CHECKPOINTS}/{LAST}/{STATE_FILE})"
    )


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state of a checkpoint; a file that cannot be read, or lacks keys, is one clear error."""
    path = checkpoint / STATE_FILE
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 - torch raises RuntimeError, EOFError, UnpicklingError, ...
        raise ConfigError(
            f"{path} is damaged and cannot be read ({type(err).__name__}: {str(err).splitlines()[0]}); restore "
            "the checkpoint from a copy, or start over with --overwrite"
        ) from err
    missing = [key for key in STATE_KEYS if not isinstance(state, dict) or key not in state]
    if missing:
        raise ConfigError(
            f"{path} is damaged: it lacks {missing}; restore the checkpoint from a copy, or start over with "
            "--overwrite"
        )
    return state


# ---------------------------------------------------------------------------------------------------
# random number generators


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def rng_state(generator: torch.Generator) -> dict[str, Any]:
    """Every RNG the loop touches: Python, NumPy, torch CPU (+ CUDA), and the sampling generator."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "generator": generator.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def load_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    generator.set_state(state["generator"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
