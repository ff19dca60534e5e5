"""The directory of one ``ebpo train`` run, :class:`RunDirectory`: its layout and timestamped name, one process at
a time, fresh / resumed / overwritten, its metrics journal rewound to a checkpoint, its summary.

Built from :mod:`ebpo.persist`'s primitives (:class:`~ebpo.persist.Journal`, :class:`~ebpo.persist.DirectoryLock`,
atomic writes), below everything that reads or writes a run: the trackers, the trainer, the model paths
(:mod:`ebpo.models.paths`), ``ebpo eval`` and ``ebpo diagnose``.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ebpo.errors import ConfigError
from ebpo.persist import DirectoryLock, Journal, StrPath, write_text_atomic

__all__ = ["RunDirectory"]


class RunDirectory:
    """The directory of one ``ebpo train`` run::

        config.yaml          the resolved config (the base of ``--resume``)
        metrics.jsonl        one JSON line per step (a :class:`Journal`)
        tensorboard/         the same scalars for TensorBoard
        checkpoints/last/    model/ (from_pretrained) + trainer_state.pt (``ebpo.trainer.checkpoint``)
                             + manifest.json (written last: :func:`write_manifest`)
        checkpoints/best/    the same at the best validation maj@k, + best.json
        summary.json         written at the end
        training.png         written at the end
        trackers.json        the runs of the experiment trackers it reports to (``ebpo.trackers``)
        config_history.jsonl what each resume changed in the config, at which step (``ebpo.trainer.resume``)
        .lock                while a process trains in it (:class:`DirectoryLock`)

    Its life: :meth:`claim` takes the lock; :meth:`check` refuses a fresh run where a run already is (and
    ``--resume`` with ``--overwrite`` of the same run); :meth:`start`, once the checkpoint is loaded, rewinds
    the metrics journal to the checkpoint's step (a resume in place) or removes the previous run's outputs
    (``--overwrite``); :meth:`write_summary` at the end; :meth:`release`. A run refused before it started
    (:meth:`abandon`) leaves no lock and no empty directory behind.
    """

    CONFIG = "config.yaml"
    METRICS = "metrics.jsonl"
    TENSORBOARD = "tensorboard"
    CHECKPOINTS = "checkpoints"
    LAST = "last"
    BEST = "best"
    MODEL = "model"
    """A checkpoint's model and tokenizer, ``checkpoints/<name>/model`` (``from_pretrained`` loads it)."""
    SUMMARY = "summary.json"
    PLOT = "training.png"
    TRACKERS = "trackers.json"
    """The experiment trackers' runs (wandb, MLflow) this run reports to, so that ``--resume`` continues them."""
    CONFIG_HISTORY = "config_history.jsonl"
    """One line per resume that changed the config: the step, the checkpoint, each key's saved and new value."""
    OUTPUTS = (METRICS, CHECKPOINTS, SUMMARY, TENSORBOARD, PLOT, CONFIG, TRACKERS, CONFIG_HISTORY)
    """What a run writes; ``--overwrite`` removes exactly these (and nothing else in the directory)."""

    def __init__(self, path: StrPath) -> None:
        self.path = Path(path)
        self._lock = DirectoryLock(
            self.path, what="run directory", hint="wait for that run to finish, or choose another directory"
        )
        self._created = False

    @staticmethod
    def timestamped(method: str) -> str:
        """A run directory name for a run started now: ``<UTC yyyymmdd-hhmmss>-<method>``."""
        return f"{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}-{method}"

    @property
    def metrics(self) -> Journal:
        """The metrics journal, ``metrics.jsonl``."""
        return Journal(
            self.path / self.METRICS, fix="the file is damaged: repair or delete that line", sort_keys=True
        )

    def holds(self, checkpoint: Path) -> bool:
        """Whether ``checkpoint`` (``<run>/checkpoints/<name>``) is one of this run's."""
        return self.path.resolve() == checkpoint.parent.parent.resolve()

    def claim(self) -> RunDirectory:
        """Take the directory for this process (created if missing): a second process, training or resuming
        here, gets one line (:class:`DirectoryInUse`) instead of two processes writing the same files."""
        self._created = not self.path.exists()
        self._lock.acquire()
        return self

    def check(self, *, resuming: bool, overwrite: bool) -> None:
        """Refuse what would mix two runs: ``--resume`` and ``--overwrite`` of this same run, or a fresh run
        into a directory that already holds one (its history would mix with the new one's and its checkpoints
        be overwritten); ``--resume`` continues it, ``--overwrite`` replaces it. ``resuming``: from one of
        this run's own checkpoints."""
        if resuming and overwrite:
            raise ConfigError(
                f"--resume and --overwrite of the same run directory {self.path} contradict each other: "
                "drop --overwrite to continue the run, or --resume to start it over"
            )
        if resuming or overwrite:
            return
        found = [
            name for name in (self.METRICS, self.CHECKPOINTS, self.SUMMARY) if (self.path / name).exists()
        ]
        if found:
            raise ConfigError(
                f"run directory {self.path} already holds a run ({', '.join(found)}); continue it with "
                f"`ebpo train --resume {self.path}`, or pass --overwrite (Trainer(..., overwrite=True)) to "
                "replace it"
            )

    def start(self, *, rewind_to: int | None, overwrite: bool) -> int:
        """Make the directory ready for the run: a resume in place keeps the metrics up to ``rewind_to`` (the
        checkpoint's step; later lines and a torn last line go), ``overwrite`` removes a previous run's
        outputs (:data:`OUTPUTS`; other files stay). Returns how many whole metrics lines past ``rewind_to``
        went (steps the run had logged after its checkpoint)."""
        dropped = 0
        if rewind_to is not None:
            dropped = self.metrics.retain(lambda row: row["step"] <= rewind_to)
        elif overwrite:
            for name in self.OUTPUTS:
                path = self.path / name
                if path.is_dir():
                    shutil.rmtree(path)
                elif path.exists():
                    path.unlink()
        self.path.mkdir(parents=True, exist_ok=True)
        return dropped

    def write_summary(self, summary: dict[str, Any]) -> None:
        """``summary.json``, atomically."""
        write_text_atomic(self.path / self.SUMMARY, json.dumps(summary, indent=2, sort_keys=True))

    def release(self) -> None:
        self._lock.release()

    def abandon(self) -> None:
        """Give the directory back after a refused start: the lock goes, and a directory this run created
        goes too if nothing was written into it."""
        self.release()
        if self._created and self.path.is_dir() and not any(self.path.iterdir()):
            self.path.rmdir()
