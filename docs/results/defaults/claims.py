"""Every figure of the claims table of docs/results/README.md, and the pooled comparisons that section 4 of
docs/results/defaults/README.md pre-registers, from the learning benchmark's per-cell CSVs.

Run from the repository root:

    .venv/bin/python docs/results/defaults/claims.py claims MATRIX.csv [--runs RUNS_DIR]
    .venv/bin/python docs/results/defaults/claims.py pooled CSV [CSV ...]

``claims`` prints, per claim of the table (and the sensitivity check before it), the figures it states: test
Pass@1 and validation AUC in %, mean ± 95% t half-width over seeds; Δ = a paired difference by seed (bold when
its interval excludes 0). Everything is at G = 4, fixed prompts, unless a table says otherwise. Entropy,
gradient norm, step KL and the all-fail fraction are the CSV's whole-run means over training steps; with
``--runs`` (the benchmark's runs directory, read only) two figures come from each run's
``RUNS_DIR/<key>/metrics.jsonl`` as well: the mean of ``actor/entropy`` over the last quarter of the run (steps
above 0.75 x the last step) and the largest ``actor/step_kl`` of the run. The methods or cells a claim needs that
the CSV does not hold are named in one line at the end of its section.

``pooled`` takes the union of the CSVs' rows (a run listed in two of them counts once; one cell filled by two
different runs, as when the CSVs ran at different learning rates, is an error naming both) and prints the four
comparisons of section 4: the sensitivity check (GRPO G16 - G4), EBPO (arm a) - GRPO at G = 4 and at G = 16, DAPO
(arm b) - GRPO at G = 4, all at fixed prompts, on test Pass@1 and validation AUC, over every seed present, seeds
0-9 and seeds 10-19, then the sensitivity check's verdict by the benchmark's rule. A difference pairs the seeds
both of its cells have; n says how many.

GRPO is one run in both arms (the same key): its rows of either arm serve as the reference of every difference,
and two arms' GRPO rows of one (variant, G, seed) with different keys are an error.
"""

from __future__ import annotations

import csv
import json
import math
import signal
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from benchmarks.learning.stats import MeanCI, mean_ci, paired_ci  # noqa: E402
from benchmarks.pages import portable_path  # noqa: E402

A, B = "estimators", "published"
"""Arm (a): the estimators under GRPO's published loss; arm (b): the methods as published (the presets)."""
FIXED, EQUAL = "fixed-prompts", "equal-responses"
GRPO = "grpo"
IDENTITY = ("arm", "method", "variant", "group_size", "seed", "key")
FIGURES = (
    "pass1",
    "auc",
    "grad_norm",
    "entropy",
    "step_kl",
    "all_fail",
    "test_level_4_pass1",
    "test_level_5_pass1",
)
"""The CSV columns the tables read: each must be a number or empty (checked before anything is printed)."""
LAST_ENTROPY = "entropy_last_quarter"
MAX_STEP_KL = "step_kl_max"
"""The two columns ``--runs`` adds to each row from its run's metrics.jsonl."""
SEED_GROUPS = (("0-9", range(10)), ("10-19", range(10, 20)))


class InputError(Exception):
    """A CSV or run directory that cannot be read as the benchmark writes it; the message names the place."""


@dataclass(frozen=True)
class Run:
    """One row of a learning benchmark CSV: the cell (arm, method, variant, G, seed) and the run that fills it."""

    arm: str
    method: str
    variant: str
    G: int
    seed: int
    key: str
    fields: dict[str, str]
    source: str
    """``path:line`` of the row, for messages."""

    @property
    def cell(self) -> str:
        return f"{self.arm}/{self.method}/{self.variant}/G{self.G}/seed{self.seed}"

    def value(self, column: str) -> float | None:
        text = self.fields.get(column, "")
        if text == "":
            return None
        try:
            return float(text)
        except ValueError:
            raise InputError(f"{self.source}: column {column!r} is {text!r}, not a number") from None


