"""Metrics on disk: one JSON line per step in ``metrics.jsonl``, the same scalars in TensorBoard.

A kill can tear the line being written. On ``--resume``, :func:`rewind_metrics` drops a torn last line
(with a warning) and every line after the checkpoint's step, so the resumed run appends to a history that
ends where its checkpoint does.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

from ebpo.trainer.checkpoint import METRICS_FILE, TENSORBOARD_DIR, write_text_atomic

EXCLUDED_FROM_REPRODUCIBILITY = ("timing_s/", "perf/")
"""Metric prefixes that measure wall time and so differ between otherwise identical runs."""


def _parse(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(line, row) for every line of ``path``. A torn last line (a write cut short by a kill) is dropped
    with a warning; a bad line elsewhere raises ValueError naming the file and line."""
    lines = path.read_text(encoding="utf-8").splitlines()
    parsed = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):
                warnings.warn(f"{path}, line {number}: dropped a torn last line ({err})", RuntimeWarning, 3)
                break
            raise ValueError(
                f"{path}, line {number}: not valid JSON ({err}); the file is damaged: repair or delete that line"
            ) from None
        parsed.append((line, row))
    return parsed


def read_metrics(run_dir: str | Path) -> list[dict[str, float]]:
    """The rows of a run's ``metrics.jsonl`` (a torn last line is left out, with a warning)."""
    return [row for _, row in _parse(Path(run_dir) / METRICS_FILE)]


def rewind_metrics(run_dir: Path, step: int) -> None:
    """Keep the rows up to ``step`` (a checkpoint's), dropping later ones and a torn last line."""
    path = run_dir / METRICS_FILE
    if path.exists():
        kept = [line for line, row in _parse(path) if row["step"] <= step]
        write_text_atomic(path, "".join(line + "\n" for line in kept))


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

        self.path = run_dir / METRICS_FILE
        self.writer = SummaryWriter(
            str(run_dir / TENSORBOARD_DIR), purge_step=None if purge_after is None else purge_after + 1
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Append one row. A non-finite value is never stored: it is left out, ``nonfinite/<name>`` = 1 is
        logged in its place, and a warning names the metric and the step."""
        metrics = finite_metrics(step, metrics)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"step": step, **metrics}, sort_keys=True, allow_nan=False) + "\n")
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
