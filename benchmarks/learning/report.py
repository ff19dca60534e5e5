"""The results page of a matrix: markdown tables in the layout of the paper's tables, a per-cell CSV, plots.

Order of the page: what ran and how long it took; the sensitivity check (PASS / FAIL) first, since a
testbed that cannot tell G = 4 from G = 16 cannot tell EBPO from GRPO; then per arm the headline table
(Table 1 layout), the tables across G per budget variant (Table 2 layout) with paired differences against
GRPO, training dynamics, and test Pass@1 per topic and per level. Under every table: the command(s) that
produced its runs (each result records the command that trained it).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.learning.methods import ARM_TITLES, ARMS, BEST, list_methods
from benchmarks.learning.spec import FIXED_PROMPTS, VARIANT_TITLES, VARIANTS, Cell
from benchmarks.learning.stats import (
    MeanCI,
    curve_mean,
    mean_ci,
    median_censored,
    paired_ci,
    steps_to_threshold,
    validation_auc,
)
from benchmarks.learning.testbeds import KIND_ORDER, answer_kinds_of
from benchmarks.pages import portable_command, portable_path
from ebpo.tables import markdown_table  # the one markdown-table writer (re-exported here)

REFERENCE = "grpo"
"""Paired differences are taken against each arm's GRPO."""


@dataclass(frozen=True)
class Row:
    """A cell with its run's result."""

    cell: Cell
    result: dict[str, Any]


@dataclass(frozen=True)
class Metric:
    label: str
    value: Callable[[dict[str, Any]], float | None]
    scale: float = 100.0
    digits: int = 1


def _curve(name: str) -> Callable[[dict[str, Any]], float]:
    return lambda r: curve_mean(r["curves"].get(name, []))


def _maj(r: dict[str, Any]) -> float | None:
    n = r["spec"]["test"]["n"]
    return r["test"].get(f"maj@{n}")


METRICS = {
    "pass1": Metric("test Pass@1", lambda r: r["test"]["pass@1"]),
    "maj": Metric("test maj@n", _maj),
    "auc": Metric("val AUC", lambda r: validation_auc(r["curves"].get("eval/pass@1", []), int(r["steps"]))),
    "grad_norm": Metric("grad norm", _curve("actor/grad_norm"), 1.0, 3),
    "entropy": Metric("entropy", _curve("actor/entropy"), 1.0, 3),
    "step_kl": Metric("step KL ×1e3", _curve("actor/step_kl"), 1e3, 3),
    "all_fail": Metric("all-fail groups %", _curve("groups/all_fail"), 100.0, 1),
    "reward": Metric("train reward %", _curve("reward/mean"), 100.0, 1),
}
"""Per-run values (dynamics: mean over training steps >= 1)."""


def by_seed(rows: Sequence[Row], metric: str, **where: Any) -> dict[int, float]:
    """``{seed: value}`` of ``metric`` over the rows whose cell matches ``where`` (arm, method, ...)."""
    out = {}
    for row in rows:
        if all(getattr(row.cell, k) == v for k, v in where.items()):
            value = METRICS[metric].value(row.result)
            out[row.cell.seed] = float("nan") if value is None else float(value)
    return out


def cell_ci(rows: Sequence[Row], metric: str, **where: Any) -> MeanCI:
    return mean_ci(by_seed(rows, metric, **where).values())


def paired_vs(rows: Sequence[Row], metric: str, method: str, reference: str, **where: Any) -> MeanCI:
    return paired_ci(
        by_seed(rows, metric, method=method, **where), by_seed(rows, metric, method=reference, **where)
    )


def _fmt(ci: MeanCI, metric: str, signed: bool = False) -> str:
    m = METRICS[metric]
    return ci.format_difference(m.scale, m.digits) if signed else ci.format(m.scale, m.digits)


