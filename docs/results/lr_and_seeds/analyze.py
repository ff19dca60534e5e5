"""The tables of docs/results/lr_and_seeds/README.md, from the benchmark's CSVs (one row per cell).

Run from the repository root:

    .venv/bin/python docs/results/lr_and_seeds/analyze.py reproduce NEW.csv COMMITTED.csv
    .venv/bin/python docs/results/lr_and_seeds/analyze.py sensitivity NEW.csv
    .venv/bin/python docs/results/lr_and_seeds/analyze.py lr LR=CSV [LR=CSV ...]

``reproduce`` compares every row of NEW whose cell (arm, method, variant, G, seed) is in COMMITTED, on every column but ``command`` and
``timing_*``, for exact equality of the stored text. ``sensitivity`` prints GRPO G16 - G4 (published arm, fixed
prompts) paired by seed over all seeds, seeds 0-4 and seeds 5-9. ``lr`` picks each method's learning rate by
its mean validation AUC over seeds (never the test set) and pairs the methods by seed at their chosen rates.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from benchmarks.learning.stats import MeanCI, mean_ci, paired_ci  # noqa: E402

SKIP = ("command",)
METHODS = (
    ("estimators", "grpo", "GRPO"),
    ("estimators", "ebpo", "EBPO (arm a)"),
    ("published", "dapo", "DAPO"),
)


def read(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def fmt(ci: MeanCI, signed: bool = True) -> str:
    text = ci.format(100.0, 1, signed=signed)
    return f"**{text}**" if signed and ci.excludes_zero else text


def cell(row: dict[str, str]) -> tuple[str, ...]:
    return (row["arm"], row["method"], row["variant"], f"G{row['group_size']}", f"seed{row['seed']}")


def reproduce(new_path: str, committed_path: str) -> int:
    committed = {cell(row): row for row in read(committed_path)}
    lines = ["| cell | key | columns compared | equal |", "|---|---|---|---|"]
    mismatches = 0
    for row in read(new_path):
        old = committed.get(cell(row))
        if old is None:
            continue
        columns = [c for c in row if c not in SKIP and not c.startswith("timing_")]
        differ = [c for c in columns if row[c] != old.get(c)]
        missing = [c for c in old if c not in row and c not in SKIP and not c.startswith("timing_")]
        if differ or missing:
            mismatches += 1
            detail = "; ".join(f"{c}: {old.get(c)} -> {row[c]}" for c in differ)
            detail += "".join(f"; {c} missing" for c in missing)
            lines.append(f"| {'/'.join(cell(row))} | {row['key']} | {len(columns)} | **no**: {detail} |")
        else:
            lines.append(f"| {'/'.join(cell(row))} | {row['key']} | {len(columns)} | yes |")
    print("\n".join(lines))
    print(f"\n{len(lines) - 2} rows compared, {mismatches} differ")
    return 1 if mismatches else 0


def by_seed(rows: list[dict[str, str]], metric: str, **where: str) -> dict[int, float]:
    return {
        int(r["seed"]): float(r[metric])
        for r in rows
        if all(r[k] == v for k, v in where.items()) and r[metric] != ""
    }


def sensitivity(path: str) -> int:
    rows = read(path)
    where = {"arm": "published", "method": "grpo", "variant": "fixed-prompts"}
    lines = [
        "| metric | seeds | G = 4 | G = 16 | G16 - G4, paired, 95% CI |",
        "|---|---|---|---|---|",
    ]
    for metric, label in (("auc", "validation AUC %"), ("pass1", "test Pass@1 %")):
        g4 = by_seed(rows, metric, group_size="4", **where)
        g16 = by_seed(rows, metric, group_size="16", **where)
        for name, seeds in (("0-9", range(10)), ("0-4", range(5)), ("5-9", range(5, 10))):
            a = {s: v for s, v in g4.items() if s in seeds}
            b = {s: v for s, v in g16.items() if s in seeds}
            lines.append(
                f"| {label} | {name} (n = {len(set(a) & set(b))}) | {fmt(mean_ci(a.values()), False)} | "
                f"{fmt(mean_ci(b.values()), False)} | {fmt(paired_ci(b, a))} |"
            )
    print("\n".join(lines))
    return 0


def lr_tables(pairs: list[str]) -> int:
    per_lr = {}
    for pair in pairs:
        lr, path = pair.split("=", 1)
        per_lr[lr] = [r for r in read(path) if r["variant"] == "fixed-prompts" and r["group_size"] == "4"]
    rates = list(per_lr)

    def values(arm: str, method: str, lr: str, metric: str) -> dict[int, float]:
        return by_seed(per_lr[lr], metric, arm=arm, method=method)

    print("Per learning rate (mean ± 95% over seeds; the chosen rate has the highest mean validation AUC):\n")
    lines = ["| method | metric | " + " | ".join(f"lr {lr}" for lr in rates) + " | chosen lr |"]
    lines.append("|---|---|" + "---|" * len(rates) + "---|")
    best = {}
    for arm, method, label in METHODS:
        auc = {lr: mean_ci(values(arm, method, lr, "auc").values()) for lr in rates}
        best[method] = max(rates, key=lambda lr: auc[lr].mean)
        for metric, name in (("auc", "validation AUC %"), ("pass1", "test Pass@1 %")):
            cis = [fmt(mean_ci(values(arm, method, lr, metric).values()), False) for lr in rates]
            lines.append(f"| {label} | {name} | " + " | ".join(cis) + f" | {best[method]} |")
    print("\n".join(lines))

    print("\nPaired by seed, each method at its chosen lr, and at each shared lr:\n")
    lines = ["| difference | lrs | Δ test Pass@1 | Δ validation AUC |", "|---|---|---|---|"]
    grpo = METHODS[0][1]
    for arm, method, label in METHODS[1:]:
        compared = [(f"{best[method]} vs {best[grpo]} (chosen)", best[method], best[grpo])]
        compared += [(f"{lr} vs {lr}", lr, lr) for lr in rates]
        for text, lr_m, lr_g in compared:
            # the reference is the same arm's GRPO (one run serves both arms)
            cells = [
                fmt(paired_ci(values(arm, method, lr_m, metric), values(arm, grpo, lr_g, metric)))
                for metric in ("pass1", "auc")
            ]
            lines.append(f"| {label} - GRPO | {text} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "reproduce":
        return reproduce(argv[1], argv[2])
    if len(argv) == 2 and argv[0] == "sensitivity":
        return sensitivity(argv[1])
    if len(argv) >= 2 and argv[0] == "lr":
        return lr_tables(argv[1:])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
