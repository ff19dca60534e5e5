"""The run directory on disk: its layout, claiming it for a run, checkpoints that survive a kill, RNG state.

A run directory holds::

    config.yaml          the resolved config (the base of ``--resume``)
    metrics.jsonl        one JSON line per step (``ebpo.trainer.metrics_log``)
    tensorboard/         the same scalars for TensorBoard
    checkpoints/last/    model/ (from_pretrained) + trainer_state.pt, every run.save_every steps and at the end
    checkpoints/best/    the same at the best validation maj@k, + best.json
    summary.json         written at the end (``ebpo.trainer.report``)
    training.png         written at the end (``ebpo.trainer.plots``)
    .lock                while a process trains in it (:class:`DirectoryLock`)

A kill at any moment leaves a resumable run. A checkpoint is written to ``checkpoints/.<name>.tmp`` first;
its ``trainer_state.pt`` goes last, through a temporary file and a rename, so a checkpoint directory that
holds ``trainer_state.pt`` is complete. Then two renames swap it in: ``<name>`` -> ``.<name>.old``,
``.<name>.tmp`` -> ``<name>``, and the old copy is removed. Between the two renames there is no
``<name>``; :func:`find_checkpoint` then moves the complete ``.<name>.tmp`` (or, failing that,
``.<name>.old``) into place.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ebpo.trainer.config import ConfigError

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
PLOT_FILE = "training.png"
TENSORBOARD_DIR = "tensorboard"
CHECKPOINT_DIR = "checkpoints"
LAST = "last"
BEST = "best"
STATE_FILE = "trainer_state.pt"
RUN_OUTPUTS = (METRICS_FILE, CHECKPOINT_DIR, SUMMARY_FILE, TENSORBOARD_DIR, PLOT_FILE, CONFIG_FILE)
"""What a run writes; ``--overwrite`` removes exactly these (and nothing else in the directory)."""
STATE_KEYS = ("step", "optimizer", "scheduler", "estimator", "sampler", "rng", "best_score", "best_step")
"""Keys a trainer state must hold to resume from it."""


def _temporary_beside(path: Path) -> Path:
    """A fresh temporary name in ``path``'s directory (so that the final rename stays on one filesystem),
    unique to this process and call: writers that save to one path at once (several processes on a shared
    filesystem) never share a temporary file, and the last rename wins whole."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def _replace_from_temporary(path: Path, write: Any) -> None:
    """``write(tmp)`` to a temporary file beside ``path``, then rename it onto ``path``; the temporary file
    is removed if either step fails."""
    tmp = _temporary_beside(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a kill leaves the old content or the new, never part of it."""
    _replace_from_temporary(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def save_torch_atomic(state: Any, path: Path) -> Path:
    """``torch.save(state, path)`` so that a kill leaves the old file or the new one, never part of it
    (creates the parent directory if needed). Safe when several processes save to the same path at once:
    each writes its own temporary file, and ``path`` is always one whole file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _replace_from_temporary(path, lambda tmp: torch.save(state, tmp))
    return path


# ---------------------------------------------------------------------------------------------------
# the run directory


LOCK_FILE = ".lock"


class DirectoryInUse(ConfigError):
    """Another process holds the directory's lock."""


class DirectoryLock:
    """One process at a time in a directory: an exclusive ``fcntl.flock`` on ``<directory>/.lock``, which
    records the holder's pid. The kernel drops the lock when the holder closes it or ends, however it ends,
    so a killed run leaves no stale lock (only the file, which the next holder reuses). :meth:`release`
    removes the file while still holding it; :meth:`acquire` retries when the file it locked was removed
    meanwhile, so two processes never both hold it. Without ``fcntl`` (Windows) it does nothing.

    ``what`` names the directory in the error (``run directory``) and ``hint`` says what to do instead. Keep
    the object: the lock lasts as long as it does (or until :meth:`release`)."""

    def __init__(self, directory: str | Path, *, what: str, hint: str) -> None:
        self.directory, self.what, self.hint = Path(directory), what, hint
        self._handle: Any = None

    def acquire(self) -> DirectoryLock:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            return self
        if self._handle is not None:
            return self
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / LOCK_FILE
        while True:
            handle = open(path, "a+", encoding="utf-8")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.seek(0)
                holder = handle.read().strip() or "another process"
                handle.close()
                raise DirectoryInUse(
                    f"{self.what} {self.directory} is in use by {holder}; {self.hint}"
                ) from None
            try:
                current = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
            except FileNotFoundError:
                current = False
            if current:
                break
            handle.close()  # its holder removed the file as we opened it: lock the one there now
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} (since {time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        handle.flush()
        self._handle = handle
        return self

    def release(self) -> None:
        if self._handle is not None:
            try:
                os.unlink(self.directory / LOCK_FILE)  # still held: nobody can have locked it since
            except FileNotFoundError:
                pass
            self._handle.close()  # closing the descriptor drops the flock
            self._handle = None

    def __enter__(self) -> DirectoryLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


def check_run_dir(run_dir: Path, *, resuming: bool, overwrite: bool) -> None:
    """Refuse a fresh run into a directory that already holds one (its history would be mixed with the new
    one's and its checkpoints overwritten); ``--resume`` continues it, ``--overwrite`` replaces it."""
    if resuming or overwrite:
        return
    found = [name for name in (METRICS_FILE, CHECKPOINT_DIR, SUMMARY_FILE) if (run_dir / name).exists()]
    if found:
        raise ConfigError(
            f"run directory {run_dir} already holds a run ({', '.join(found)}); continue it with "
            f"`ebpo train --resume {run_dir}`, or pass --overwrite (Trainer(..., overwrite=True)) to replace it"
        )


def clear_run_dir(run_dir: Path) -> None:
    """Remove a previous run's outputs (:data:`RUN_OUTPUTS`) from ``run_dir``; other files stay."""
    for name in RUN_OUTPUTS:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


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
    final = run_dir / CHECKPOINT_DIR / name
    tmp, old = _spares(final)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp / "model")
    tokenizer.save_pretrained(tmp / "model")
    for file_name, text in (extra_files or {}).items():
        (tmp / file_name).write_text(text, encoding="utf-8")
    save_torch_atomic(state, tmp / STATE_FILE)  # from here on, tmp is complete
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    return final


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
    if (path / CHECKPOINT_DIR).is_dir():
        return path
    return path.parent if path.name == CHECKPOINT_DIR else path.parent.parent


def find_checkpoint(resume: str | Path) -> Path:
    """The complete checkpoint for ``--resume``: ``resume`` itself, ``resume/last`` or
    ``resume/checkpoints/last``."""
    path = Path(resume)
    for candidate in (path, path / LAST, path / CHECKPOINT_DIR / LAST):
        if _recover(candidate):
            return candidate
    raise ConfigError(
        f"--resume {resume}: no checkpoint there (looked for {CHECKPOINT_DIR}/{LAST}/{STATE_FILE})"
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
