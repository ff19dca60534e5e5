"""Tables and figure of docs/results/diagnose/README.md from the six runs' CSVs in this folder.

    .venv/bin/python docs/results/diagnose/analyze.py          # prints the tables, writes diagnose_grid.png
    .venv/bin/python docs/results/diagnose/analyze.py learning CSV [CSV ...]   # PREREGISTRATION.md's predictions

Each run folder (``<model>-<pool>``) holds what ``ebpo diagnose`` wrote: ``diagnose.csv`` (one row per estimator
and G, intervals included) and ``batches.csv`` (one row per estimator, G and batch). Differences between two
estimators that the tool did not print (EBPO against REINFORCE++-baseline, EBPO's twin with S = 0) are paired by
batch from ``batches.csv`` with the tool's own t-interval (``ebpo.diagnostics.measures.mean_interval``).

``learning CSV [CSV ...]`` reads the learning benchmark's per-cell CSVs of the pre-registered learning test (one per
block of seeds; a seed in two files is an error) and prints the sensitivity check (published GRPO, G = 16 - G = 4)
and the three predictions of PREREGISTRATION.md over every seed the files hold, each a paired 95% t-interval over
the seeds with its outcome by the pre-registered rule (above 0: confirmed, below 0: refuted, containing 0: not
shown).
"""

from __future__ import annotations

import csv
import os
import signal
import sys
from pathlib import Path

import numpy as np

from ebpo.diagnostics.measures import mean_interval

HERE = Path(__file__).resolve().parent
MODELS = (("builtin", "base model S1"), ("step50", "GRPO step 50"), ("step150", "GRPO step 150"))
POOLS = (("whole", "whole arith pool"), ("units4", "units, level 4"))
LOSSES = (("", "GRPO's loss"), ("-drgrpo", "Dr. GRPO's loss"))
"""Folder suffix and title of each loss: ``--preset grpo`` (every run) and ``--preset dr_grpo`` (whole pool)."""
SIZES = (2, 4, 8, 16)
TWIN = "reinforce_pp_baseline"
"""EBPO's advantage with S = 0: the group-mean baseline, whitened over the batch (docs/theory.md §1)."""


def read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def per_batch(folder: Path, estimator: str, G: int, metric: str) -> np.ndarray:
    rows = [r for r in read(folder / "batches.csv") if r["estimator"] == estimator and int(r["G"]) == G]
    return np.array([float(r[metric]) for r in sorted(rows, key=lambda r: int(r["batch"]))])


def paired(folder: Path, a: str, b: str, G: int, metric: str) -> str:
    diff = per_batch(folder, a, G, metric) - per_batch(folder, b, G, metric)
    interval = mean_interval(np.where(np.abs(diff) < 1e-9, 0.0, diff))
    text = f"{interval.value:+.4f} [{interval.low:+.4f}, {interval.high:+.4f}]"
    return f"**{text}**" if interval.excludes_zero else text


def summary(folder: Path) -> dict[tuple[str, int], dict[str, str]]:
    return {(r["estimator"], int(r["G"])): r for r in read(folder / "diagnose.csv")}


