"""What ``ebpo eval`` writes: the results page (one markdown table per metric, a row per model, a column per
benchmark and their average) and its CSV and JSON forms."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ebpo.persist import write_text_atomic
from ebpo.tables import Align, markdown_table


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}"


def results_table(
    results: dict[str, dict[str, dict[str, float]]], benchmarks: Sequence[str], metric: str
) -> str:
    """One row per model, one column per benchmark plus Average, in %.

    Average is the unweighted mean over benchmarks (the paper's column); for a standard-error metric
    (``.../se_...``) it is the standard error of that mean, sqrt(sum of se^2) / #benchmarks, treating the
    benchmarks as independent. Blank ("-") when a benchmark is missing.
    """
    is_se = "/se_" in metric
    rows = []
    for model, per_bench in results.items():
        values = [per_bench.get(b, {}).get(metric) for b in benchmarks]
        known = [v for v in values if v is not None]
        average = None
        if values and len(known) == len(values):
            if is_se:
                average = sum(v * v for v in known) ** 0.5 / len(known)
            else:
                average = sum(known) / len(known)
        rows.append([model, *(_percent(v) for v in values), _percent(average)])
    numbers: list[Align] = ["right"] * (len(benchmarks) + 1)  # the model's name, then right-aligned numbers
    return markdown_table(["Model", *benchmarks, "Average"], rows, align=["", *numbers])


def render_markdown(
    results: dict[str, dict[str, dict[str, float]]], benchmarks: Sequence[str], settings: dict
) -> str:
    """The results page: Pass@1 table, its standard errors, then one table per pass@k / maj@k."""
    n = settings["n"]
    parts = [
        f"## Pass@1 (%), averaged over n = {n} samples per problem",
        "",
        results_table(results, benchmarks, "pass@1"),
        "",
        "Standard error of Pass@1 across problems (%):",
        "",
        results_table(results, benchmarks, "pass@1/se_problems"),
        "",
        f"Standard error of Pass@1 across the n = {n} sample seeds (%):",
        "",
        results_table(results, benchmarks, "pass@1/se_seeds"),
    ]
    extra = sorted(
        {m for per in results.values() for s in per.values() for m in s if m.startswith(("pass@", "maj@"))}
        - {"pass@1"},
        key=lambda m: (m.startswith("maj@"), int(m.split("@")[1].split("/")[0]), m),  # pass@k first
    )
    for metric in (m for m in extra if "/" not in m):
        parts += ["", f"{metric} (%):", "", results_table(results, benchmarks, metric)]
    if any("response/clip_ratio" in summary for per in results.values() for summary in per.values()):
        parts += [
            "",
            "Responses cut at max new tokens (response/clip_ratio, %): a cut response usually has no final "
            "answer and counts as wrong, so a large value means Pass@1 measures the token budget.",
            "",
            results_table(results, benchmarks, "response/clip_ratio"),
        ]
    if settings.get("skipped_metrics"):
        parts += ["", f"Not reported (n = {n} is below k): {', '.join(settings['skipped_metrics'])}."]
    parts += [
        "",
        f"Sampling: temperature {settings['temperature']}, top-p {settings['top_p']}, seed {settings['seed']}, "
        f"max new tokens {settings['max_new_tokens'] or 'per benchmark'}"
        + (f", first {settings['limit']} problems per benchmark" if settings.get("limit") else "")
        + ".",
    ]
    return "\n".join(parts) + "\n"


def write_outputs(out_dir: Path, results: dict, benchmarks: Sequence[str], settings: dict[str, Any]) -> str:
    """Write results.md / results.csv / results.json (each atomically); returns the markdown."""
    markdown = render_markdown(results, benchmarks, settings)
    write_text_atomic(out_dir / "results.md", markdown)
    metric_names = sorted({m for per in results.values() for s in per.values() for m in s})
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    writer.writerow(["model", "benchmark", *metric_names])
    for model, per_bench in results.items():
        for bench in benchmarks:
            if bench in per_bench:
                writer.writerow([model, bench, *(per_bench[bench].get(m, "") for m in metric_names)])
    write_text_atomic(out_dir / "results.csv", table.getvalue())
    write_text_atomic(
        out_dir / "results.json",
        json.dumps({"settings": settings, "benchmarks": list(benchmarks), "results": results}, indent=2)
        + "\n",
    )
    return markdown
