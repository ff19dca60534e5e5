"""Checkpoints of the reference trainer: what ``checkpoints/<name>`` holds, writing one that survives a kill
or a full disk, checking it before a resume loads it, the trainer state, every RNG state.

A checkpoint (in a :class:`ebpo.run_directory.RunDirectory`, ``checkpoints/last`` and ``checkpoints/best``) holds
``model/`` (model + tokenizer, ``from_pretrained`` loads it), ``trainer_state.pt``, any extra files
(``best.json``) and ``manifest.json`` (every other file's size and SHA-256, and the step). It is written
whole by :func:`ebpo.persist.replace_dir` with fixed spare names: into ``checkpoints/.<name>.tmp``, whose
``trainer_state.pt`` goes after the model (atomically) and ``manifest.json`` last, so a checkpoint directory
that holds ``trainer_state.pt`` is complete; then two renames swap it in (``<name>`` -> ``.<name>.old``,
``.<name>.tmp`` -> ``<name>``) and the old copy is removed. Between the two renames there is no ``<name>``;
:func:`find_checkpoint` then moves the complete ``.<name>.tmp`` (or, failing that, ``.<name>.old``) into
place. A kill at any moment thus leaves a resumable run, and a write the disk refuses leaves the previous
checkpoint as it was (:class:`ebpo.persist.WriteError`).

Before a resume loads anything, :func:`find_checkpoint` checks the checkpoint against its manifest: a file
cut short or changed is one :class:`DamagedCheckpoint` line naming it, with the resume command for the
newest intact checkpoint of the run. A checkpoint without a manifest (written before checkpoints had one)
loads as it always did, unchecked; a file of it that does not load is still one line
(:func:`load_trainer_state`, ``ebpo.trainer.setup.load_policy``).
"""

from __future__ import annotations

import difflib
import os
import random
import shlex
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ebpo.errors import ConfigError
from ebpo.models.paths import checkpoint_step
from ebpo.persist import (
    DamagedFile,
    WriteError,
    load_torch,
    read_manifest,
    replace_dir,
    save_torch_atomic,
    verify_manifest,
    write_manifest,
)
from ebpo.run_directory import RunDirectory

LAST = RunDirectory.LAST
BEST = RunDirectory.BEST
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
        model.save_pretrained(tmp / RunDirectory.MODEL)
        tokenizer.save_pretrained(tmp / RunDirectory.MODEL)
        for file_name, text in (extra_files or {}).items():
            (tmp / file_name).write_text(text, encoding="utf-8")
        save_torch_atomic(state, tmp / STATE_FILE)  # from here on, tmp is complete
        write_manifest(tmp, step=int(state["step"]))  # and checkable

    final = run_dir / RunDirectory.CHECKPOINTS / name
    try:
        return replace_dir(final, fill, spares=_spares(final))
    except WriteError as err:  # named by the checkpoint, not by the file of its staging copy that failed
        kept = f"{final} is as it was" if _is_complete(final) else f"no checkpoint {name} was written"
        raise WriteError(final, err.code, kept) from err


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


_EXPECTED = (
    f"expected a run directory ({RunDirectory.CONFIG} and {RunDirectory.CHECKPOINTS}/{LAST}/{STATE_FILE} inside) "
    f"or one checkpoint of it (<run>/{RunDirectory.CHECKPOINTS}/<name>, e.g. <run>/{RunDirectory.CHECKPOINTS}/{BEST})"
)


def _close_matches(path: Path) -> str:
    """`` (did you mean ...?)`` naming the entries beside ``path`` whose names are close to its own, or ""."""
    try:
        names = [entry.name for entry in path.parent.iterdir() if entry.is_dir()]
    except OSError:
        return ""
    close = difflib.get_close_matches(path.name, names, n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(str(path.parent / name) for name in close)}?)" if close else ""


