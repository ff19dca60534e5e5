"""Tables of docs/results/gym (S2) from the files in this folder, by the rules of PREREGISTRATION.md.

    .venv/bin/python docs/results/gym/analyze.py diagnose                   # diagnose/'s tables (README.md)
    .venv/bin/python docs/results/gym/analyze.py rates 2.5e-5=CSV 5e-5=CSV 1e-4=CSV [2e-4=CSV ...]
    .venv/bin/python docs/results/gym/analyze.py verdicts CSV [CSV ...]     # the pre-registered comparisons
    .venv/bin/python docs/results/gym/analyze.py replication                # the three blocks of the verdicts

``diagnose`` reads the four runs of ``ebpo diagnose`` in ``diagnose/`` (``<model>-<loss>``: the base model S2 and
the GRPO run's step-50 checkpoint, under GRPO's loss and under EBPO's own) and prints, per G, the paired
differences the pre-registration rests on, each from ``batches.csv`` paired by batch with the tool's own
t-interval (``ebpo.diagnostics.measures.mean_interval``).

``rates`` reads the learning benchmark's per-cell CSVs of the learning-rate check (one per rate) and applies the
shared-rate rule (PREREGISTRATION.md, section 1): each method's rate is the one with the highest mean validation
AUC; the shared candidate r* is the rate with the highest mean over the three methods of their mean AUC; every
method takes r* if, for each, its AUC at r* minus its AUC at its own best rate has a paired 95% t-interval that
contains 0.

``verdicts`` reads the per-cell CSVs of the verdict cells (one or more; a cell found twice must be one run) and
prints each pre-registered comparison over every seed they hold: validation AUC (primary) and test Pass@1
(secondary), paired by seed, 95% t-interval, and its outcome (above 0: confirmed; below 0: refuted; containing 0:
not shown; for the sensitivity check: PASS when either interval excludes 0, the benchmark's rule).

``replication`` puts the verdict cells' blocks side by side: seeds 0-9 and 10-19 (this folder's CSVs) and seeds
61-70, a block run outside the study with the pre-registration's command (EBPO-naive and EBPO-topic left out),
read from ``$EBPO_SHARED/data/replications/`` (``../shared`` beside the clone by default); each comparison per
block, over the first twenty seeds and over all three blocks. Without the third block's file it says so in one
line and prints the first two.
"""

from __future__ import annotations

import csv
import os
import signal
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # the repository: benchmarks.learning

from benchmarks.learning.stats import MeanCI, mean_ci, paired_ci  # noqa: E402

from ebpo.diagnostics.measures import mean_interval  # noqa: E402

SIZES = (2, 4, 8, 16)
MODELS = (("base", "base model S2"), ("step50", "GRPO step 50"))
TWIN = "reinforce_pp_baseline"
"""EBPO's advantage with S = 0: the group-mean baseline, whitened over the batch (docs/theory.md §1)."""
CLUSTER = "ebpo:prior_scope=cluster"
RATE_METHODS = (
    ("published", "grpo", "GRPO"),
    ("estimators", "ebpo", "EBPO (arm a)"),
    ("published", "dapo", "DAPO"),
)


def read(path: Path) -> list[dict[str, str]]:
    with Path(path).open(newline="") as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------------------------------------------
# diagnose


def per_batch(folder: Path, estimator: str, G: int, metric: str) -> np.ndarray:
    rows = [r for r in read(folder / "batches.csv") if r["estimator"] == estimator and int(r["G"]) == G]
    return np.array([float(r[metric]) for r in sorted(rows, key=lambda r: int(r["batch"]))])


def paired_batches(folder: Path, a: tuple[str, int], b: tuple[str, int], metric: str) -> str:
    """``a - b`` (each an estimator and G) paired by batch, with its 95% t-interval; bold when it excludes 0."""
    diff = per_batch(folder, *a, metric) - per_batch(folder, *b, metric)
    interval = mean_interval(np.where(np.abs(diff) < 1e-9, 0.0, diff))
    text = f"{interval.value:+.3f} [{interval.low:+.3f}, {interval.high:+.3f}]"
    return f"**{text}**" if interval.excludes_zero else text