def read_runs(path: str) -> list[Run]:
    """The rows of one CSV; a missing identity column or a figure that is not a number is an error."""
    runs = []
    try:
        with open(path, newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in IDENTITY if c not in (reader.fieldnames or [])]
            if missing:
                raise InputError(f"{path}: no column {', '.join(missing)}; is it a learning benchmark CSV?")
            for row in reader:
                source = f"{path}:{reader.line_num}"
                try:
                    G, seed = int(row["group_size"]), int(row["seed"])
                except ValueError:
                    raise InputError(f"{source}: group_size and seed must be integers") from None
                run = Run(row["arm"], row["method"], row["variant"], G, seed, row["key"], row, source)
                for column in FIGURES:
                    run.value(column)
                runs.append(run)
    except OSError as error:
        raise InputError(f"{path}: cannot be read ({error.strerror})") from None
    return runs


def union(paths: Sequence[str]) -> tuple[list[Run], int]:
    """The rows of every CSV, a run listed twice (same cell, same key) once; and how many were dropped so."""
    by_cell: dict[str, Run] = {}
    dropped = 0
    for path in paths:
        for run in read_runs(path):
            first = by_cell.setdefault(run.cell, run)
            if first is run:
                continue
            if first.key != run.key:
                raise InputError(
                    f"cell {run.cell} is run {first.key} in {first.source} but run {run.key} in {run.source}: "
                    "two different runs (another learning rate or library?); pool only CSVs of one design"
                )
            dropped += 1
    return list(by_cell.values()), dropped


@dataclass(frozen=True)
class Cell:
    """A table entry: an arm's method at group size G under a budget variant (GRPO: either arm)."""

    arm: str
    method: str
    G: int = 4
    variant: str = FIXED

    @property
    def name(self) -> str:
        return GRPO if self.method == GRPO else f"{self.arm}/{self.method}"

    @property
    def label(self) -> str:
        arm = "either arm" if self.method == GRPO else self.arm
        return f"{arm}/{self.method} (G = {self.G}, {self.variant})"


class Matrix:
    """The runs of one or more CSVs, looked up by cell and seed."""

    def __init__(self, runs: Iterable[Run]) -> None:
        self.runs = list(runs)
        self.rows: dict[tuple[str, str, int, str], dict[int, Run]] = {}
        for run in sorted(self.runs, key=lambda r: r.arm != B):  # published first: its GRPO rows are kept
            arm = B if run.method == GRPO else run.arm
            seeds = self.rows.setdefault((arm, run.method, run.G, run.variant), {})
            other = seeds.setdefault(run.seed, run)
            if other.key != run.key:
                raise InputError(
                    f"GRPO serves both arms, but {other.source} ({other.cell}) is run {other.key} and "
                    f"{run.source} ({run.cell}) is run {run.key}"
                )

    def runs_of(self, cell: Cell) -> dict[int, Run]:
        return self.rows.get((B if cell.method == GRPO else cell.arm, cell.method, cell.G, cell.variant), {})

    def has(self, cell: Cell) -> bool:
        return bool(self.runs_of(cell))

    def values(self, cell: Cell, column: str) -> dict[int, float]:
        out = {}
        for seed, run in self.runs_of(cell).items():
            value = run.value(column)
            if value is not None:
                out[seed] = value
        return out

    def methods(self, arm: str, G: int = 4, variant: str = FIXED) -> list[str]:
        """The arm's methods at (G, variant) in CSV order, GRPO first."""
        names = {r.method: None for r in self.runs if (r.arm, r.G, r.variant) == (arm, G, variant)}
        return sorted(names, key=lambda m: m != GRPO)

    def seeds(self) -> list[int]:
        return sorted({r.seed for r in self.runs})


