"""The training-dynamics figure: reward, entropy, gradient norm, per-step KL and EBPO shrinkage per step.

These are the curves of the paper's Figures 3-5 (gradient norm, KL(pi_t || pi_{t+1}), entropy) plus the
reward and the mean shrinkage S of the EBPO baseline (docs/design.md §5). Matplotlib's Agg backend: no display.
"""

from __future__ import annotations

import io
from pathlib import Path

from ebpo.persist import Journal, write_bytes_atomic

PANELS: list[tuple[str, str]] = [
    ("reward/mean", "reward (train)"),
    ("eval/pass@1", "validation pass@1"),
    ("actor/entropy", "policy entropy"),
    ("actor/grad_norm", "gradient norm"),
    ("actor/step_kl", "KL(pi_t || pi_t+1)"),
    ("ebpo/shrinkage", "EBPO shrinkage S"),
]
"""(metric name as logged, panel title); a panel whose metric never appears is left out."""


def _series(rows: list[dict], name: str) -> tuple[list[int], list[float]]:
    points = [(row["step"], row[name]) for row in rows if name in row]
    return [p[0] for p in points], [p[1] for p in points]


def plot_training(metrics_path: str | Path, out_path: str | Path, *, title: str | None = None) -> Path:
    """Plot the panels of :data:`PANELS` from a ``metrics.jsonl`` into a PNG; returns ``out_path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = Journal(metrics_path).read()
    panels = [(name, label) for name, label in PANELS if any(name in row for row in rows)]
    if not panels:
        raise ValueError(f"{metrics_path}: none of the plotted metrics {[n for n, _ in PANELS]} was logged")
    cols = 3
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.0 * nrows), squeeze=False)
    for ax, (name, label) in zip(axes.flat, panels):
        steps, values = _series(rows, name)
        ax.plot(steps, values, marker="o" if len(steps) < 15 else None, markersize=3, linewidth=1.2)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out_path = Path(out_path)
    image = io.BytesIO()
    fig.savefig(image, dpi=110, format="png")
    write_bytes_atomic(out_path, image.getvalue())
    plt.close(fig)
    return out_path