def commands_line(rows: Sequence[Row]) -> str:
    commands = sorted({portable_command(row.result.get("command") or "not recorded") for row in rows})
    return "Runs produced by: " + "; ".join(f"`{c}`" for c in commands)


def _methods(rows: Sequence[Row], arm: str) -> list[str]:
    present = list(dict.fromkeys(row.cell.method for row in rows if row.cell.arm == arm))
    names = list_methods(arm)
    names += [BEST] if BEST not in names else []  # an arm may register ebpo-best itself: list it once
    return [name for name in names if name in present] + [name for name in present if name not in names]


# ---------------------------------------------------------------------------------------------------
# sections


def sensitivity(rows: Sequence[Row], pair: tuple[int, int]) -> tuple[str, str]:
    """The GRPO G = pair[0] vs pair[1] check: its table and verdict (PASS, FAIL or NOT RUN)."""
    low, high = pair
    where = {"arm": "published", "method": REFERENCE, "variant": FIXED_PROMPTS}
    table, verdict = [], "NOT RUN"
    for metric in ("pass1", "auc"):
        a = by_seed(rows, metric, group_size=low, **where)
        b = by_seed(rows, metric, group_size=high, **where)
        if not a or not b:
            return "", verdict
        diff = paired_ci(b, a)
        table.append(
            [
                METRICS[metric].label,
                _fmt(mean_ci(a.values()), metric),
                _fmt(mean_ci(b.values()), metric),
                _fmt(diff, metric, signed=True),
                "yes" if diff.excludes_zero else ("no" if diff.n >= 2 else "one seed: no interval"),
            ]
        )
        if diff.excludes_zero:
            verdict = "PASS"
        elif verdict != "PASS":
            verdict = "FAIL" if diff.n >= 2 else "NO INTERVAL"
    header = [
        "metric",
        f"G={low}",
        f"G={high}",
        f"G={high} − G={low} (paired, 95% CI)",
        "interval excludes 0",
    ]
    return markdown_table(header, table), verdict


def headline_table(rows: Sequence[Row], arm: str, G: int, threshold: float, steps: int) -> str:
    where = {"arm": arm, "variant": FIXED_PROMPTS, "group_size": G}
    methods = _methods([r for r in rows if _match(r, where)], arm)
    out = []
    for m in methods:
        seeds = by_seed(rows, "pass1", method=m, **where)
        reach = [
            steps_to_threshold(r.result["curves"].get("eval/pass@1", []), threshold)
            for r in rows
            if _match(r, {**where, "method": m})
        ]
        out.append(
            [m, str(len(seeds))]
            + [_fmt(cell_ci(rows, metric, method=m, **where), metric) for metric in ("pass1", "maj", "auc")]
            + [median_censored(reach, steps)]
            + [
                "ref"
                if m == REFERENCE
                else _fmt(paired_vs(rows, metric, m, REFERENCE, **where), metric, True)
                for metric in ("pass1", "auc")
            ]
        )
    n = next((r.result["spec"]["test"]["n"] for r in rows if _match(r, where)), "n")
    header = [
        "method",
        "seeds",
        "test Pass@1",
        f"test maj@{n}",
        "val AUC",
        f"steps to +{threshold * 100:g} pts",
    ]
    header += ["Δ Pass@1 vs GRPO", "Δ AUC vs GRPO"]
    return markdown_table(header, out)


def _match(row: Row, where: dict[str, Any]) -> bool:
    return all(getattr(row.cell, k) == v for k, v in where.items())