def pool_rows(folder: Path) -> dict[int, list[str]]:
    """The pool table of the run's diagnose.md, by G: G, success rate, sigma2, tau2, S*, sigma2/G, optimal."""
    rows = {}
    for line in (folder / "diagnose.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 7 and cells[0].isdigit():
            rows[int(cells[0])] = cells
    return rows


def run_table(folder: Path, title: str) -> list[str]:
    s, pool = summary(folder), pool_rows(folder)
    out = [
        f"**{title}** (success rate {pool[2][1]}, sigma2 {pool[2][2]}, tau2 {pool[2][3]}; `{folder.name}/`)",
        "",
        "| G | S* | baseline MSE: GRPO | EBPO | optimal (1-S*) sigma2/G | cosine: GRPO | EBPO - GRPO | "
        "EBPO - REINFORCE++-b. (S = 0) | JSPO - GRPO | rel. sq. error: GRPO | EBPO - GRPO |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for G in SIZES:
        grpo, ebpo = s[("grpo", G)], s[("ebpo", G)]
        out.append(
            f"| {G} | {pool[G][4]} | {float(grpo['baseline_error']):.4f} | {float(ebpo['baseline_error']):.4f} "
            f"({paired(folder, 'ebpo', 'grpo', G, 'baseline_error')}) | {pool[G][6]} | "
            f"{float(grpo['cosine']):.3f} | {paired(folder, 'ebpo', 'grpo', G, 'cosine')} | "
            f"{paired(folder, 'ebpo', TWIN, G, 'cosine')} | {paired(folder, 'jspo', 'grpo', G, 'cosine')} | "
            f"{float(grpo['rel_sq_error']):.3f} | {float(ebpo['rel_sq_error_diff']):+.3f} "
            f"[{float(ebpo['rel_sq_error_diff_low']):+.3f}, {float(ebpo['rel_sq_error_diff_high']):+.3f}] |"
        )
    return [*out, ""]


def tables() -> str:
    out = []
    for suffix, loss_title in LOSSES:
        for model, model_title in MODELS:
            for pool, pool_title in POOLS:
                folder = HERE / f"{model}-{pool}{suffix}"
                if (folder / "diagnose.csv").is_file():
                    out += run_table(folder, f"{model_title}, {pool_title}, {loss_title}")
    return "\n".join(out)


def figure(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 6, figsize=(24, 8), sharex=True)
    for j, ((model, model_title), (pool, pool_title)) in enumerate((m, p) for m in MODELS for p in POOLS):
        folder = HERE / f"{model}-{pool}"
        if not (folder / "diagnose.csv").is_file():
            continue
        s = summary(folder)
        for estimator in ("grpo", "rloo", "jspo", "ebpo", "ebpo:normalize=prior"):
            for i, metric in enumerate(("baseline_error", "cosine")):
                value = np.array([float(s[(estimator, G)][metric]) for G in SIZES])
                low = np.array([float(s[(estimator, G)][f"{metric}_low"]) for G in SIZES])
                high = np.array([float(s[(estimator, G)][f"{metric}_high"]) for G in SIZES])
                axes[i, j].errorbar(
                    SIZES, value, yerr=[value - low, high - value], marker="o", capsize=2, label=estimator
                )
        axes[0, j].set_title(f"{model_title}\n{pool_title}", fontsize=9)
        axes[0, j].set_yscale("log")
        for i in range(2):
            axes[i, j].set_xscale("log", base=2)
            axes[i, j].set_xticks(SIZES, [str(G) for G in SIZES])
    axes[0, 0].set_ylabel("baseline MSE")
    axes[1, 0].set_ylabel("cosine with the reference gradient")
    axes[1, 0].legend(fontsize=7)
    for j in range(6):
        axes[1, j].set_xlabel("G")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def learning(paths: list[str]) -> str:
    sys.path.insert(0, str(HERE.parents[2]))
    from benchmarks.learning.stats import MeanCI, mean_ci, paired_ci

    rows: list[dict[str, str]] = []
    for path in paths:
        block = [r for r in read(Path(path)) if r["variant"] == "fixed-prompts"]
        seen = {r["seed"] for r in rows} & {r["seed"] for r in block}
        if seen:
            raise SystemExit(f"{path}: seeds {', '.join(sorted(seen, key=int))} are in an earlier CSV too")
        rows += block

    def values(arm: str, method: str, G: int, metric: str) -> dict[int, float]:
        return {
            int(r["seed"]): float(r[metric])
            for r in rows
            if (r["arm"], r["method"], r["group_size"]) == (arm, method, str(G)) and r[metric] != ""
        }

    def gain(G: int, metric: str) -> dict[int, float]:  # EBPO - GRPO per seed, arm (a)
        ebpo, grpo = values("estimators", "ebpo", G, metric), values("estimators", "grpo", G, metric)
        return {s: ebpo[s] - grpo[s] for s in sorted(set(ebpo) & set(grpo))}

    def outcome(ci: MeanCI) -> str:
        if not ci.excludes_zero:
            return "not shown"
        return "confirmed" if ci.mean > 0 else "refuted"

    g4, g16 = values("published", "grpo", 4, "auc"), values("published", "grpo", 16, "auc")
    sens = paired_ci(g16, g4)
    seeds = sorted({int(r["seed"]) for r in rows})
    lines = [
        f"seeds: {', '.join(map(str, seeds))} ({len(seeds)})",
        f"sensitivity check, GRPO G16 - G4 validation AUC: {sens.format(100.0, 1, signed=True)} points "
        f"(n = {sens.n}): {'passes' if sens.excludes_zero and sens.mean > 0 else 'does not pass'}",
        "",
        "| prediction | EBPO - GRPO, paired by seed | n | outcome |",
        "|---|---|---|---|",
    ]
    predictions = [
        ("primary: validation AUC at G = 2", mean_ci(gain(2, "auc").values())),
        ("secondary 1: test Pass@1 at G = 2", mean_ci(gain(2, "pass1").values())),
        ("secondary 2: (G = 2) - (G = 4), validation AUC", paired_ci(gain(2, "auc"), gain(4, "auc"))),
        ("(not predicted) validation AUC at G = 4", mean_ci(gain(4, "auc").values())),
        ("(not predicted) test Pass@1 at G = 4", mean_ci(gain(4, "pass1").values())),
    ]
    for name, ci in predictions:
        lines.append(f"| {name} | {ci.format(100.0, 1, signed=True)} points | {ci.n} | {outcome(ci)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head`: end as a shell tool does when its reader exits
    if sys.argv[1:2] == ["learning"] and len(sys.argv) >= 3:
        print(learning(sys.argv[2:]))
        sys.exit(0)
    print(tables())
    figure(HERE / "diagnose_grid.png")
    # on stderr, relative to the working directory: stdout holds only the tables that go into README.md
    print(f"wrote {os.path.relpath(HERE / 'diagnose_grid.png')}", file=sys.stderr)
