"""What ``ebpo diagnose`` prints and writes: the summary rows with their intervals, the markdown table, the CSV
files and the figure."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ebpo.diagnostics import measures
from ebpo.diagnostics.study import DiagnoseResult
from ebpo.persist import write_bytes_atomic, write_text_atomic
from ebpo.tables import markdown_table

MEAN_METRICS = ("baseline_error", "centred_baseline_error", "cosine", "grad_norm")
"""Per-batch means, with t-intervals and paired t-intervals of the differences."""
RATIO_METRICS = ("rel_sq_error", "variance_ratio")
"""Statistics of all batches together, with delete-one jackknife intervals (paired for the differences)."""
SAME = 1e-9
"""Per-batch differences below this in magnitude are float rounding (two estimators giving one direction) and
count as 0."""
COUNT_METRICS = ("zero_responses", "zero_groups", "constant_groups")
"""Per-batch fractions, reported as means."""


@dataclass
class Summary:
    """``rows``: one dict per (estimator, G), keys ``<metric>``, ``<metric>_low``, ``<metric>_high`` and, for
    the compared metrics, ``<metric>_diff`` (+ ``_low``, ``_high``): this estimator minus ``compare_to`` on the
    same batches. ``pool``: per G, the pool's figures and Theorem 2's two baselines (:func:`pool_rows`)."""

    rows: list[dict[str, Any]]
    pool: list[dict[str, Any]]
    reference: dict[str, float]


def _per_batch(result: DiagnoseResult) -> dict[tuple[str, int], dict[str, np.ndarray]]:
    """Every per-batch series of every (estimator, G), and the inner products of its gradients."""
    ref_RK = result.reference_RK
    ref2_R = (ref_RK * ref_RK).sum(dim=1).numpy()
    series = {}
    for key, record in result.arms.items():
        products = measures.GradientProducts.of(record.gradients_RK, ref_RK)
        series[key] = {
            "baseline_error": np.asarray(record.baseline_error),
            "centred_baseline_error": np.asarray(record.centred_baseline_error),
            "cosine": measures.cosines(products.dot_R, products.norm2_R, ref2_R),
            "grad_norm": np.sqrt(products.norm2_R),
            "zero_responses": np.asarray(record.zero_responses),
            "zero_groups": np.asarray(record.zero_groups),
            "constant_groups": np.asarray(record.constant_groups),
            "dot": products.dot_R,
            "norm2": products.norm2_R,
            "gram": products.gram_RR,
        }
    return series


def summarize(result: DiagnoseResult) -> Summary:
    """The table's rows: per (estimator, G) every metric with its 95% interval, and its paired difference
    against ``config.compare_to`` (docs/diagnose.md defines each)."""
    cfg = result.config
    series = _per_batch(result)
    ref2_R = (result.reference_RK * result.reference_RK).sum(dim=1).numpy()
    noise_R = result.reference_noise_R.numpy()
    batches = len(noise_R)

    def ratio(key: tuple[str, int], metric: str) -> Callable[[np.ndarray], float]:
        s = series[key]
        if metric == "rel_sq_error":
            return lambda idx: measures.relative_squared_error(
                s["dot"][idx], s["norm2"][idx], ref2_R[idx], noise_R[idx]
            )
        return lambda idx: measures.variance_ratio(s["gram"][np.ix_(idx, idx)])

    rows = []
    for G in sorted(set(cfg.group_sizes)):
        base = (cfg.compare_to, G)
        for spec in result.specs:
            key = (spec.label, G)
            row: dict[str, Any] = {
                "estimator": spec.label,
                "loss": result.losses[spec.label],
                "G": G,
                "batches": batches,
            }
            for metric in MEAN_METRICS:
                _put(row, metric, measures.mean_interval(series[key][metric]))
                diff_R = series[key][metric] - series[base][metric]
                _put(
                    row,
                    f"{metric}_diff",
                    measures.mean_interval(np.where(np.abs(diff_R) < SAME, 0.0, diff_R)),
                )
            for metric in RATIO_METRICS:
                own, other = ratio(key, metric), ratio(base, metric)
                _put(row, metric, measures.jackknife_interval(own, batches))
                _put(
                    row,
                    f"{metric}_diff",
                    measures.jackknife_interval(_difference(own, other), batches),
                )
            for metric in COUNT_METRICS:
                row[metric] = float(series[key][metric].mean())
            rows.append(row)
    reference = {
        "signal_fraction": float((ref2_R.sum() - noise_R.sum()) / ref2_R.sum())
        if ref2_R.sum() > 0
        else float("nan"),
        "reference_samples": cfg.reference_samples,
    }
    return Summary(rows, pool_rows(result), reference)


def _difference(
    own: Callable[[np.ndarray], float], other: Callable[[np.ndarray], float]
) -> Callable[[np.ndarray], float]:
    """The statistic ``own - other`` on the same batches, float rounding (below :data:`SAME`) as 0."""

    def statistic(idx: np.ndarray) -> float:
        value = own(idx) - other(idx)
        return 0.0 if abs(value) < SAME else value

    return statistic


def _put(row: dict[str, Any], name: str, interval: measures.Interval) -> None:
    row[name], row[f"{name}_low"], row[f"{name}_high"] = interval.value, interval.low, interval.high


def pool_rows(result: DiagnoseResult) -> list[dict[str, Any]]:
    """Per G: the pool's mean success rate, within-prompt variance sigma2 and between-prompt variance tau2
    (means over the batches of :class:`~ebpo.diagnostics.measures.PoolStats`), the Bayes-optimal shrinkage
    S* and the two baseline errors of Theorem 2 at that G: the group mean's sigma2/G and the optimally
    shrunk baseline's (1 - S*) sigma2/G."""
    mean = float(np.mean([p.mean for p in result.pool]))
    sigma2 = float(np.mean([p.sigma2 for p in result.pool]))
    tau2 = float(np.mean([p.tau2 for p in result.pool]))
    out = []
    for G in sorted(set(result.config.group_sizes)):
        shrinkage, group_mean_mse, shrunk_mse = measures.optimal_shrinkage(sigma2, tau2, G)
        out.append(
            {
                "G": G,
                "success_rate": mean,
                "sigma2": sigma2,
                "tau2": tau2,
                "optimal_shrinkage": shrinkage,
                "group_mean_mse": group_mean_mse,
                "optimal_mse": shrunk_mse,
            }
        )
    return out