def group_table(rows: Sequence[Row], arm: str, variant: str, metric: str) -> str:
    """Methods x G (the paper's Table 2): the metric, then the paired difference against GRPO."""
    subset = [r for r in rows if r.cell.arm == arm and r.cell.variant == variant]
    groups = sorted({r.cell.group_size for r in subset})
    methods = [
        m for m in _methods(subset, arm) if len({r.cell.group_size for r in subset if r.cell.method == m}) > 1
    ]
    out = []
    for m in methods:
        where = {"arm": arm, "variant": variant}
        values = [_fmt(cell_ci(rows, metric, method=m, group_size=G, **where), metric) for G in groups]
        diffs = [
            "ref"
            if m == REFERENCE
            else _fmt(paired_vs(rows, metric, m, REFERENCE, group_size=G, **where), metric, True)
            for G in groups
        ]
        out.append([m] + values + diffs)
    header = ["method"] + [f"G={G}" for G in groups] + [f"Δ vs GRPO, G={G}" for G in groups]
    return markdown_table(header, out) if out else ""


def dynamics_table(rows: Sequence[Row], arm: str, G: int) -> str:
    where = {"arm": arm, "variant": FIXED_PROMPTS, "group_size": G}
    metrics = ("grad_norm", "entropy", "step_kl", "all_fail", "reward")
    out = [
        [m] + [_fmt(cell_ci(rows, metric, method=m, **where), metric) for metric in metrics]
        for m in _methods([r for r in rows if _match(r, where)], arm)
    ]
    return markdown_table(["method"] + [METRICS[k].label for k in metrics], out)


def breakdown_table(rows: Sequence[Row], arm: str, G: int, by: str) -> str:
    """Test Pass@1 per topic or per level at the headline cell."""
    where = {"arm": arm, "variant": FIXED_PROMPTS, "group_size": G}
    subset = [r for r in rows if _match(r, where)]
    keys = sorted(
        {k for r in subset for k in r.result["test"].get(f"by_{by}", {})}, key=lambda k: (len(k), k)
    )
    out = []
    for m in _methods(subset, arm):
        cells = []
        for key in keys:
            values = [
                r.result["test"][f"by_{by}"].get(key, {}).get("pass@1") for r in subset if r.cell.method == m
            ]
            cells.append(mean_ci(values).format())
        out.append([m] + cells)
    return markdown_table(["method"] + keys, out) if keys else ""


def _kind_order(shares: dict[str, float]) -> list[str]:
    """The kinds of ``shares`` in ``testbeds.KIND_ORDER`` (``arith.ANSWER_KINDS``, then the gym's; a result read
    back from disk has its keys sorted alphabetically), any unknown kind last."""
    return sorted(shares, key=lambda k: (KIND_ORDER.index(k) if k in KIND_ORDER else len(KIND_ORDER), k))


def tested_on(result: dict[str, Any]) -> str:
    """The test set a result was tested on, as ``ebpo eval`` names it (results from before it was recorded:
    ``arith``)."""
    return str(result["test"].get("benchmark", "arith"))


def kinds_source(rows: Sequence[Row]) -> str:
    """The function that sorted the rows' test answers into kinds (``arith.answer_kind``, ...)."""
    sources = sorted({kinds.source for r in rows if (kinds := answer_kinds_of(tested_on(r.result)))})
    return ", ".join(f"`{source}`" for source in sources) or "no kinds"


SHOWN_SETTING_CHARS = 120
"""An override longer than this is shown by its key alone on the page (a gym task's settings: the run's
``spec.json`` holds them whole)."""


def shown_override(override: str) -> str:
    """``key=value`` as the page shows it: whole, or ``key=<N characters, in spec.json>`` when long."""
    key, _, value = override.partition("=")
    if len(override) <= SHOWN_SETTING_CHARS:
        return override
    return f"{key}=<{len(value)} characters, in each run's spec.json>"


def answer_kinds_table(
    rows: Sequence[Row], groups: Sequence[tuple[str, dict[str, Any]]], first: str = "method"
) -> str:
    """The test samples by kind (``arith.answer_kind``: right, near miss, run-on, other, no number; on a gym task
    ``gym_recipe.answer_kind``: right, run-on, other, no answer), % of all samples, mean ± 95% over seeds, one
    row per ``(label, where)``: which errors training removed."""
    out, kinds = [], None
    for label, where in groups:
        shares = [r.result["test"].get("answer_kinds") for r in rows if _match(r, where)]
        shares = [x for x in shares if x]
        if not shares:
            continue
        kinds = kinds or _kind_order(shares[0])
        out.append([label] + [mean_ci([x.get(k) for x in shares]).format() for k in kinds])
    return markdown_table([first] + list(kinds or []), out) if out else ""


