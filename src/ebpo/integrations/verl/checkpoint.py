"""ebpo's state in verl's checkpoints, beside ``actor/`` and ``data.pt``: ``global_step_N/ebpo_estimator.pt``
(the estimator) and ``global_step_N/ebpo_sampler.pt`` (a clustered sampler's stream cursor).

A checkpoint verl marks complete (``latest_checkpointed_iteration.txt``) without ``ebpo_estimator.pt``
(:func:`restore_estimator_state`): when another ``global_step_*`` folder of the same run holds the file, this
run wrote priors and lost this one (a kill between verl's save and ours, possible under verl's own launcher,
whose checkpoint callback runs after the mark), so the resume stops with one line naming the last checkpoint
that has it; otherwise the checkpoint comes from another trainer (a GRPO run, say) and the estimator starts
from an empty prior, with one warning line.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from ebpo.integrations import ESTIMATOR_STATE_FILE
from ebpo.integrations.verl.estimators import HOLDER, EstimatorHolder
from ebpo.persist import load_torch, save_torch_atomic

logger = logging.getLogger(__name__)

__all__ = [
    "ESTIMATOR_STATE_FILE",
    "SAMPLER_STATE_FILE",
    "save_estimator_state",
    "load_estimator_state",
    "restore_estimator_state",
    "save_sampler_state",
    "load_sampler_state",
    "resolve_resume_folder",
]

SAMPLER_STATE_FILE = "ebpo_sampler.pt"
_DAMAGED_FIX = "resume from an earlier global_step_N folder (trainer.resume_from_path), or delete the file"


def save_estimator_state(folder: str | os.PathLike, holder: EstimatorHolder | None = None) -> Path:
    """Write the holder's state to ``folder/ebpo_estimator.pt`` atomically (temporary file, then rename)."""
    owner = holder if holder is not None else HOLDER
    return save_torch_atomic(owner.state_dict(), Path(folder) / ESTIMATOR_STATE_FILE)


def load_estimator_state(folder: str | os.PathLike, holder: EstimatorHolder | None = None) -> bool:
    """Restore ``folder/ebpo_estimator.pt`` into the holder; False if the checkpoint has none."""
    owner = holder if holder is not None else HOLDER
    path = Path(folder) / ESTIMATOR_STATE_FILE
    if not path.is_file():
        return False
    owner.load_state_dict(load_torch(path, fix=_DAMAGED_FIX), source=str(path))
    return True


def restore_estimator_state(folder: str | os.PathLike, holder: EstimatorHolder | None = None) -> bool:
    """Restore ``folder/ebpo_estimator.pt`` (the checkpoint a resume starts from); True if it was there.

    Without it: ``ValueError`` (one line naming the folder and the last checkpoint that has the file) when
    another ``global_step_*`` folder beside it holds one, else one warning line on stderr and False (the
    estimator starts from an empty prior). See the module docstring.
    """
    if load_estimator_state(folder, holder):
        return True
    folder = Path(folder)
    step = _step_of(folder)
    others = sorted(
        (_step_of(path.parent), path.parent)
        for path in folder.parent.glob(f"global_step_*/{ESTIMATOR_STATE_FILE}")
    )
    if others:
        earlier = [path for number, path in others if number < step]
        fix = (
            f"resume from {earlier[-1]} (trainer.resume_mode=resume_path trainer.resume_from_path={earlier[-1]})"
            if earlier
            else "start again without it"
        )
        raise ValueError(
            f"{folder} has no {ESTIMATOR_STATE_FILE} although this run saved one in other checkpoints (the run "
            f"stopped after verl marked the checkpoint complete and before the prior was written): {fix}, or "
            f"delete {folder}"
        )
    logger.warning(
        f"[ebpo] WARNING: {folder / ESTIMATOR_STATE_FILE} does not exist (a checkpoint written by another "
        "trainer): the estimator resumes with an empty prior"
    )
    return False


def _step_of(folder: Path) -> int:
    match = re.fullmatch(r"global_step_(\d+)", folder.name)
    return int(match.group(1)) if match else -1


def save_sampler_state(folder: str | os.PathLike, sampler: Any) -> Path | None:
    """Write a clustered sampler's stream cursor (``sampler.state_dict()``) to ``folder/ebpo_sampler.pt``
    atomically; None (nothing written) for any other sampler."""
    from ebpo.data.samplers import StreamSampler

    if not isinstance(sampler, StreamSampler):
        return None
    return save_torch_atomic(sampler.state_dict(), Path(folder) / SAMPLER_STATE_FILE)


def load_sampler_state(folder: str | os.PathLike, sampler: Any) -> bool:
    """Restore ``folder/ebpo_sampler.pt`` into a clustered sampler; False if there is none (or no such
    sampler). The stream checks that the state is its own (name, records, batch size, seed)."""
    from ebpo.data.samplers import StreamSampler

    path = Path(folder) / SAMPLER_STATE_FILE
    if not isinstance(sampler, StreamSampler) or not path.is_file():
        return False
    sampler.load_state_dict(load_torch(path, fix=_DAMAGED_FIX))
    return True


def resolve_resume_folder(trainer_config: Any) -> str | None:
    """The ``global_step_N`` folder verl resumes from for ``trainer.resume_mode`` (None: fresh start)."""
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

    mode = trainer_config.resume_mode
    if mode == "disable":
        return None
    if mode == "resume_path":
        folder = str(trainer_config.resume_from_path)
    else:
        base = str(trainer_config.default_local_dir)
        folder = find_latest_ckpt_path(base if os.path.isabs(base) else os.path.join(os.getcwd(), base))
        if folder is None:
            return None
    return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)
