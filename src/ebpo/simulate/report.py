"""What ``ebpo simulate`` prints and writes, for both studies: markdown tables (:func:`ebpo.tables.markdown_table`),
CSV files and the estimators' study's figure."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ebpo.persist import write_bytes_atomic, write_text_atomic
from ebpo.simulate.staleness import GROUP_MEAN, STALENESS_OPTIONS
from ebpo.simulate.study import SimulateResult
from ebpo.tables import markdown_table

__all__ = ["format_staleness", "format_tables", "write_csv", "write_plot", "write_staleness_csv"]


def _fmt(value: float, se: float | None = None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    text = f"{value:.4f}"
    if se is not None and not math.isnan(se):
        text += f" ± {se:.4f}"
    return text


def _write_csv(path: Path, fieldnames: Sequence[str], rows: Iterable[dict[str, Any]]) -> None:
    """One CSV file, written atomically: the header, then one line per row (keys missing from a row left empty)."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=fieldnames)
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(path, text.getvalue())


# --- the estimators' study ------------------------------------------------------------------------------


def format_tables(result: SimulateResult) -> str:
    """Markdown tables: Theorem 2, then one estimator table per scenario."""
    t2 = result.theorem2
    lines = [
        "## Theorem 2 (Gaussian model)",
        "",
        markdown_table(
            ["baseline", "measured MSE", "closed form"],
            [
                ["GRPO group mean", f"{t2['mse_grpo']:.6f}", f"sigma2/G = {t2['closed_form_grpo']:.6f}"],
                [
                    "EBPO, pooled sigma2 + latent tau2",
                    f"{t2['mse_ebpo_textbook']:.6f}",
                    f"(1-S) sigma2/G = {t2['closed_form_ebpo']:.6f} (S = {t2['shrinkage_true']:.4f})",
                ],
                [
                    "EBPO, paper defaults (total sigma2, raw tau2)",
                    f"{t2['mse_ebpo_paper']:.6f}",
                    f"(1-w)^2 sigma2/G + w^2 tau2 = {t2['closed_form_ebpo_paper']:.6f} "
                    f"(w = {t2['paper_weight_w']:.4f})",
                ],
            ],
        ),
        "",
        f"EBPO (textbook prior) vs closed form: relative error {t2['rel_err_ebpo_textbook']:+.4f} "
        f"(Monte Carlo standard error about {t2['mc_rel_se']:.4f}, {int(t2['groups'])} groups).",
        "",
    ]
    scenarios = list(dict.fromkeys(row["scenario"] for row in result.rows))
    header = [
        "estimator",
        "baseline MSE",
        "prior MSE",
        "mean S",
        "zero-adv frac",
        "all-fail mean abs A",
        "all-fail mean abs raw a",
    ]
    for scenario in scenarios:
        rows = [row for row in result.rows if row["scenario"] == scenario]
        first = rows[0]
        table = [
            [
                row["estimator"],
                _fmt(row["baseline_mse"], row["baseline_mse_se"]),
                _fmt(row["prior_mse"], row["prior_mse_se"]),
                _fmt(row["shrinkage"]),
                _fmt(row["zero_adv_frac"]),
                _fmt(row["all_fail_abs_adv"]),
                _fmt(row["all_fail_abs_raw_adv"]),
            ]
            for row in rows
        ]
        lines += [
            f"## Stream {scenario}",
            "",
            f"all-fail groups: {first['all_fail_group_frac']:.3f}; proposition's ideal prior MSE: "
            f"shuffle (oracle global mean) {first['oracle_global_prior_mse']:.4f}, "
            f"coherent (oracle topic mean) {first['oracle_topic_prior_mse']:.4f}",
            "",
            markdown_table(header, table),
            "",
        ]
    lines.append(f"({result.seconds:.1f} s)")
    return "\n".join(lines)


def write_csv(result: SimulateResult, path: Path) -> None:
    """One row per (scenario, estimator) (``study=stream``) plus one ``study=theorem2`` row per figure."""
    theorem2_rows = (
        {"study": "theorem2", "quantity": quantity, "value": value}
        for quantity, value in result.theorem2.items()
    )
    _write_csv(path, [*result.rows[0], "quantity", "value"], [*result.rows, *theorem2_rows])


