"""What a finished run reports: :class:`TrainResult`, ``summary.json`` and its plot (:func:`write_outputs`), and the
before/after validation table ``ebpo train`` prints."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ebpo.run_directory import RunDirectory
from ebpo.trainer.plots import plot_training

if TYPE_CHECKING:  # pragma: no cover
    from ebpo.trackers import MetricsLogger
    from ebpo.trainer.config import TrainConfig


@dataclass
class TrainResult:
    """What a finished run leaves behind."""

    run_dir: Path
    step: int
    eval_before: dict[str, float] = field(default_factory=dict)
    eval_after: dict[str, float] = field(default_factory=dict)
    best_step: int | None = None
    best_score: float | None = None
    history: list[dict[str, float]] = field(default_factory=list)


def summary(result: TrainResult, *, eval_k: int) -> dict[str, Any]:
    """``summary.json``'s content: the final step, the best checkpoint (by maj@k) and the validation metrics
    before training and at the last validation."""
    return {
        "run_dir": str(result.run_dir),
        "step": result.step,
        "best_step": result.best_step,
        f"best_maj@{eval_k}": result.best_score,
        "eval_before": result.eval_before,
        "eval_after": result.eval_after,
    }


def write_outputs(run: RunDirectory, result: TrainResult, cfg: TrainConfig, logger: MetricsLogger) -> None:
    """What a finished run writes: ``summary.json``, the plot ``training.png`` (``run.plot``), and both to the
    experiment trackers."""
    run_summary = summary(result, eval_k=cfg.run.eval_k)
    run.write_summary(run_summary)
    plot = run.path / RunDirectory.PLOT
    if cfg.run.plot:
        plot_training(run.path / RunDirectory.METRICS, plot, title=cfg.method)
    logger.log_summary(run_summary, [plot] if cfg.run.plot else [])


def print_eval_table(before: dict[str, float], after: dict[str, float], file: TextIO | None = None) -> None:
    """The before/after validation pass@1 table, one row per topic, then the overall rows, to ``file`` (default:
    ``sys.stdout`` as it is when called, not as it was when this module was imported)."""
    file = sys.stdout if file is None else file
    topics = sorted(key.split("/", 2)[2] for key in after if key.startswith("eval/pass@1/"))
    rows = [(topic, f"eval/pass@1/{topic}") for topic in topics]
    rows += [("all (pass@1)", "eval/pass@1")]
    rows += [
        (name.split("/", 1)[1], name)
        for name in sorted(after)
        if name.startswith(("eval/maj@", "eval/pass@"))
        and name.count("/") == 1
        and name not in ("eval/pass@1", "eval/pass@1_se")
    ]
    width = max(len(label) for label, _ in rows)
    print(f"{'validation':<{width}}  {'before':>7}  {'after':>7}  {'change':>7}", file=file)
    for label, key in rows:
        b, a = before.get(key, float("nan")), after.get(key, float("nan"))
        print(f"{label:<{width}}  {b:7.3f}  {a:7.3f}  {a - b:+7.3f}", file=file)
    if "eval/pass@1_se" in before and "eval/pass@1_se" in after:
        b, a = before["eval/pass@1"], after["eval/pass@1"]
        se_b, se_a = before["eval/pass@1_se"], after["eval/pass@1_se"]
        print(
            f"validation pass@1: {b:.3f} ± {se_b:.3f} before, {a:.3f} ± {se_a:.3f} after, change "
            f"{a - b:+.3f} ± {math.hypot(se_b, se_a):.3f} (standard errors over problems; the change's "
            "treats the two evaluations as independent, which overstates it)",
            file=file,
        )