def _run_directories_in(path: Path) -> str:
    """``; run directories in it: ...`` naming up to three of the newest run directories directly inside
    ``path`` (``runs/``, say), or ""."""
    try:
        runs = [entry for entry in path.iterdir() if (entry / RunDirectory.CONFIG).is_file()]
    except OSError:
        return ""
    newest = sorted(runs, key=lambda run: (run / RunDirectory.CONFIG).stat().st_mtime)[-3:]
    return f"; run directories in it: {', '.join(str(run) for run in newest)}" if newest else ""


def resume_run_dir(resume: str | Path, *, need_config: bool = True) -> Path:
    """The run directory of a ``--resume`` path (:func:`run_dir_of`), or one :class:`ConfigError` naming what
    is wrong with the path: the part of it that does not exist (with the names beside it that come close), or
    why what is there is neither a run directory nor one of its checkpoints, and what was expected.
    ``need_config=False``: only that the path exists (the Python API resumes a checkpoint without its run's
    ``config.yaml``; :func:`find_checkpoint` then says what is missing inside it)."""
    path = Path(resume)
    if not path.exists():
        missing = path
        while not missing.parent.exists() and missing.parent != missing:
            missing = missing.parent
        where = f"{path} does not exist" + ("" if missing == path else f" (there is no {missing}/)")
        raise ConfigError(f"--resume {resume}: {where}{_close_matches(missing)}; {_EXPECTED}")
    run = run_dir_of(path)
    if (run / RunDirectory.CONFIG).is_file() or not need_config:
        return run
    if (path / RunDirectory.CHECKPOINTS).is_dir() or path.name == RunDirectory.CHECKPOINTS:
        problem = (
            f"{run} holds {RunDirectory.CHECKPOINTS}/ but no {RunDirectory.CONFIG}, which a resume reads"
        )
    elif _is_complete(path) or path.parent.name == RunDirectory.CHECKPOINTS:
        problem = (
            f"{path} is a checkpoint, but {run / RunDirectory.CONFIG} does not exist (copied out of its run?)"
        )
    else:
        problem = f"{path} is neither a run directory nor a checkpoint{_run_directories_in(path)}"
    raise ConfigError(f"--resume {resume}: {problem}; {_EXPECTED}")


def find_checkpoint(resume: str | Path) -> Path:
    """The complete, intact checkpoint for ``--resume``: ``resume`` itself, ``resume/last`` or
    ``resume/checkpoints/last``, checked against its manifest (:func:`verify_checkpoint`)."""
    path = Path(resume)
    for candidate in (path, path / LAST, path / RunDirectory.CHECKPOINTS / LAST):
        if _recover(candidate):
            verify_checkpoint(candidate)
            return candidate
    raise ConfigError(
        f"--resume {resume}: no checkpoint there (looked for {RunDirectory.CHECKPOINTS}/{LAST}/{STATE_FILE})"
    )


class DamagedCheckpoint(DamagedFile):
    """A file of a checkpoint is damaged; the message names it and how to resume from the newest intact
    checkpoint of the run, or to start over."""


def resume_command(checkpoint: Path) -> str:
    """``ebpo train --resume ...`` continuing from ``checkpoint``: its run directory for ``last``, the
    checkpoint itself otherwise."""
    from ebpo.settings import command_prefix

    target = run_dir_of(checkpoint) if checkpoint.name == LAST else checkpoint
    return f"{command_prefix()} train --resume {shlex.quote(str(target))}"


def start_over_command(run_dir: Path) -> str:
    """``ebpo train`` starting the run in ``run_dir`` over from its saved config."""
    from ebpo.settings import command_prefix

    config = shlex.quote(str(run_dir / RunDirectory.CONFIG))
    return f"{command_prefix()} train --config {config} --run-dir {shlex.quote(str(run_dir))} --overwrite"