class Section:
    """One claim's markdown: tables whose figures come from a :class:`Matrix`, and the cells it lacked."""

    def __init__(self, matrix: Matrix, title: str) -> None:
        self.matrix = matrix
        self.lines = [f"### {title}", ""]
        self.absent: list[str] = []

    def present(self, *cells: Cell) -> bool:
        """Whether every cell is in the CSV; the absent ones are noted under the section."""
        missing = [c.label for c in cells if not self.matrix.has(c)]
        self.absent += [m for m in missing if m not in self.absent]
        return not missing

    def mean(self, cell: Cell, column: str, scale: float = 100.0, digits: int = 1) -> str:
        """Mean ± half-width over the cell's seeds; ``(n = k)`` where fewer than its rows have the figure."""
        values = self.matrix.values(cell, column)
        if not values:
            return f"no {column}"
        return mean_ci(values.values()).format(scale, digits) + self._short(len(values), cell)

    def delta(self, cell: Cell, reference: Cell, column: str, scale: float = 100.0, digits: int = 1) -> str:
        """The paired difference cell - reference, bold when its interval excludes 0."""
        ci = paired_ci(self.matrix.values(cell, column), self.matrix.values(reference, column))
        return (
            ci.format_difference(scale, digits) + self._short(ci.n, cell, reference)
            if ci.n
            else f"no paired {column}"
        )

    def differences(self, pairs: Iterable[tuple[str, Cell, Cell]]) -> list[list[str]]:
        """A row ``name | n | Δ test Pass@1 | Δ validation AUC`` per ``(name, cell, reference)`` in the CSV."""
        return [
            [
                name,
                self.n(cell, reference),
                self.delta(cell, reference, "pass1"),
                self.delta(cell, reference, "auc"),
            ]
            for name, cell, reference in pairs
            if self.present(cell, reference)
        ]

    def n(self, *cells: Cell) -> str:
        """Seeds every cell has (the n of a paired difference)."""
        return str(self._common(cells))

    def _common(self, cells: Sequence[Cell]) -> int:
        return len(set.intersection(*(set(self.matrix.runs_of(c)) for c in cells)))

    def _short(self, n: int, *cells: Cell) -> str:
        return f" (n = {n})" if n < self._common(cells) else ""

    def table(self, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        if rows:
            self.lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            self.lines += ["| " + " | ".join(row) + " |" for row in rows]
            self.lines.append("")

    def text(self, line: str) -> None:
        self.lines += [line, ""]

    def render(self) -> str:
        if self.absent:
            self.lines += [f"Not in the CSV, left out above: {'; '.join(self.absent)}.", ""]
        return "\n".join(self.lines)


def seed_text(seeds: Iterable[int]) -> str:
    """``0-4, 7, 10-19``: consecutive seeds as ranges."""
    spans: list[list[int]] = []
    for seed in sorted(set(seeds)):
        if spans and seed == spans[-1][1] + 1:
            spans[-1][1] = seed
        else:
            spans.append([seed, seed])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans) or "none"


# ---------------------------------------------------------------------------------------------- claims


def grpo(G: int = 4, variant: str = FIXED) -> Cell:
    return Cell(B, GRPO, G, variant)


def sensitivity(m: Matrix) -> Section:
    s = Section(m, "Sensitivity check and group size (GRPO)")
    rows = []
    for name, cell in (
        ("GRPO, G = 4, fixed prompts", grpo(4)),
        ("GRPO, G = 8, fixed prompts", grpo(8)),
        ("GRPO, G = 16, fixed prompts", grpo(16)),
        ("GRPO, G = 4, equal responses", grpo(4, EQUAL)),
        ("GRPO, G = 16, equal responses", grpo(16, EQUAL)),
    ):
        if s.present(cell):
            rows.append([name, s.n(cell), s.mean(cell, "pass1"), s.mean(cell, "auc")])
    rows += s.differences(
        [
            ("Δ G16 - G4, fixed prompts (the sensitivity check)", grpo(16), grpo(4)),
            ("Δ G4 - G16, equal responses (more prompts vs larger groups)", grpo(4, EQUAL), grpo(16, EQUAL)),
        ]
    )
    s.table(["GRPO", "n", "test Pass@1 %", "validation AUC %"], rows)
    return s


