"""The tables of docs/results/lr_and_seeds/README.md, from the benchmark's CSVs (one row per cell).

Run from the repository root:

    .venv/bin/python docs/results/lr_and_seeds/analyze.py reproduce NEW.csv COMMITTED.csv
    .venv/bin/python docs/results/lr_and_seeds/analyze.py sensitivity NEW.csv
    .venv/bin/python docs/results/lr_and_seeds/analyze.py lr LR=CSV [LR=CSV ...]
    .venv/bin/python docs/results/lr_and_seeds/analyze.py rates LR=CSV[,CSV ...] [LR=CSV[,CSV ...] ...]
    .venv/bin/python docs/results/lr_and_seeds/analyze.py figures OUT_DIR SENS.csv MATRIX.csv LR=CSV [LR=CSV ...]

``reproduce`` compares every row of NEW whose cell (arm, method, variant, G, seed) is in COMMITTED, on every
column but ``command`` and ``timing_*``, for exact equality of the stored text. ``sensitivity`` prints GRPO
G16 - G4 (published arm, fixed prompts) paired by seed over all seeds, seeds 0-4 and seeds 5-9. ``lr`` picks each
method's learning rate by its mean validation AUC over seeds (never the test set) and pairs the methods by seed
at their chosen rates. ``rates`` does the choice for every method in the CSVs (G = 4, fixed prompts) and applies
the shared-rate rule of docs/results/defaults (section 2, rule 2) to all of them together: r* is the rate, among
those every method was measured at, with the highest mean over methods of their mean validation AUC, and each
method's AUC at r* minus its AUC at its own best rate is paired by seed.
``figures`` draws ``lr.png`` (each method's test Pass@1 and validation AUC against the rate) and
``literature.png`` (the paired differences the literature predicts: DAPO - GRPO at each rate, G16 - G4 at fixed
prompts from SENS, 64 x 4 - 16 x 16 at an equal response budget from MATRIX).
"""

from __future__ import annotations

import csv
import signal
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
    return ci.format_difference() if signed else ci.format(100.0, 1)


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
    per_lr = read_lrs(pairs)
    rates = list(per_lr)

    def values(arm: str, method: str, lr: str, metric: str) -> dict[int, float]:
        return by_seed(per_lr[lr], metric, arm=arm, method=method)

    print("Per learning rate (mean ± 95% over seeds; the chosen rate has the highest mean validation AUC):\n")
    lines = ["| method | metric | " + " | ".join(f"lr {lr}" for lr in rates) + " | chosen lr |"]
    lines.append("|---|---|" + "---|" * len(rates) + "---|")
    best = {}
    for arm, method, label in METHODS:
        best[method] = chosen_rate(per_lr, arm, method)
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


def rates(pairs: list[str]) -> int:
    per_lr = read_lrs(pairs)
    lrs = list(per_lr)
    runs: dict[tuple[str, str], set[str]] = {}
    for rows in per_lr.values():
        for r in rows:
            runs.setdefault((r["arm"], r["method"]), set()).add(r["key"])
    # a method in both arms (GRPO) is one set of runs: counted once, under its first arm
    methods = [m for i, m in enumerate(sorted(runs)) if all(runs[m] != runs[o] for o in sorted(runs)[:i])]

    def auc(arm: str, method: str, lr: str) -> dict[int, float]:
        return by_seed(per_lr[lr], "auc", arm=arm, method=method)

    measured = {m: [lr for lr in lrs if auc(*m, lr)] for m in methods}
    common = [lr for lr in lrs if all(lr in measured[m] for m in methods)]
    if not common:
        print("no rate at which every method was measured", file=sys.stderr)
        return 1
    mean_auc = {(m, lr): mean_ci(auc(*m, lr).values()).mean for m in methods for lr in measured[m]}
    best = {m: max(measured[m], key=lambda lr: mean_auc[m, lr]) for m in methods}
    shared = max(common, key=lambda lr: sum(mean_auc[m, lr] for m in methods) / len(methods))
    print(f"rates every method was measured at: {', '.join(common)}; r* = {shared}")
    for lr in common:
        print(
            f"  lr {lr}: mean over methods of mean validation AUC {100 * sum(mean_auc[m, lr] for m in methods) / len(methods):.1f}"
        )
    lines = [
        "| arm / method | metric | "
        + " | ".join(f"lr {lr}" for lr in lrs)
        + " | best lr | AUC at r* - at best |",
        "|---|---|" + "---|" * len(lrs) + "---|---|",
    ]
    apart = []
    for m in methods:
        gap = paired_ci(auc(*m, shared), auc(*m, best[m])) if best[m] != shared else None
        if gap is not None and gap.excludes_zero:
            apart.append("/".join(m))
        for metric, name in (("auc", "validation AUC %"), ("pass1", "test Pass@1 %")):
            cis = [
                fmt(mean_ci(by_seed(per_lr[lr], metric, arm=m[0], method=m[1]).values()), False)
                if lr in measured[m]
                else ""
                for lr in lrs
            ]
            tail = (fmt(gap) if gap is not None else "0 (r* is its best)") if metric == "auc" else ""
            lines.append(f"| {'/'.join(m)} | {name} | " + " | ".join(cis) + f" | {best[m]} | {tail} |")
    print("\n".join(lines))
    verdict = "per method: " + ", ".join(apart) + " differ" if apart else f"one shared rate, {shared}"
    print(f"\nshared-rate rule: {verdict}")
    return 0