def run_time_lines(rows: Sequence[Row], sessions: Sequence[dict[str, Any]]) -> list[str]:
    """Sum of run times (each run's own clock, train + test) and CPU, beside the matrix wall time."""
    results = {row.result["key"]: row.result for row in rows}
    t = [r.get("timing", {}) for r in results.values()]
    run_wall = sum(x.get("train_s", 0.0) + x.get("test_s", 0.0) for x in t)
    run_cpu = sum(x.get("train_cpu_s", 0.0) + x.get("test_cpu_s", 0.0) for x in t)
    lines = [
        f"- **Sum of run times** (train + test, each run's own wall clock, {len(results)} distinct runs): "
        f"{run_wall / 60:.1f} min; their CPU time {run_cpu / 60:.1f} min. Runs overlap with `--jobs` > 1, "
        "so this is not the time the matrix took."
    ]
    if sessions:
        wall = sum(s.get("wall_s", 0.0) for s in sessions)
        lines.append(
            f"- **Matrix wall time** (sum over the {len(sessions)} invocations of this tag in `sessions.jsonl`, jobs "
            f"{sorted({s.get('jobs') for s in sessions})}): {wall / 60:.1f} min."
        )
    else:
        lines.append("- **Matrix wall time**: not recorded (no `sessions.jsonl` beside the runs).")
    return lines


def describe_model(path: str) -> str:
    """The base model as the results page names it: by :func:`portable_path` (relative to the repository, the
    shipped model of any checkout by its package path, a cached build under ``~/.cache/ebpo``, else
    ``<model-path>``) and with the recipe key of a ``ebpo base-model`` build, so a page reads the same in any
    checkout."""
    p = Path(path)
    shown = portable_path(path, "model-path")
    try:
        key = json.loads((p / "build_info.json").read_text()).get("key")
    except (OSError, ValueError):  # not a base-model build (a model of the user's own): no key to show
        key = None
    return f"`{shown}`" + (f" (base-model recipe key `{key}`)" if key else "")