def claim1(m: Matrix) -> Section:
    s = Section(m, "Claim 1: EBPO beats GRPO, Dr. GRPO, DAPO, EntropyMech at G = 4")
    for arm, title in ((B, "arm (b), as published"), (A, "arm (a), under GRPO's loss")):
        rows = []
        for method in m.methods(arm):
            cell = Cell(arm, method)
            vs = [s.delta(cell, grpo(), c) for c in ("pass1", "auc")] if method != GRPO else ["-", "-"]
            rows.append([method, s.n(cell), s.mean(cell, "pass1"), s.mean(cell, "auc"), *vs])
        if not rows:
            s.absent.append(f"arm {arm} at G = 4, fixed prompts")
        s.table([title, "n", "test Pass@1 %", "validation AUC %", "Δ test vs GRPO", "Δ AUC vs GRPO"], rows)
    dapo = Cell(B, "dapo")
    ebpos = ["ebpo-naive", "ebpo-topic", "ebpo-diff"]
    rows = s.differences((f"{method} - dapo", Cell(B, method), dapo) for method in ebpos)
    s.table(["arm (b), vs DAPO", "n", "Δ test Pass@1", "Δ validation AUC"], rows)
    means = {
        f"{arm}/{method}": mean_ci(m.values(Cell(arm, method), "pass1").values()).mean
        for arm in (A, B)
        for method in m.methods(arm)
    }
    finite = {name: v for name, v in means.items() if math.isfinite(v)}
    if len(finite) > 1:
        low, high = min(finite, key=finite.__getitem__), max(finite, key=finite.__getitem__)
        s.text(
            f"Test Pass@1 over every method of both arms: {100 * finite[low]:.1f} ({low}) to "
            f"{100 * finite[high]:.1f} ({high})."
        )
    return s


def claim2(m: Matrix) -> Section:
    s = Section(m, "Claim 2: EBPO's margin is largest at small G (arm a)")
    swept = {r.method for r in m.runs if r.arm == A and r.method.startswith("ebpo") and r.G != 4}
    ebpos = ["ebpo"] + sorted(swept - {"ebpo"})  # the paper's options, then every EBPO variant run across G
    rows = []
    for variant in (FIXED, EQUAL):
        for G in (4, 8, 16):
            for method in ebpos:
                cell = Cell(A, method, G, variant)
                if s.present(cell, grpo(G, variant)):
                    deltas = [s.delta(cell, grpo(G, variant), c) for c in ("pass1", "auc")]
                    rows.append([f"{method} - grpo", variant, str(G), s.n(cell, grpo(G, variant)), *deltas])
    s.table(["arm (a)", "budget", "G", "n", "Δ test Pass@1", "Δ validation AUC"], rows)
    return s


def claim3(m: Matrix) -> Section:
    s = Section(m, "Claim 3: topic-clustered order beats random order (arm b)")
    topic, naive = Cell(B, "ebpo-topic"), Cell(B, "ebpo-naive")
    rows = s.differences([("ebpo-topic - ebpo-naive", topic, naive), ("ebpo-topic - grpo", topic, grpo())])
    s.table(["difference", "n", "Δ test Pass@1", "Δ validation AUC"], rows)
    return s


def claim4(m: Matrix) -> Section:
    s = Section(m, "Claim 4: a difficulty curriculum helps on the hardest problems (arm b, test Pass@1 %)")
    diff = Cell(B, "ebpo-diff")
    columns = ("test_level_5_pass1", "test_level_4_pass1", "pass1")
    rows = []
    if s.present(diff):
        for cell in (grpo(), diff):
            rows.append([cell.method, s.n(cell), *(s.mean(cell, c) for c in columns)])
        rows.append(["Δ ebpo-diff - grpo", s.n(diff, grpo()), *(s.delta(diff, grpo(), c) for c in columns)])
    s.table(["", "n", "level 5", "level 4", "overall"], rows)
    return s


