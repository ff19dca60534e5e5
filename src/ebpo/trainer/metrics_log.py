"""Metrics on disk: one JSON line per step in ``metrics.jsonl`` (an :class:`ebpo.persist.Journal`), the same
scalars in TensorBoard; and the wall-time ones, ``timing_s/...`` (:class:`StepClock`).

A kill can tear the line being written: readers leave it out with a warning, and on ``--resume`` the run
directory rewinds the journal to the checkpoint's step (:meth:`ebpo.persist.RunDirectory.start`), so the
resumed run appends to a history that ends where its checkpoint does.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ebpo.persist import RunDirectory

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

        run = RunDirectory(run_dir)
        self.journal = run.metrics
        self.writer = SummaryWriter(
            str(run.path / run.TENSORBOARD), purge_step=None if purge_after is None else purge_after + 1
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Append one row. A non-finite value is never stored: it is left out, ``nonfinite/<name>`` = 1 is
        logged in its place, and a warning names the metric and the step."""
        metrics = finite_metrics(step, metrics)
        self.journal.append([{"step": step, **metrics}])
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


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