def newest_intact(
    run_dir: Path, *, excluding: Path | None = None, verify: bool = True
) -> tuple[Path, int] | None:
    """``(checkpoint, step)`` of the run's newest checkpoint (``last`` or ``best``, other than ``excluding``)
    that its manifest passes, or that loads where it has none; None if there is none. ``verify=False``
    reads the steps from the manifests without checking the files (right after this process wrote them)."""
    found = []
    for name in (LAST, BEST):
        checkpoint = run_dir / RunDirectory.CHECKPOINTS / name
        if excluding is not None and checkpoint.resolve() == excluding.resolve():
            continue
        if not _is_complete(checkpoint):
            continue
        try:
            if (read_manifest(checkpoint) if not verify else verify_manifest(checkpoint)) is not None:
                step = checkpoint_step(checkpoint)
            else:  # written without a manifest: its state says the step, if it loads
                step = int(load_trainer_state(checkpoint)["step"])
        except ConfigError:
            continue
        if step is not None:
            found.append((step, name == LAST, checkpoint))
    if not found:
        return None
    step, _, checkpoint = max(found)  # the newest; between equal steps, last
    return checkpoint, step


def instead_of(checkpoint: Path, use: str | None = None) -> str:
    """What to do when ``checkpoint`` cannot be used: continue from the newest intact checkpoint of its run
    (``ebpo train --resume``, or the command ``use`` followed by that checkpoint's path: ``ebpo eval``), or
    start over. A checkpoint outside a run directory (copied elsewhere) has no other to turn to."""
    if checkpoint.parent.name != RunDirectory.CHECKPOINTS:
        return "restore it from a copy"
    run_dir = run_dir_of(checkpoint)
    newest = newest_intact(run_dir, excluding=checkpoint)
    if newest is None:
        if use is not None:
            return f"{run_dir} holds no intact checkpoint"
        return f"{run_dir} holds no intact checkpoint: start over with `{start_over_command(run_dir)}`"
    other, step = newest
    command = resume_command(other) if use is None else f"{use} {shlex.quote(str(other))}"
    return f"the newest intact checkpoint is {other} (step {step}): `{command}`"


def verify_checkpoint(checkpoint: Path, *, under: str = "", use: str | None = None) -> None:
    """Check ``checkpoint``'s files (those below ``under`` only, if given) against its manifest before
    anything loads them: a damaged one is a :class:`DamagedCheckpoint` naming it, and the newest intact
    checkpoint of the run to use instead (:func:`instead_of`; ``use``: the command the user runs on a
    checkpoint, default ``ebpo train --resume``). No manifest (an older checkpoint): nothing is checked."""
    try:
        verify_manifest(checkpoint, under=under)
    except DamagedFile as err:
        raise DamagedCheckpoint(err.path, err.problem, instead_of(checkpoint, use)) from None


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state of a checkpoint; a file that cannot be read, or lacks keys, is one clear error."""
    path = checkpoint / STATE_FILE
    fix = "restore the checkpoint from a copy, or start over with --overwrite"
    state = load_torch(path, fix=fix)
    missing = [key for key in STATE_KEYS if not isinstance(state, dict) or key not in state]
    if missing:
        raise DamagedFile(path, f"is damaged: it lacks {missing}", fix)
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
    """Every RNG the loop touches: Python, NumPy, torch CPU (+ CUDA), and the sampling generator, as tensors,
    numbers, strings and lists (what ``torch.load(weights_only=True)`` reads): Python's as ``[version,
    [625 ints], gauss_next]``, NumPy's as ``["MT19937", key (624,) int64, pos, has_gauss, cached_gaussian]``."""
    version, internal, gauss_next = random.getstate()
    name, key, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state = {
        "python": [version, list(internal), gauss_next],
        "numpy": [
            str(name),
            torch.from_numpy(np.asarray(key).astype(np.int64)),
            int(pos),
            int(has_gauss),
            float(cached_gaussian),
        ],
        "torch": torch.get_rng_state(),
        "generator": generator.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def load_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    """Set every RNG from :func:`rng_state`'s dict, or from ebpo 0.1.0's (Python's state as a tuple, NumPy's
    key as a uint32 array): the same generators either way."""
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    name, key, pos, has_gauss, cached_gaussian = state["numpy"]
    key = key.numpy() if isinstance(key, torch.Tensor) else np.asarray(key)
    np.random.set_state((name, key.astype(np.uint32), pos, has_gauss, cached_gaussian))
    torch.set_rng_state(state["torch"])
    generator.set_state(state["generator"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