def against_grpo(
    s: Section, cells: Sequence[Cell], columns: Sequence[tuple[str, str]], scale: float, digits: int
) -> None:
    """A row per cell: for each ``(column, title)`` the cell's mean and its paired difference from GRPO."""
    rows = []
    for cell in cells:
        if not s.present(cell):
            continue
        figures = []
        for column, _ in columns:
            figures.append(s.mean(cell, column, scale, digits))
            figures.append(s.delta(cell, grpo(), column, scale, digits) if cell.method != GRPO else "-")
        rows.append([cell.name, s.n(cell, grpo()), *figures])
    s.table(["method", "n"] + [text for _, title in columns for text in (title, "Δ vs GRPO")], rows)


def per_run(
    column: str, title: str, run_column: str, run_title: str, with_runs: bool
) -> list[tuple[str, str]]:
    """A CSV column and, with ``--runs``, the column computed from the runs' metrics.jsonl."""
    return [(column, title)] + [(run_column, run_title)] * with_runs


def claim5(m: Matrix, with_runs: bool) -> Section:
    s = Section(m, "Claim 5: EBPO keeps a higher entropy (raw entropy, 3 decimals; last quarter: `--runs`)")
    cells = (
        [grpo()] + [Cell(B, x) for x in ("ebpo-naive", "ebpo-topic", "ebpo-diff", "dapo")] + [Cell(A, "ebpo")]
    )
    against_grpo(s, cells, per_run("entropy", "whole run", LAST_ENTROPY, "last quarter", with_runs), 1.0, 3)
    return s


def claim6(m: Matrix) -> Section:
    s = Section(m, "Claim 6: EBPO keeps non-vanishing gradients (arm a, gradient norm before clipping)")
    if not m.methods(A):
        s.absent.append("arm estimators at G = 4, fixed prompts")
    against_grpo(s, [Cell(A, x) for x in m.methods(A)], [("grad_norm", "mean grad norm")], 1.0, 2)
    return s


def claim7(m: Matrix, with_runs: bool) -> Section:
    s = Section(m, "Claim 7: EBPO bounds the per-step KL (KL(pi_t ‖ pi_t+1) x 1e3; max over steps: `--runs`)")
    cells = [grpo(), Cell(A, "ebpo")] + [Cell(B, x) for x in ("ebpo-naive", "ebpo-topic", "ebpo-diff")]
    against_grpo(
        s, cells, per_run("step_kl", "mean over steps", MAX_STEP_KL, "max over steps", with_runs), 1e3, 1
    )
    return s


def claim8(m: Matrix) -> Section:
    s = Section(m, "Claim 8 (ours): all-fail groups get a signal from EBPO")
    rows, means = [], {}
    cells = [grpo()] * m.has(grpo()) + [Cell(arm, x) for arm in (A, B) for x in m.methods(arm) if x != GRPO]
    for cell in cells:  # GRPO once: one run serves both arms
        means[cell] = mean_ci(m.values(cell, "all_fail").values()).mean
        rows.append([cell.name, s.n(cell), s.mean(cell, "all_fail")])
    s.table(["method (G = 4)", "n", "all-fail groups %"], rows)
    others = [v for c, v in means.items() if c.method != "dapo" and math.isfinite(v)]
    if others:
        dapo = means.get(Cell(B, "dapo"), math.nan)
        s.text(
            f"Range over methods but DAPO: {100 * min(others):.1f}-{100 * max(others):.1f}%; DAPO "
            f"{100 * dapo:.1f}%."
        )
    if s.present(grpo(4), grpo(16)):
        s.text(
            f"GRPO, fixed prompts: G = 4 {s.mean(grpo(4), 'all_fail')}%, G = 16 {s.mean(grpo(16), 'all_fail')}% "
            f"(Δ G16 - G4 {s.delta(grpo(16), grpo(4), 'all_fail')}, n = {s.n(grpo(4), grpo(16))})."
        )
    ebpo = Cell(A, "ebpo")
    if s.present(ebpo):
        level5 = "test_level_5_pass1"
        s.table(
            ["test Pass@1 % at level 5", "n", "value"],
            [
                ["grpo", s.n(grpo()), s.mean(grpo(), level5)],
                ["estimators/ebpo", s.n(ebpo), s.mean(ebpo, level5)],
                ["Δ ebpo - grpo", s.n(ebpo, grpo()), s.delta(ebpo, grpo(), level5)],
            ],
        )
    return s