def read_lrs(pairs: list[str]) -> dict[str, list[dict[str, str]]]:
    out = {}
    for pair in pairs:
        lr, path = pair.split("=", 1)
        rows = [r for one in path.split(",") for r in read(one)]
        out[lr] = [r for r in rows if r["variant"] == "fixed-prompts" and r["group_size"] == "4"]
    return out


def chosen_rate(per_lr: dict[str, list[dict[str, str]]], arm: str, method: str) -> str:
    """The rate with the highest mean validation AUC over seeds."""
    return max(
        per_lr, key=lambda lr: mean_ci(by_seed(per_lr[lr], "auc", arm=arm, method=method).values()).mean
    )


def figures(out_dir: str, sens_path: str, matrix_path: str, pairs: list[str]) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_lr = read_lrs(pairs)
    rates = list(per_lr)
    x = [float(lr) for lr in rates]
    metrics = (("pass1", "test Pass@1 (%)"), ("auc", "validation AUC (%)"))

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (metric, label) in zip(axes, metrics):
        for i, (arm, method, name) in enumerate(METHODS):
            cis = [mean_ci(by_seed(per_lr[lr], metric, arm=arm, method=method).values()) for lr in rates]
            shift = [v * (1 + 0.04 * (i - 1)) for v in x]
            ax.errorbar(shift, [100 * c.mean for c in cis], [100 * c.half_width for c in cis], marker="o",
                        capsize=3, label=name)  # fmt: skip
            best = rates.index(chosen_rate(per_lr, arm, method))
            ax.plot([shift[best]], [100 * cis[best].mean], "k*", markersize=11)
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(x, rates)
        ax.set_xlabel("learning rate")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(
        "G = 4, fixed prompts, seeds 0-4: mean ± 95% over seeds; * = the rate chosen on validation AUC"
    )
    fig.tight_layout()
    fig.savefig(Path(out_dir) / "lr.png", dpi=100)
    plt.close(fig)

    sens, matrix = read(sens_path), read(matrix_path)
    grpo = {"arm": "published", "method": "grpo"}
    entries: list[tuple[str, dict[str, MeanCI]]] = []
    for lr in rates:
        entries.append((f"DAPO - GRPO, lr {lr}", {
            m: paired_ci(by_seed(per_lr[lr], m, arm="published", method="dapo"), by_seed(per_lr[lr], m, **grpo))
            for m, _ in metrics
        }))  # fmt: skip
    lr_d, lr_g = chosen_rate(per_lr, "published", "dapo"), chosen_rate(per_lr, "published", "grpo")
    entries.append((f"DAPO ({lr_d}) - GRPO ({lr_g}), chosen", {
        m: paired_ci(by_seed(per_lr[lr_d], m, arm="published", method="dapo"), by_seed(per_lr[lr_g], m, **grpo))
        for m, _ in metrics
    }))  # fmt: skip
    g_fixed = dict(variant="fixed-prompts", **grpo)
    entries.append(("G16 - G4, 32 prompts (10 seeds)", {
        m: paired_ci(by_seed(sens, m, group_size="16", **g_fixed), by_seed(sens, m, group_size="4", **g_fixed))
        for m, _ in metrics
    }))  # fmt: skip
    g_equal = dict(variant="equal-responses", **grpo)
    entries.append(("64 x G4 - 16 x G16, 256 responses (5 seeds)", {
        m: paired_ci(by_seed(matrix, m, group_size="4", **g_equal), by_seed(matrix, m, group_size="16", **g_equal))
        for m, _ in metrics
    }))  # fmt: skip
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.5 * len(entries) + 1.6), sharey=True)
    y = list(range(len(entries)))[::-1]
    for ax, (metric, label) in zip(axes, metrics):
        cis = [e[1][metric] for e in entries]
        ax.errorbar(
            [100 * c.mean for c in cis], y, xerr=[100 * c.half_width for c in cis], fmt="o", capsize=3
        )
        ax.axvline(0, color="k", linewidth=0.8)
        ax.set_xlabel(f"paired difference, {label}")
        ax.grid(alpha=0.3)
    axes[0].set_yticks(y, [e[0] for e in entries])
    fig.suptitle("What the literature predicts, on this testbed (GRPO as published; mean ± 95% over seeds)")
    fig.tight_layout()
    fig.savefig(Path(out_dir) / "literature.png", dpi=100)
    plt.close(fig)
    print(f"wrote {Path(out_dir) / 'lr.png'} and {Path(out_dir) / 'literature.png'}")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "reproduce":
        return reproduce(argv[1], argv[2])
    if len(argv) == 2 and argv[0] == "sensitivity":
        return sensitivity(argv[1])
    if len(argv) >= 2 and argv[0] == "lr":
        return lr_tables(argv[1:])
    if len(argv) >= 2 and argv[0] == "rates":
        return rates(argv[1:])
    if len(argv) >= 5 and argv[0] == "figures":
        return figures(argv[1], argv[2], argv[3], argv[4:])
    print(__doc__)
    return 2


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head`: end as a shell tool does when its reader exits
    sys.exit(main(sys.argv[1:]))
