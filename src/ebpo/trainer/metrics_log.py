"""Metrics on disk: one JSON line per step in ``metrics.jsonl`` (an :class:`ebpo.persist.Journal`), the same
scalars in TensorBoard; and the wall-time ones, ``timing_s/...`` (:class:`StepClock`).

A kill can tear the line being written: readers leave it out with a warning, and on ``--resume`` the run
directory rewinds the journal to the checkpoint's step (:meth:`ebpo.persist.RunDirectory.start`), so the
resumed run appends to a history that ends where its checkpoint does. A write the disk refuses (full,
read-only, ...) is one :class:`ebpo.persist.WriteError` naming the file or the TensorBoard folder.
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ebpo.persist import RunDirectory, writing

EXCLUDED_FROM_REPRODUCIBILITY = ("timing_s/", "perf/")
"""Metric prefixes that measure wall time and so differ between otherwise identical runs."""


def read_metrics(run_dir: str | Path) -> list[dict[str, float]]:
    """The rows of a run's ``metrics.jsonl`` (a torn last line is left out, with a warning)."""
    return RunDirectory(run_dir).metrics.read()


def finite_metrics(step: int, metrics: dict[str, float]) -> dict[str, float]:
    """``metrics`` with every NaN or inf value replaced by a ``nonfinite/<name>`` = 1 marker (warned)."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if math.isfinite(value):
            out[name] = value
        else:
            warnings.warn(
                f"step {step}: metric {name!r} is {value}; not stored (logged as nonfinite/{name})",
                RuntimeWarning,
                3,
            )
            out[f"nonfinite/{name}"] = 1.0
    return out


class MetricsLogger:
    """Appends one JSON line per step to ``metrics.jsonl`` and writes the same scalars to TensorBoard.

    ``purge_after``: when resuming from a checkpoint at that step, TensorBoard hides the events written
    after it by the run that was killed.
    """

    def __init__(self, run_dir: Path, purge_after: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only when a run starts

        _quiet_tensorboard_thread()
        run = RunDirectory(run_dir)
        self.journal = run.metrics
        self.tensorboard = run.path / run.TENSORBOARD
        self._failed = False
        with self._writing():
            self.writer = SummaryWriter(
                str(self.tensorboard), purge_step=None if purge_after is None else purge_after + 1
            )

    def _writing(self) -> Any:
        """Turns a refused write of TensorBoard's into one ``WriteError`` naming its folder."""
        return writing(self.tensorboard, kept="the events before are kept")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Append one row. A non-finite value is never stored: it is left out, ``nonfinite/<name>`` = 1 is
        logged in its place, and a warning names the metric and the step."""
        metrics = finite_metrics(step, metrics)
        try:
            self.journal.append([{"step": step, **metrics}])
            with self._writing():
                for name, value in metrics.items():
                    self.writer.add_scalar(name, value, step)
                self.writer.flush()
        except BaseException:
            self._failed = True
            raise

    def close(self) -> None:
        """Close the TensorBoard writer; after a failed :meth:`log` (whose error is on its way) quietly."""
        try:
            with self._writing():
                self.writer.close()
        except Exception:
            if not self._failed:
                raise


class StepClock:
    """Wall seconds of a step and of its phases: the step's ``timing_s/...`` and ``perf/tokens_per_s``."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.seconds[phase] = time.perf_counter() - start

    def metrics(self, tokens: int) -> dict[str, float]:
        """``timing_s/<phase>``, ``timing_s/step`` (so far) and the step's ``tokens`` per second."""
        step = time.perf_counter() - self.start
        timing = {f"timing_s/{phase}": seconds for phase, seconds in self.seconds.items()}
        return {**timing, "timing_s/step": step, "perf/tokens_per_s": tokens / max(step, 1e-9)}


def _quiet_tensorboard_thread() -> None:
    """TensorBoard writes its events from a thread of its own, which prints a traceback when a write fails
    and hands the error on to the next ``add_scalar`` or ``flush`` of the main thread: there it becomes
    one ``WriteError`` (:meth:`MetricsLogger.log`), so the thread's own traceback is left out. Other
    threads' errors are printed as before."""
    if getattr(threading.excepthook, "ebpo_quiet_tensorboard", False):
        return
    previous = threading.excepthook

    def excepthook(args: Any) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and isinstance(args.exc_value, OSError):
            return
        previous(args)

    excepthook.ebpo_quiet_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = excepthook