def claims(path: str, runs_dir: str | None) -> int:
    runs, dropped = union([path])
    if runs_dir is not None:
        runs = with_run_metrics(runs, Path(runs_dir))
    m = Matrix(runs)
    per_cell = Counter((r.arm, r.method, r.variant, r.G) for r in runs).values()
    low, high = min(per_cell, default=0), max(per_cell, default=0)
    notes = [
        f"{len(runs)} rows, {len(per_cell)} cells (arm, method, budget, G), seeds {seed_text(m.seeds())}",
        f"{low} seeds in every cell" if low == high else f"{low}-{high} seeds per cell",
    ]
    notes += [f"{dropped} rows listed twice counted once"] * bool(dropped)
    notes.append(
        f"per-run figures from `{portable_path(runs_dir, 'runs-dir')}`"
        if runs_dir
        else "no `--runs`: the per-run figures left out"
    )
    print(f"## The claims table's figures from `{portable_path(path)}`\n")
    print(
        "; ".join(notes) + ". Mean ± 95% t half-width over seeds; Δ paired by seed, bold when its interval "
        "excludes 0.\n"
    )
    sections = [sensitivity(m), claim1(m), claim2(m), claim3(m), claim4(m)]
    sections += [claim5(m, runs_dir is not None), claim6(m), claim7(m, runs_dir is not None), claim8(m)]
    print("\n".join(s.render() for s in sections))
    return 0


def with_run_metrics(runs: list[Run], root: Path) -> list[Run]:
    """``runs`` with the two per-run columns from ``root/<key>/metrics.jsonl`` (empty where it is missing)."""
    if not root.is_dir():
        raise InputError(
            f"--runs {root}: not a directory (the benchmark's --runs-dir, with one folder per key)"
        )
    cache: dict[str, dict[str, str]] = {}
    for run in runs:
        if run.key not in cache:
            cache[run.key] = run_metrics(root / run.key / "metrics.jsonl")
    return [replace(run, fields={**run.fields, **cache[run.key]}) for run in runs]


def run_metrics(path: Path) -> dict[str, str]:
    """The mean of ``actor/entropy`` over the steps above 0.75 x the run's last step, and the largest
    ``actor/step_kl``, of one run's metrics.jsonl (a step logged twice, by a resumed run, counts once: the
    later line). A missing file or a line that is not a JSON record is reported on stderr."""
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        print(
            f"{path}: cannot be read ({error.strerror}); its run's per-run figures are left out",
            file=sys.stderr,
        )
        return {}
    by_step: dict[int, dict[str, float]] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            by_step[int(record["step"])] = record
        except (ValueError, KeyError, TypeError):
            print(f"{path}:{number}: not a JSON record with a step; line left out", file=sys.stderr)
    entropy = [(step, r["actor/entropy"]) for step, r in sorted(by_step.items()) if "actor/entropy" in r]
    step_kl = [r["actor/step_kl"] for r in by_step.values() if "actor/step_kl" in r]
    out = {}
    if entropy:
        last = entropy[-1][0]
        quarter = [float(v) for step, v in entropy if step > 0.75 * last]
        out[LAST_ENTROPY] = repr(sum(quarter) / len(quarter))
    if step_kl:
        out[MAX_STEP_KL] = repr(max(float(v) for v in step_kl))
    return out