def summary(folder: Path) -> dict[tuple[str, int], dict[str, str]]:
    return {(r["estimator"], int(r["G"])): r for r in read(folder / "diagnose.csv")}


def pool_line(folder: Path) -> str:
    for line in (folder / "diagnose.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 7 and cells[0] == "2":
            return f"success rate {cells[1]}, sigma2 {cells[2]}, tau2 {cells[3]}"
    return ""


def diagnose_tables() -> str:
    out = []
    for model, title in MODELS:
        grpo_loss, ebpo_loss = HERE / "diagnose" / f"{model}-grpo", HERE / "diagnose" / f"{model}-ebpo"
        s, t = summary(grpo_loss), summary(ebpo_loss)
        out += [
            f"**{title}** ({pool_line(grpo_loss)}; `diagnose/{model}-grpo/`, `diagnose/{model}-ebpo/`)",
            "",
            "| G | constant groups | baseline MSE: GRPO | EBPO | cosine: GRPO | EBPO - GRPO | EBPO - REINFORCE++-b. "
            "(S = 0) | EBPO-cluster - GRPO | cosine, EBPO's loss: EBPO | EBPO-cluster - EBPO |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for G in SIZES:
            grpo, ebpo = s[("grpo", G)], s[("ebpo", G)]
            out.append(
                f"| {G} | {float(grpo['constant_groups']):.2f} | {float(grpo['baseline_error']):.4f} | "
                f"{float(ebpo['baseline_error']):.4f} | {float(grpo['cosine']):.3f} | "
                f"{paired_batches(grpo_loss, ('ebpo', G), ('grpo', G), 'cosine')} | "
                f"{paired_batches(grpo_loss, ('ebpo', G), (TWIN, G), 'cosine')} | "
                f"{paired_batches(grpo_loss, (CLUSTER, G), ('grpo', G), 'cosine')} | "
                f"{float(t[('ebpo', G)]['cosine']):.3f} | "
                f"{paired_batches(ebpo_loss, (CLUSTER, G), ('ebpo', G), 'cosine')} |"
            )
        out += [
            "",
            "GRPO's cosine, larger G minus smaller, paired by batch (the batch at G is part of the batch at 16): "
            + ", ".join(
                f"G16 - G{G} {paired_batches(grpo_loss, ('grpo', 16), ('grpo', G), 'cosine')}" for G in (2, 4)
            ),
            "",
        ]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------
# learning


def load_cells(paths: list[str]) -> dict[tuple[str, str, int, int], dict[str, str]]:
    """Fixed-prompts cells of the CSVs by (arm, method, G, seed); the same cell twice must be the same run."""
    cells: dict[tuple[str, str, int, int], dict[str, str]] = {}
    for path in paths:
        for row in read(Path(path)):
            if row["variant"] != "fixed-prompts":
                continue
            cell = (row["arm"], row["method"], int(row["group_size"]), int(row["seed"]))
            if cell in cells and cells[cell]["key"] != row["key"]:
                raise SystemExit(f"{path}: {cell} is another run ({row['key']}) than in an earlier CSV")
            cells[cell] = row
    return cells


def by_seed(cells: dict, arm: str, method: str, G: int, metric: str) -> dict[int, float]:
    return {
        seed: float(row[metric])
        for (a, m, g, seed), row in cells.items()
        if (a, m, g) == (arm, method, G) and row[metric] != ""
    }


def outcome(ci: MeanCI) -> str:
    if ci.n < 2:
        return "no interval"
    if not ci.excludes_zero:
        return "not shown"
    return "confirmed" if ci.mean > 0 else "refuted"


def interval(ci: MeanCI) -> str:
    if ci.n < 2:
        return f"{100 * ci.mean:+.2f} (n = {ci.n})"
    low, high = 100 * (ci.mean - ci.half_width), 100 * (ci.mean + ci.half_width)
    return f"{ci.format(100.0, 1, signed=True)} [{low:+.2f}, {high:+.2f}]"


COMPARISONS = (
    ("(2) sensitivity: GRPO G16 - G4", ("published", "grpo", 16), ("published", "grpo", 4)),
    ("(3a) EBPO (arm a) - GRPO, G = 2", ("estimators", "ebpo", 2), ("estimators", "grpo", 2)),
    ("(3b) EBPO (arm a) - GRPO, G = 4", ("estimators", "ebpo", 4), ("estimators", "grpo", 4)),
    ("(4) EBPO-topic - EBPO-naive, G = 4", ("published", "ebpo-topic", 4), ("published", "ebpo-naive", 4)),
)
"""The pre-registered comparisons: (label, cell, reference cell), each (arm, method, G)."""


def verdicts(paths: list[str]) -> str:
    cells = load_cells(paths)
    seeds = sorted({seed for *_, seed in cells})
    lines = [
        f"seeds: {', '.join(map(str, seeds))} ({len(seeds)})",
        "",
        "| comparison | validation AUC (primary), paired by seed | outcome | test Pass@1 (secondary) | outcome | n |",
        "|---|---|---|---|---|---|",
    ]
    for label, cell, reference in COMPARISONS:
        auc = paired_ci(by_seed(cells, *cell, "auc"), by_seed(cells, *reference, "auc"))
        pass1 = paired_ci(by_seed(cells, *cell, "pass1"), by_seed(cells, *reference, "pass1"))
        if auc.n == 0:
            continue
        if "sensitivity" in label:
            verdict = "PASS" if auc.excludes_zero or pass1.excludes_zero else "FAIL"
            lines.append(
                f"| {label} | {interval(auc)} | {verdict} | {interval(pass1)} | (either) | {auc.n} |"
            )
        else:
            lines.append(
                f"| {label} | {interval(auc)} | {outcome(auc)} | {interval(pass1)} | {outcome(pass1)} | {auc.n} |"
            )
    lines += ["", "| cell | validation AUC % | test Pass@1 % | n |", "|---|---|---|---|"]
    shown = {c for _, *pair in COMPARISONS for c in pair}
    for arm, method, G in sorted(shown, key=lambda c: (c[2], c[0], c[1])):
        auc, pass1 = (mean_ci(by_seed(cells, arm, method, G, m).values()) for m in ("auc", "pass1"))
        if auc.n:
            lines.append(f"| {arm}/{method}, G = {G} | {auc.format()} | {pass1.format()} | {auc.n} |")
    return "\n".join(lines)


def rates(pairs: list[str]) -> str:
    by_rate = {}
    for pair in pairs:
        rate, _, paths = pair.partition("=")
        by_rate[rate] = load_cells(paths.split(","))
    order = sorted(by_rate, key=float)
    lines = [
        "| method | metric | " + " | ".join(f"lr {r}" for r in order) + " | best lr (AUC) |",
        "|---|---|" + "---|" * len(order) + "---|",
    ]
    auc = {
        (name, rate): by_seed(by_rate[rate], arm, method, 4, "auc")
        for arm, method, name in RATE_METHODS
        for rate in order
    }
    best = {}
    for arm, method, name in RATE_METHODS:
        means = {rate: mean_ci(auc[(name, rate)].values()) for rate in order}
        best[name] = max(order, key=lambda r: means[r].mean if means[r].n else float("-inf"))
        for metric, label in (("auc", "validation AUC %"), ("pass1", "test Pass@1 %")):
            values = [mean_ci(by_seed(by_rate[r], arm, method, 4, metric).values()).format() for r in order]
            lines.append(f"| {name} | {label} | " + " | ".join(values) + f" | {best[name]} |")
    overall = {
        r: float(np.mean([mean_ci(auc[(n, r)].values()).mean for *_, n in RATE_METHODS])) for r in order
    }
    shared = max(order, key=lambda r: overall[r])
    lines += [
        "",
        "mean over the three methods of their mean validation AUC: "
        + ", ".join(f"{r} {100 * overall[r]:.2f}" for r in order)
        + f"; r* = {shared}",
    ]
    ok = True
    for *_, name in RATE_METHODS:
        diff = paired_ci(auc[(name, shared)], auc[(name, best[name])])
        holds = best[name] == shared or not diff.excludes_zero
        ok &= holds
        lines.append(
            f"- {name}: AUC at r* - at its best ({best[name]}) {interval(diff)}: "
            + ("contains 0" if holds else "excludes 0")
        )
    verdict = (
        f"one shared rate, {shared}"
        if ok
        else "one rate per method: " + ", ".join(f"{n} {best[n]}" for *_, n in RATE_METHODS)
    )
    upper = [n for *_, n in RATE_METHODS if best[n] == order[-1]]
    lower = [n for *_, n in RATE_METHODS if best[n] == order[0]]
    lines += ["", f"**{verdict}**"]
    if upper:
        lines.append(f"best at the grid's upper end ({order[-1]}): {', '.join(upper)}")
    if lower:
        lines.append(f"best at the grid's lower end ({order[0]}): {', '.join(lower)}")
    return "\n".join(lines)


BLOCKS = (
    ("seeds 0-9", HERE / "learning_s2_verdicts_cells.csv"),
    ("seeds 10-19", HERE / "learning_s2_verdicts_seeds10-19_cells.csv"),
)
THIRD_BLOCK = ("seeds 61-70", Path("data/replications/s2_verdicts_seeds61-70_cells.csv"))
"""The third block, relative to the shared folder (``$EBPO_SHARED``, else ``../shared`` beside the clone)."""


def shared_dir() -> Path:
    return Path(os.environ.get("EBPO_SHARED", HERE.parents[3] / "shared"))


def replication(third: Path | None = None) -> tuple[str, str | None]:
    """(the table, why the third block is missing or None): each comparison's paired interval per block, over
    the first two blocks together and over every block found."""
    third = shared_dir() / THIRD_BLOCK[1] if third is None else third
    blocks = [(label, [path]) for label, path in BLOCKS]
    missing = None
    if third.is_file():
        blocks.append((THIRD_BLOCK[0], [third]))
    else:
        missing = (
            f"the third block ({THIRD_BLOCK[0]}) is not at {third} (a clone without ../shared; set EBPO_SHARED to "
            "the folder that holds data/replications): the first two blocks only"
        )
    pooled = [("seeds 0-19", [path for _, path in BLOCKS])]
    if missing is None:
        pooled.append(("all three blocks", [path for _, paths in blocks for path in paths]))
    columns = blocks + pooled
    loaded = [(label, load_cells([str(p) for p in paths])) for label, paths in columns]
    lines = [
        "| comparison | metric | " + " | ".join(label for label, _ in columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for label, cell, reference in COMPARISONS:
        for metric, name in (("auc", "validation AUC"), ("pass1", "test Pass@1")):
            texts = []
            for _, cells in loaded:
                ci = paired_ci(by_seed(cells, *cell, metric), by_seed(cells, *reference, metric))
                texts.append(f"{interval(ci)} (n = {ci.n})" if ci.n else "-")
            lines.append(f"| {label} | {name} | " + " | ".join(texts) + " |")
    return "\n".join(lines), missing


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head`: end as a shell tool does when its reader exits
    command, args = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("", [])
    if command == "diagnose" and not args:
        print(diagnose_tables())
    elif command == "rates" and args:
        print(rates(args))
    elif command == "verdicts" and args:
        print(verdicts(args))
    elif command == "replication" and not args:
        table, missing = replication()
        if missing:
            print(f"skipped: {missing}", file=sys.stderr)
        print(table)
    else:
        sys.exit(__doc__)