def report_markdown(
    rows: Sequence[Row],
    *,
    tag: str,
    command: str,
    missing: int,
    headline: int,
    sensitivity_pair: tuple[int, int] | None,
    threshold: float,
    sessions: Sequence[dict[str, Any]] = (),
    best_how: str = "",
) -> str:
    """The generated results page."""
    if not rows:
        return f"# Learning benchmark ({tag})\n\nNo finished runs yet. Run `{portable_command(command)}`.\n"
    first = rows[0].result
    config = first["spec"]["values"]
    seeds = sorted({r.cell.seed for r in rows})
    steps = int(first["steps"])
    lines = [
        f"# Learning benchmark ({tag})",
        "",
        f"Generated by `{portable_command(command)}`: {len(rows)} cells from {len({r.result['key'] for r in rows})} distinct runs "
        f"({missing} planned cells not finished, left out); seeds {seeds}, paired across methods. Values are "
        "percent (dynamics: raw), mean ± 95% t-interval half-width over seeds; **bold** differences have an "
        "interval that excludes 0.",
        "",
        f"- **Model**: {describe_model(first['base_model'])}; training levels {config.get('data', {}).get('levels')}; "
        f"{steps} steps per run.",
        "- **Per run**: overrides "
        f"`{' '.join(shown_override(o) for o in first['spec']['overrides'] if not o.startswith('model.'))}` "
        f"(this run: {first['label']}); test = first {int(first['test']['num_problems'])} `{tested_on(first)}` test "
        f"problems x {first['spec']['test']['n']} samples at T = {first['spec']['test']['temperature']}, final "
        "checkpoint.",
    ]
    lines += run_time_lines(rows, sessions)
    codes = sorted({r.result.get("code_fingerprint", "?") for r in rows})
    if len(codes) > 1:
        lines.append(f"- **Warning: runs ran different library code** (fingerprints {', '.join(codes)}).")
    if best_how:  # the ebpo-best row's selection, or why there is none; on the selection's page, its verdict
        lines.append(f"- {best_how}.")
    lines += [
        "",
        "Definitions: *val AUC* = trapezoid area under validation pass@1 over the evaluated steps (0 to the "
        "last) / number of steps (the mean validation pass@1 over training); *steps to +X pts* = median over "
        "seeds of the first validation step at or above the run's own step-0 value + X points (censored runs "
        "count as never; (reached/seeds)); *Δ vs GRPO* = paired by seed against the same arm's GRPO at the same "
        "G and budget; dynamics = mean over training steps.",
        "",
    ]
    if sensitivity_pair is not None:
        table, verdict = sensitivity(rows, sensitivity_pair)
        low, high = sensitivity_pair
        lines += [
            f"## Sensitivity check: GRPO at G = {low} vs G = {high} — **{verdict}**",
            "",
            "Same prompts per step, same steps, paired by seed. PASS when the 95% interval of the difference "
            "excludes 0 on test Pass@1 or on validation AUC: a testbed that cannot tell G = 4 from G = 16 cannot "
            "tell EBPO from GRPO.",
            "",
        ]
        if table:
            sensitivity_rows = [r for r in rows if r.cell.arm == "published" and r.cell.method == REFERENCE]
            lines += [table, "", commands_line(sensitivity_rows), ""]
            kinds = answer_kinds_table(
                rows,
                [
                    (
                        f"GRPO G={g}",
                        {"arm": "published", "method": REFERENCE, "variant": FIXED_PROMPTS, "group_size": g},
                    )
                    for g in sensitivity_pair
                ],
                first="runs",
            )
            if kinds:
                lines += [
                    f"Test samples by kind of answer (% of all samples; {kinds_source(sensitivity_rows)}):",
                    "",
                    kinds,
                    "",
                ]
    for arm in ARMS:
        arm_rows = [r for r in rows if r.cell.arm == arm]
        if not arm_rows:
            continue
        lines += [f"## {ARM_TITLES[arm]}", ""]
        if any(r.cell.variant == FIXED_PROMPTS and r.cell.group_size == headline for r in arm_rows):
            lines += [
                f"### Headline: G = {headline}, fixed prompts per step (layout of the paper's Table 1)",
                "",
                headline_table(rows, arm, headline, threshold, steps),
                "",
                commands_line([r for r in arm_rows if r.cell.group_size == headline]),
                "",
            ]
        for variant in VARIANTS:
            for metric in ("pass1", "auc"):
                table = group_table(rows, arm, variant, metric)
                if table:
                    lines += [
                        f"### {METRICS[metric].label} across G, {variant} (layout of the paper's Table 2)",
                        "",
                        f"{VARIANT_TITLES[variant]}.",
                        "",
                        table,
                        "",
                        commands_line([r for r in arm_rows if r.cell.variant == variant]),
                        "",
                    ]
        if any(r.cell.group_size == headline and r.cell.variant == FIXED_PROMPTS for r in arm_rows):
            for title, table in (
                (
                    f"Training dynamics, G = {headline}, fixed prompts (paper Figures 3-4)",
                    dynamics_table(rows, arm, headline),
                ),
                (f"Test Pass@1 per topic, G = {headline}", breakdown_table(rows, arm, headline, "topic")),
                (
                    f"Test Pass@1 per level, G = {headline} (paper Figure 5)",
                    breakdown_table(rows, arm, headline, "level"),
                ),
                (
                    f"Test samples by kind of answer, G = {headline} (% of all samples; {kinds_source(arm_rows)})",
                    answer_kinds_table(
                        rows,
                        [
                            (m, {"arm": arm, "method": m, "variant": FIXED_PROMPTS, "group_size": headline})
                            for m in _methods(
                                [
                                    r
                                    for r in arm_rows
                                    if r.cell.group_size == headline and r.cell.variant == FIXED_PROMPTS
                                ],
                                arm,
                            )
                        ],
                    ),
                ),
            ):
                if table:
                    lines += [f"### {title}", "", table, ""]
    if any(r.result.get("test_best") for r in rows):
        lines += ["## The paper's checkpoint rule (best validation maj@k; EBPO-diff the last)", ""]
        out = []
        for arm in ARMS:
            where = {"arm": arm, "variant": FIXED_PROMPTS, "group_size": headline}
            for m in _methods([r for r in rows if _match(r, where)], arm):
                values = [
                    (r.result.get("test_best") or {}).get("pass@1")
                    for r in rows
                    if _match(r, {**where, "method": m})
                ]
                out.append([arm, m, mean_ci(values).format()])
        lines += [markdown_table(["arm", "method", f"test Pass@1, G={headline}"], out), ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# CSV and plots


def write_csv(rows: Sequence[Row], path: Path, threshold: float) -> None:
    """One row per cell: identity, key, command, every metric, test per topic and level, timings."""
    table = []
    for row in sorted(rows, key=lambda r: r.cell):
        r = row.result
        line: dict[str, Any] = {
            **row.cell.__dict__,
            "key": r["key"],
            "command": portable_command(r.get("command", "")),
        }
        for name, metric in METRICS.items():
            value = metric.value(r)
            line[name] = "" if value is None or (isinstance(value, float) and math.isnan(value)) else value
        line["steps_to_threshold"] = steps_to_threshold(r["curves"].get("eval/pass@1", []), threshold)
        line["threshold_points"] = threshold * 100
        for by in ("topic", "level"):
            for key, values in r["test"].get(f"by_{by}", {}).items():
                line[f"test_{by}_{key}_pass1"] = values.get("pass@1")
        kinds = r["test"].get("answer_kinds", {})
        for kind in _kind_order(kinds):
            line[f"test_answers_{kind.replace(' ', '_').replace('-', '_')}"] = kinds[kind]
        line.update({f"timing_{k}": v for k, v in r.get("timing", {}).items()})
        table.append(line)
    columns: list[str] = []
    for line in table:
        columns += [c for c in line if c not in columns]
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(table)


def _band(
    rows: Sequence[Row], metric: str, where: dict[str, Any]
) -> tuple[list[float], list[float], list[float]]:
    """Steps, mean and 95% half-width over seeds of a curve (steps every seed has)."""
    curves = [
        dict((float(s), v) for s, v in r.result["curves"].get(metric, [])) for r in rows if _match(r, where)
    ]
    curves = [c for c in curves if c]
    if not curves:
        return [], [], []
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    cis = [mean_ci(c[s] for c in curves) for s in steps]
    return steps, [c.mean for c in cis], [0.0 if math.isnan(c.half_width) else c.half_width for c in cis]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(rows: Sequence[Row], series: dict[str, dict[str, Any]], path: Path, title: str) -> Path:
    """Validation pass@1, train reward, entropy, gradient norm, step KL and all-fail groups per step: one
    line per series (``label -> cell filter``), mean over seeds with a 95% band."""
    plt = _pyplot()
    panels = [
        ("eval/pass@1", "validation pass@1"),
        ("reward/mean", "train reward"),
        ("actor/entropy", "entropy"),
        ("actor/grad_norm", "gradient norm"),
        ("actor/step_kl", "KL(pi_t || pi_t+1)"),
        ("groups/all_fail", "all-fail groups"),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, (metric, name) in zip(axes.flat, panels):
        for label, where in series.items():
            steps, mean, half = _band(rows, metric, where)
            if metric != "eval/pass@1":
                keep = [i for i, s in enumerate(steps) if s >= 1]
                steps, mean, half = [steps[i] for i in keep], [mean[i] for i in keep], [half[i] for i in keep]
            if not steps:
                continue
            line = ax.plot(steps, mean, label=label, linewidth=1.2)[0]
            ax.fill_between(
                steps, [m - h for m, h in zip(mean, half)], [m + h for m, h in zip(mean, half)],
                color=line.get_color(), alpha=0.15, linewidth=0,
            )  # fmt: skip
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title + " (mean over seeds, 95% band)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_vs_group(rows: Sequence[Row], arm: str, path: Path) -> Path | None:
    """Test Pass@1 against G per method, one panel per budget variant, 95% error bars."""
    plt = _pyplot()
    subset = [r for r in rows if r.cell.arm == arm]
    variants = [v for v in VARIANTS if len({r.cell.group_size for r in subset if r.cell.variant == v}) > 1]
    if not variants:
        return None
    fig, axes = plt.subplots(1, len(variants), figsize=(6 * len(variants), 4.2), squeeze=False)
    for ax, variant in zip(axes.flat, variants):
        for m in _methods(subset, arm):
            groups = sorted(
                {r.cell.group_size for r in subset if r.cell.method == m and r.cell.variant == variant}
            )
            if len(groups) < 2:
                continue
            cis = [cell_ci(rows, "pass1", arm=arm, method=m, variant=variant, group_size=G) for G in groups]
            ax.errorbar(
                groups, [100 * c.mean for c in cis],
                yerr=[0 if math.isnan(c.half_width) else 100 * c.half_width for c in cis],
                marker="o", capsize=3, label=m,
            )  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlabel("group size G")
        ax.set_ylabel("test Pass@1 (%)")
        ax.set_title(f"{arm}: {variant}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(
    rows: Sequence[Row],
    results_dir: Path,
    tag: str,
    *,
    command: str,
    missing: int,
    headline: int,
    sensitivity_pair: tuple[int, int] | None,
    threshold: float,
    sessions: Sequence[dict[str, Any]] = (),
    best_how: str = "",
) -> list[Path]:
    """``learning_<tag>.md``, ``learning_<tag>_cells.csv`` and the PNGs; returns the paths written."""
    results_dir = Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    page = results_dir / f"learning_{tag}.md"
    page.write_text(
        report_markdown(
            rows,
            tag=tag,
            command=command,
            missing=missing,
            headline=headline,
            sensitivity_pair=sensitivity_pair,
            threshold=threshold,
            sessions=sessions,
            best_how=best_how,
        )
    )
    written = [page]
    if not rows:
        return written
    written.append(results_dir / f"learning_{tag}_cells.csv")
    write_csv(rows, written[-1], threshold)
    if sensitivity_pair is not None:
        where = {"arm": "published", "method": REFERENCE, "variant": FIXED_PROMPTS}
        series = {f"GRPO G={G}": {**where, "group_size": G} for G in sensitivity_pair}
        if all(any(_match(r, w) for r in rows) for w in series.values()):
            path = results_dir / f"learning_{tag}_sensitivity.png"
            written.append(plot_curves(rows, series, path, "sensitivity check: GRPO"))
    for arm in ARMS:
        where = {"arm": arm, "variant": FIXED_PROMPTS, "group_size": headline}
        methods = _methods([r for r in rows if _match(r, where)], arm)
        if methods:
            path = results_dir / f"learning_{tag}_{arm}_curves.png"
            series = {m: {**where, "method": m} for m in methods}
            written.append(plot_curves(rows, series, path, f"{ARM_TITLES[arm]}, G = {headline}"))
        vs_g = plot_vs_group(rows, arm, results_dir / f"learning_{tag}_{arm}_vs_G.png")
        if vs_g is not None:
            written.append(vs_g)
    return written