# ---------------------------------------------------------------------------------------------- pooled

COMPARISONS: tuple[tuple[str, Cell, Cell], ...] = (
    ("sensitivity: GRPO G16 - G4", grpo(16), grpo(4)),
    ("EBPO (arm a) - GRPO, G = 4", Cell(A, "ebpo", 4), grpo(4)),
    ("EBPO (arm a) - GRPO, G = 16", Cell(A, "ebpo", 16), grpo(16)),
    ("DAPO (arm b) - GRPO, G = 4", Cell(B, "dapo", 4), grpo(4)),
)
"""The comparisons of docs/results/defaults/README.md section 4, all at fixed prompts."""


def pooled(paths: Sequence[str]) -> int:
    runs, dropped = union(paths)
    m = Matrix(runs)
    print("## Pooled comparisons (docs/results/defaults/README.md, section 4)\n")
    print(
        f"{len(runs)} rows from {len(paths)} CSV{'s' * (len(paths) > 1)} "
        f"({', '.join(f'`{portable_path(p)}`' for p in paths)}), {dropped} rows listed twice counted once; seeds "
        f"{seed_text(m.seeds())}. Paired by seed over the seeds both cells have; Δ and 95% interval in points.\n"
    )
    print("| comparison | metric | seeds | n | Δ ± half-width | 95% interval | excludes 0 |")
    print("|---|---|---|---|---|---|---|")
    absent: list[str] = []
    sensitivity: list[MeanCI] = []
    for name, cell, reference in COMPARISONS:
        absent += [c.label for c in (cell, reference) if not m.has(c) and c.label not in absent]
        for column, metric in (("pass1", "test Pass@1"), ("auc", "validation AUC")):
            a, b = m.values(cell, column), m.values(reference, column)
            for label, seeds in (("all", None), *SEED_GROUPS):
                paired = sorted(s for s in set(a) & set(b) if seeds is None or s in seeds)
                ci = paired_ci({s: a[s] for s in paired}, {s: b[s] for s in paired})
                if seeds is None or paired != list(seeds):
                    label = f"{label} ({seed_text(paired)})"
                print(f"| {name} | {metric} | {label} | {ci.n} | {interval(ci)} |")
                if cell == COMPARISONS[0][1] and seeds is None:
                    sensitivity.append(ci)
    if any(ci.excludes_zero for ci in sensitivity):
        verdict = "PASS"
    else:
        verdict = "FAIL" if any(ci.n >= 2 for ci in sensitivity) else "NOT MEASURED"
    print(
        f"\nSensitivity check over all seeds: **{verdict}** (the benchmark's rule: the interval of G16 - G4 "
        "excludes 0 on test Pass@1 or on validation AUC; section 4: if it fails, no estimator verdict is claimed)."
    )
    if absent:
        print(f"\nNot in the CSVs: {'; '.join(absent)}.")
    return 0


def interval(ci: MeanCI) -> str:
    """``Δ ± half | [low, high] | yes/no`` in points; dashes without an interval."""
    if ci.n < 2 or math.isnan(ci.half_width):
        return f"{ci.format(100.0, 1, signed=True)} | - | -"
    low, high = 100 * (ci.mean - ci.half_width), 100 * (ci.mean + ci.half_width)
    return f"{ci.format_difference()} | [{low:+.2f}, {high:+.2f}] | {'yes' if ci.excludes_zero else 'no'}"


def main(argv: list[str]) -> int:
    try:
        if len(argv) == 2 and argv[0] == "claims":
            return claims(argv[1], None)
        if len(argv) == 4 and argv[0] == "claims" and argv[2] == "--runs":
            return claims(argv[1], argv[3])
        if len(argv) >= 2 and argv[0] == "pooled":
            return pooled(argv[1:])
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(__doc__)
    return 2


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head`: end as a shell tool does when its reader exits
    sys.exit(main(sys.argv[1:]))