def write_plot(result: SimulateResult, path: Path) -> None:
    """Three panels: baseline MSE per estimator and scenario; EBPO prior MSE per variant against the
    proposition's ideal values; per-step prior MSE on the topic-coherent stationary stream."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(row["scenario"] for row in result.rows))
    estimators = list(dict.fromkeys(row["estimator"] for row in result.rows))
    ebpo_variants = [label for label in estimators if label.startswith("ebpo")]
    value = {(row["scenario"], row["estimator"]): row for row in result.rows}
    fig, axes = plt.subplots(1, 3, figsize=(19, 5.5))
    width = 0.8 / len(estimators)
    x = np.arange(len(scenarios))
    for i, label in enumerate(estimators):
        axes[0].bar(x + i * width, [value[(s, label)]["baseline_mse"] for s in scenarios], width, label=label)
    axes[0].set_xticks(x + 0.4 - width / 2, scenarios, fontsize=8)
    axes[0].set_ylabel("baseline MSE vs latent rate")
    axes[0].set_title("Baseline MSE (lower is better)")
    axes[0].legend(fontsize=7)

    width = 0.8 / (len(ebpo_variants) + 2)
    for i, label in enumerate(ebpo_variants):
        axes[1].bar(x + i * width, [value[(s, label)]["prior_mse"] for s in scenarios], width, label=label)
    for j, (key, name) in enumerate(
        [
            ("oracle_global_prior_mse", "ideal shuffle (global mean)"),
            ("oracle_topic_prior_mse", "ideal coherent"),
        ]
    ):
        offset = (len(ebpo_variants) + j) * width
        axes[1].bar(
            x + offset, [value[(s, estimators[0])][key] for s in scenarios], width, label=name, hatch="//"
        )
    axes[1].set_xticks(x + 0.4 - width / 2, scenarios, fontsize=8)
    axes[1].set_ylabel("prior MSE vs latent rate")
    axes[1].set_title("EBPO prior MSE (the clustering proposition)")
    axes[1].legend(fontsize=7)

    scenario = "topic/stationary"
    for label in ebpo_variants:
        curve = result.prior_curves.get((scenario, label))
        if curve:
            axes[2].plot(np.arange(len(curve)), curve, label=label, linewidth=1)
    axes[2].axhline(value[(scenario, estimators[0])]["oracle_topic_prior_mse"], color="k", ls="--", lw=1)
    axes[2].set_xlabel("step after warm-up")
    axes[2].set_ylabel("prior MSE")
    axes[2].set_title(f"Prior MSE per step, {scenario} (dashed: ideal coherent)")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, dpi=110, format="png")
    write_bytes_atomic(path, image.getvalue())
    plt.close(fig)


# --- the staleness study --------------------------------------------------------------------------------


def format_staleness(rows: list[dict[str, Any]]) -> str:
    """Markdown: per drift and memory, baseline RMSE vs the current rate and the prior's bias, by L_max."""
    lags = sorted({row["max_lag"] for row in rows})
    header = ["option", *(f"L_max = {lag}" for lag in lags)]
    labels = [label for label, _ in STALENESS_OPTIONS] + [GROUP_MEAN]
    lines = []
    for drift in dict.fromkeys(row["drift"] for row in rows):
        for memory in dict.fromkeys(row["prior_memory"] for row in rows if row["prior_memory"] != "-"):
            table = []
            for label in labels:
                cells = []
                for lag in lags:
                    match = [
                        row
                        for row in rows
                        if row["drift"] == drift
                        and row["max_lag"] == lag
                        and row["option"] == label
                        and row["prior_memory"] in (memory, "-")
                    ]
                    if not match:
                        continue
                    row = match[0]
                    bias = (
                        "" if label == GROUP_MEAN else f"; {row['bias_now']:+.4f} ({row['bias_sample']:+.4f})"
                    )
                    cells.append(f"{row['rmse_now']:.4f} ({row['rmse_sample']:.4f}){bias}")
                if cells:
                    table.append([label, *cells])
            lines += [
                f"## drift {drift:g} logits over the run, prior_memory={memory}",
                "",
                "cells: baseline RMSE vs current rate (vs sampling rate); prior bias vs current (vs sampling)",
                "",
                markdown_table(header, table),
                "",
            ]
    return "\n".join(lines)


def write_staleness_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """One line per row of :func:`ebpo.simulate.staleness.run_staleness`, its keys the header."""
    _write_csv(path, list(rows[0]), rows)