# --------------------------------------------------------------------------------------------------
# text


def _num(value: float, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"


def _with_interval(row: dict[str, Any], name: str, *, signed: bool = False, digits: int = 3) -> str:
    value, low, high = row[name], row[f"{name}_low"], row[f"{name}_high"]
    if isinstance(value, float) and math.isnan(value):
        return "-"
    sign = "+" if signed and value > 0 else ""
    text = f"{sign}{_num(value, digits)}"
    if not (math.isnan(low) or math.isnan(high)):
        text += f" [{_num(low, 2)}, {_num(high, 2)}]"
        if signed and (low > 0 or high < 0):
            text = f"**{text}**"
    return text


def format_table(result: DiagnoseResult, summary: Summary) -> str:
    """The markdown report: the settings line, the pool's figures per G, then one table row per (estimator,
    G) with 95% intervals in brackets (differences against ``compare_to`` in bold where the interval excludes 0)."""
    cfg = result.config
    base = cfg.compare_to
    pool_desc = cfg.records or f"{cfg.task} {cfg.split}" + (
        f", topics {','.join(cfg.topics)}" if cfg.topics else ""
    ) + (f", levels {','.join(map(str, cfg.levels))}" if cfg.levels else "")
    projection = (
        f"CountSketch to K = {cfg.projection_dim}" if cfg.projection_dim else "none (whole gradients)"
    )
    lines = [
        f"# ebpo diagnose: {cfg.model}",
        "",
        f"Pool: {pool_desc} ({cfg.pool_size if cfg.records is None else 'file'}); M = {cfg.prompts} prompts per batch, "
        f"R = {len(result.reference_noise_R)} batches, W = {result.warmup_batches} warm-up batches, "
        f"G_ref = {cfg.reference_samples}, T = {cfg.temperature}, top-p {cfg.top_p}, "
        f"max {cfg.max_new_tokens} tokens, seed {cfg.seed}; projection: {projection} of "
        f"{result.num_parameters:,} parameters; {result.seconds:.0f} s.",
        f"Reference gradient: signal fraction |∇J|² / E|ref|² = {_num(summary.reference['signal_fraction'], 3)} "
        "(the cosines of every estimator are shrunk alike by about its square root).",
        "",
        markdown_table(
            [
                "G",
                "success rate",
                "sigma2 (within)",
                "tau2 (between)",
                "S*",
                "group-mean MSE sigma2/G",
                "optimal (1-S*) sigma2/G",
            ],
            [
                [
                    str(p["G"]),
                    _num(p["success_rate"], 3),
                    _num(p["sigma2"]),
                    _num(p["tau2"]),
                    _num(p["optimal_shrinkage"], 3),
                    _num(p["group_mean_mse"]),
                    _num(p["optimal_mse"]),
                ]
                for p in summary.pool
            ],
        ),
        "",
        f"Differences (Δ) are against {base} on the same batches; 95% intervals in brackets (t over batches for "
        "baseline errors, cosine and norm; delete-one jackknife for rel. sq. error and variance ratio).",
        "",
    ]
    header = [
        "estimator",
        "loss",
        "G",
        "baseline MSE",
        f"Δ vs {base}",
        "centred baseline MSE",
        "cosine",
        f"Δ vs {base}",
        "rel. sq. error",
        f"Δ vs {base}",
        "variance ratio",
        "norm",
        "zero A: responses / groups",
        "constant groups",
    ]
    rows = []
    for row in summary.rows:
        compared = row["estimator"] != base
        rows.append(
            [
                row["estimator"],
                row["loss"],
                str(row["G"]),
                _with_interval(row, "baseline_error"),
                _with_interval(row, "baseline_error_diff", signed=True) if compared else "",
                _with_interval(row, "centred_baseline_error"),
                _with_interval(row, "cosine"),
                _with_interval(row, "cosine_diff", signed=True) if compared else "",
                _with_interval(row, "rel_sq_error"),
                _with_interval(row, "rel_sq_error_diff", signed=True) if compared else "",
                _with_interval(row, "variance_ratio"),
                _num(row["grad_norm"], 3),
                f"{row['zero_responses']:.2f} / {row['zero_groups']:.2f}",
                f"{row['constant_groups']:.2f}",
            ]
        )
    lines.append(markdown_table(header, rows))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# files


def write_csv(summary: Summary, path: Path) -> None:
    """One row per (estimator, G) with every metric, its interval and its difference's."""
    _write_rows(summary.rows, path)


def write_batches_csv(result: DiagnoseResult, path: Path) -> None:
    """One row per (estimator, G, batch): the per-batch values the intervals come from (for re-analysis)."""
    series = _per_batch(result)
    rows = []
    for (label, G), values in series.items():
        for batch in range(len(values["cosine"])):
            rows.append(
                {"estimator": label, "G": G, "batch": batch}
                | {name: float(values[name][batch]) for name in (*MEAN_METRICS, *COUNT_METRICS)}
                | {"reference_noise": float(result.reference_noise_R[batch])}
            )
    _write_rows(rows, path)


def _write_rows(rows: list[dict[str, Any]], path: Path) -> None:
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(path, text.getvalue())


PLOTTED = ("baseline_error", "cosine")
"""The figure's two panels: each estimator's difference against ``compare_to`` in these metrics."""


@dataclass(frozen=True)
class DifferenceSeries:
    """One line of the figure: ``estimator`` minus ``compare_to`` in ``metric`` at each G, paired by batch, with
    its paired 95% t-interval (the table's Δ column: ``<metric>_diff`` and its ``_low`` / ``_high``)."""

    estimator: str
    metric: str
    G: list[int]
    value: list[float]
    low: list[float]
    high: list[float]


def difference_series(summary: Summary, compare_to: str) -> list[DifferenceSeries]:
    """The lines the figure draws: for each metric of :data:`PLOTTED` and each estimator but ``compare_to``, in
    the rows' order, its paired difference against ``compare_to`` per G (ascending)."""
    labels = list(dict.fromkeys(row["estimator"] for row in summary.rows))
    out = []
    for metric in PLOTTED:
        for label in labels:
            if label == compare_to:
                continue
            rows = sorted((r for r in summary.rows if r["estimator"] == label), key=lambda r: r["G"])
            name = f"{metric}_diff"
            out.append(
                DifferenceSeries(
                    label,
                    metric,
                    [int(r["G"]) for r in rows],
                    [float(r[name]) for r in rows],
                    [float(r[f"{name}_low"]) for r in rows],
                    [float(r[f"{name}_high"]) for r in rows],
                )
            )
    return out


def write_plot(result: DiagnoseResult, summary: Summary, path: Path) -> None:
    """Two panels against G (log scale), one line per estimator: its paired difference against ``compare_to``
    with the paired 95% interval (:func:`difference_series`, the table's Δ), in the baseline error (with Theorem
    2's best possible difference, (1 - S*) sigma2/G - sigma2/G, dashed) and in the cosine with the reference
    gradient. The lines are set slightly apart along G so that their intervals do not hide one another."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = result.config.compare_to
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    sizes = [p["G"] for p in summary.pool]
    series = difference_series(summary, base)
    count = max(1, len(series) // len(PLOTTED))
    for ax, metric in zip(axes, PLOTTED):
        lines = [line for line in series if line.metric == metric]
        for i, line in enumerate(lines):
            offset = 2 ** (0.04 * (i - (count - 1) / 2))  # apart along the log-2 axis
            value, low, high = (np.array(x, dtype=float) for x in (line.value, line.low, line.high))
            yerr = np.nan_to_num([value - low, high - value], nan=0.0)
            ax.errorbar(
                [G * offset for G in line.G], value, yerr=yerr, marker="o", capsize=3, label=line.estimator
            )
        ax.axhline(0.0, color="k", lw=0.8)
    axes[0].plot(
        sizes,
        [p["optimal_mse"] - p["group_mean_mse"] for p in summary.pool],
        "k--",
        lw=1,
        label="(1-S*) sigma2/G - sigma2/G (Theorem 2's best)",
    )
    axes[0].set_ylabel(f"baseline MSE minus {base}'s")
    axes[1].set_ylabel(f"cosine with the reference gradient minus {base}'s")
    titles = (
        f"Baseline error against {base} (below 0: closer to the success rate)",
        f"Gradient alignment against {base} (above 0: better aligned)",
    )
    for ax, title in zip(axes, titles):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(G) for G in sizes])
        ax.set_xlabel("G (responses per prompt)")
        ax.set_title(title, fontsize=10)
        if ax.get_legend_handles_labels()[0]:  # nothing to label when compare_to is the only estimator
            ax.legend(fontsize=7)
    fig.suptitle(
        f"ebpo diagnose: {result.config.model}; differences paired by batch, 95% intervals", fontsize=10
    )
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, dpi=110, format="png")
    write_bytes_atomic(path, image.getvalue())
    plt.close(fig)


def write_outputs(result: DiagnoseResult, out_dir: Path) -> tuple[str, Summary]:
    """Write diagnose.md, diagnose.csv, batches.csv and diagnose.png to ``out_dir``; return the table."""
    summary = summarize(result)
    table = format_table(result, summary)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out_dir / "diagnose.md", table)
    write_csv(summary, out_dir / "diagnose.csv")
    write_batches_csv(result, out_dir / "batches.csv")
    write_plot(result, summary, out_dir / "diagnose.png")
    return table, summary
