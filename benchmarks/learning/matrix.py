"""Planning a matrix (its cells and the distinct runs behind them), running it, and projecting its time.

Plan. Per seed (seed-major, so a partial matrix already holds whole seeds): the sensitivity check (the
published GRPO at two group sizes, fixed prompts per step), then every method of every arm: a *sweep*
method at every G of every budget variant, any other method at the headline cell (fixed prompts, the
headline G, the layout of the paper's Table 1). Cells that resolve to the same config share one run.

Run. Runs without a finished result are executed ``jobs`` at a time, each in its own process
(``concurrent.futures.ProcessPoolExecutor``, spawned: a forked torch process can hang in its thread pool),
handed out one by one as workers free up, so that Ctrl-C stops the matrix after the runs in flight; a
failed run is reported and the others go on. An invocation locks the runs directory (a second one is
refused with one line). Every invocation records its wall time in ``<runs-dir>/sessions.jsonl`` after each
run and as it ends, and once as it starts (a killed one's up to its last finished run, or its start): the
matrix wall time is their sum, the sum of run times is not.

Estimate. CPU seconds of finished runs are split into a fixed cost per run, training (per training
response, by cost class) and sampling (per validation or test answer); a planned run costs its responses
and answers at those rates, and the wall time on an idle machine with ``jobs`` single-threaded workers is the makespan of
handing the runs, in plan order, to the first free worker.
"""

from __future__ import annotations

import json
import multiprocessing
import shlex
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.learning.methods import (
    ARM_METHODS,
    ARMS,
    BEST,
    CONFIGS,
    ESTIMATOR_SPEC,
    ESTIMATORS,
    PUBLISHED,
    Method,
    Selection,
    best_method,
    check_disjoint,
    get_method,
    is_estimator_method,
    list_methods,
    resolve_values,
)
from benchmarks.learning.run import execute_logged, read_result
from benchmarks.learning.spec import (
    FIXED_PROMPTS,
    VARIANTS,
    Budget,
    Cell,
    RunSpec,
    build_spec,
    spec_from_dict,
)
from ebpo.persist import DirectoryLock

SESSIONS_FILE = "sessions.jsonl"
SENSITIVITY_METHOD = (PUBLISHED, "grpo")
"""The sensitivity check compares this method with itself at two group sizes."""


@dataclass(frozen=True)
class Design:
    """Which cells a matrix holds (the sizes of each run are the :class:`~benchmarks.learning.spec.Budget`).

    Attributes:
        arms: the arms to run.
        methods: names (``grpo``: every chosen arm that has it) or ``arm/name``; None = every arm's rows.
        groups: the group sizes of the sweep.
        variants: the budget variants of the sweep (fixed prompts, equal responses).
        seeds: the reported seeds (paired across methods).
        headline: G of the headline cell (fixed prompts), where non-sweep methods run.
        sweep: the methods (as in ``methods``) that run at every G and variant; None = all of them.
        sensitivity: the two G of the GRPO sensitivity check (fixed prompts), or None to skip it.
    """

    arms: tuple[str, ...] = ARMS
    methods: tuple[str, ...] | None = None
    groups: tuple[int, ...] = (4, 8, 16)
    variants: tuple[str, ...] = VARIANTS
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    headline: int = 4
    sweep: tuple[str, ...] | None = None
    sensitivity: tuple[int, int] | None = (4, 16)

    def __post_init__(self) -> None:
        bad = [arm for arm in self.arms if arm not in ARMS] + [v for v in self.variants if v not in VARIANTS]
        if bad:
            raise ValueError(
                f"unknown arm or budget variant {bad}; arms: {', '.join(ARMS)}; variants: {', '.join(VARIANTS)}"
            )
        if any(g < 2 for g in (*self.groups, self.headline, *(self.sensitivity or ()))):
            raise ValueError("every group size must be >= 2 (a group-relative baseline needs two responses)")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct and at least one, got {list(self.seeds)}")


def _select(arms: Sequence[str], names: Sequence[str] | None) -> list[tuple[str, str]]:
    """(arm, name) pairs in table order for ``names`` (bare or ``arm/name``); None = every arm's rows."""
    if names is None:
        return [(arm, name) for arm in arms for name in ARM_METHODS[arm]]
    chosen = []
    for given in names:
        arm_given, _, name = given.rpartition("/")
        hits = [
            arm
            for arm in arms
            if (not arm_given or arm == arm_given)
            and (name in list_methods(arm) or is_estimator_method(arm, name))
        ]
        if not hits:
            valid = "; ".join(f"{arm}: {', '.join(list_methods(arm))}" for arm in arms)
            raise ValueError(
                f"unknown method {given!r} in arms {list(arms)}; valid: {valid}; in {ESTIMATORS}, also a "
                f"registered estimator as {ESTIMATOR_SPEC} (yours: --plugins)"
            )
        chosen += [(arm, name) for arm in hits if (arm, name) not in chosen]
    order = {(arm, name): (arms.index(arm), i) for arm in arms for i, name in enumerate(list_methods(arm))}
    last = len(order)  # rows built on a registered estimator: after the arm's own, in the order given
    return sorted(chosen, key=lambda pair: order.get(pair, (arms.index(pair[0]), last + chosen.index(pair))))


@dataclass
class Plan:
    """The cells of a matrix and their runs (``cells[i]`` runs ``specs[i]``; equal keys are one run)."""

    cells: list[Cell]
    specs: list[RunSpec]
    best_how: str = ""

    @property
    def runs(self) -> list[RunSpec]:
        """The distinct runs, in plan order."""
        seen: dict[str, RunSpec] = {}
        for spec in self.specs:
            seen.setdefault(spec.key, spec)
        return list(seen.values())

    def spec_of(self, cell: Cell) -> RunSpec:
        return self.specs[self.cells.index(cell)]


def plan(
    design: Design,
    budget: Budget,
    *,
    model_path: str,
    configs: Path = CONFIGS,
    selection: Selection | None = None,
) -> Plan:
    """The matrix of ``design`` under ``budget`` (resolved here from ``src/ebpo/configs/ebpo.yaml``). Refuses
    reported seeds that selected ``ebpo-best``, and budget variants a G does not divide. Without a resolved
    selection the default rows leave ``ebpo-best`` out (``best_how`` says why); naming it is an error."""
    budget = budget if budget.resolved else budget.resolve(configs)
    pairs = _select(design.arms, design.methods)
    sweep = set(pairs if design.sweep is None else _select(design.arms, design.sweep))
    methods: dict[tuple[str, str], Method] = {}
    best_how = ""
    for arm, name in pairs + [SENSITIVITY_METHOD]:
        if name != BEST:
            methods[(arm, name)] = get_method(arm, name)
            continue
        best, best_how = best_method(selection, model_path)
        if best is None and design.methods is not None:
            raise ValueError(
                f"{arm}/{BEST} was asked for, but {best_how.removeprefix('no `ebpo-best` row: ')}; "
                "name the options to run instead (estimators/ebpo, estimators/ebpo-pooled, ...)"
            )
        if best is None:
            pairs = [pair for pair in pairs if pair != (arm, name)]
            continue
        methods[(arm, name)] = best
        if selection is not None:
            check_disjoint(tuple(design.seeds), selection.seeds)
    for variant in design.variants:  # fail before any run if a G does not divide the budget
        for G in design.groups:
            budget.prompts_per_step(variant, G)
    cells: list[Cell] = []
    for seed in design.seeds:
        if design.sensitivity is not None:
            cells += [Cell(*SENSITIVITY_METHOD, FIXED_PROMPTS, G, seed) for G in design.sensitivity]
        for arm, name in pairs:
            if (arm, name) in sweep:
                cells += [Cell(arm, name, v, G, seed) for v in design.variants for G in design.groups]
            else:
                cells.append(Cell(arm, name, FIXED_PROMPTS, design.headline, seed))
    cells = list(dict.fromkeys(cells))
    values = {pair: resolve_values(method, configs) for pair, method in methods.items()}
    specs = [
        build_spec(
            methods[(c.arm, c.method)],
            c.variant,
            c.group_size,
            c.seed,
            budget,
            model_path,
            values[(c.arm, c.method)],
            configs,
        )
        for c in cells
    ]
    return Plan(cells, specs, best_how)


# ---------------------------------------------------------------------------------------------------
# running


@dataclass(frozen=True)
class Outcome:
    """What one invocation of :func:`run_matrix` did."""

    planned: int
    already_done: int
    finished: int
    failed: dict[str, str]
    wall_s: float


def run_matrix(
    runs: Sequence[RunSpec],
    root: Path,
    *,
    jobs: int = 1,
    keep_checkpoints: bool = False,
    command: str = "",
    tag: str = "",
    log: Callable[[str], None] = print,
    worker: Callable[[RunSpec, str, bool, str], tuple[str, str]] = execute_logged,
) -> Outcome:
    """Execute every run of ``runs`` without a finished result, ``jobs`` at a time (1: in this process);
    record this invocation (its command, ``tag`` and wall time so far) in ``<root>/sessions.jsonl`` as it
    starts, after each run and as it ends. A kill loses at most the runs in flight, which continue from their last checkpoint when
    the same command is run again."""
    root = Path(root)
    with DirectoryLock(
        root,
        what="benchmark runs directory",
        hint="two invocations would run the same runs twice; wait for it, or give this one another --runs-dir",
    ):
        return _run_pending(runs, root, jobs, keep_checkpoints, command, tag, log, worker)


def _run_pending(
    runs: Sequence[RunSpec],
    root: Path,
    jobs: int,
    keep_checkpoints: bool,
    command: str,
    tag: str,
    log: Callable[[str], None],
    worker: Callable[[RunSpec, str, bool, str], tuple[str, str]],
) -> Outcome:
    pending = [spec for spec in runs if read_result(root, spec) is None]
    log(
        f"{len(runs)} runs planned, {len(runs) - len(pending)} finished, {len(pending)} to run, {jobs} at a time"
    )
    started, started_utc = time.perf_counter(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    finished, failed = 0, {}
    session_id = uuid.uuid4().hex

    def record(ended: bool) -> None:
        """Append this invocation's record as it stands; the last record of an ``id`` is the one read, so a
        SIGKILL loses at most the time since the invocation started or its last run finished."""
        session = {
            "id": session_id,
            "command": command,
            "tag": tag,
            "started_utc": started_utc,
            "wall_s": round(time.perf_counter() - started, 1),
            "jobs": jobs,
            "planned": len(runs),
            "to_run": len(pending),
            "finished": finished - len(failed),
            "failed": len(failed),
            "ended": ended,
        }
        with open(root / SESSIONS_FILE, "a") as handle:
            handle.write(json.dumps(session) + "\n")

    def report(spec: RunSpec, error: str) -> None:
        nonlocal finished
        finished += 1
        if error:
            failed[spec.key] = error
            status = f"FAILED: {error}"
        else:
            result = read_result(root, spec) or {}
            t = result.get("timing", {})
            cpu = t.get("train_cpu_s", 0.0) + t.get("test_cpu_s", 0.0)
            status = f"test pass@1 {result['test']['pass@1']:.3f}, {cpu:.0f} CPU s"
        elapsed = time.perf_counter() - started
        log(f"[{finished}/{len(pending)}] {spec.label} {spec.key}: {status} (matrix at {elapsed:.0f} s)")
        record(ended=False)

    record(ended=False)  # before the first run: a kill during it still leaves the invocation on record
    try:
        if jobs <= 1:
            for spec in pending:
                report(spec, worker(spec, str(root), keep_checkpoints, command)[1])
        else:
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
                queue, running = list(pending), {}
                while queue or running:
                    while (
                        queue and len(running) < jobs
                    ):  # never more queued than running: a Ctrl-C stops here
                        spec = queue.pop(0)
                        running[pool.submit(worker, spec, str(root), keep_checkpoints, command)] = spec
                    done, _ = wait(running, return_when=FIRST_COMPLETED)
                    for future in done:
                        spec = running.pop(future)
                        try:
                            error = future.result()[1]
                        except Exception as err:  # noqa: BLE001 - a worker that died (killed, out of memory)
                            error = f"worker died: {type(err).__name__}: {err}"
                        report(spec, error)
    finally:
        record(ended=True)
    wall = time.perf_counter() - started
    return Outcome(len(runs), len(runs) - len(pending), finished - len(failed), failed, wall)


def session_tag(session: dict[str, Any]) -> str:
    """The ``--tag`` of a recorded invocation: its ``tag`` field, or for a record without one, read from its
    command (``--tag X``, else the mode's default: options, quick or matrix)."""
    if session.get("tag"):
        return str(session["tag"])
    words = shlex.split(str(session.get("command", "")))
    if "--tag" in words[:-1]:
        return words[words.index("--tag") + 1]
    return "options" if "--select-options" in words else "quick" if "--quick" in words else "matrix"


def read_sessions(root: Path, tag: str | None = None) -> list[dict[str, Any]]:
    """The invocations recorded in ``<root>/sessions.jsonl`` (a torn line is skipped), one per invocation: the
    last record of each ``id`` (an invocation appends one after each run and one as it ends; ``ended`` false
    in the last means it was killed), each record without an ``id`` on its own. With ``tag``, only those of
    that ``--tag`` (several designs may share one runs directory, and their runs)."""
    path = Path(root) / SESSIONS_FILE
    if not path.is_file():
        return []
    by_id: dict[Any, dict[str, Any]] = {}
    for number, line in enumerate(path.read_text().splitlines()):
        try:
            session = json.loads(line)
        except json.JSONDecodeError:
            continue
        by_id[session.get("id", number)] = session  # a later record of an id replaces it in place
    out = list(by_id.values())
    return out if tag is None else [s for s in out if session_tag(s) == tag]


# ---------------------------------------------------------------------------------------------------
# estimate


def cost_class(config: dict[str, Any]) -> str:
    """Runs that cost alike per training response: dynamic sampling samples more, a KL term runs a
    reference model."""
    a = config["algorithm"]
    if a["dynamic_sampling"]:
        return "dynamic sampling"
    return "with reference model" if a["kl_coef"] > 0 else "no reference model"


@lru_cache(maxsize=1)
def arith_test_size() -> int:
    """Problems in the ``arith`` test set (what ``test["size"] = None`` means)."""
    from ebpo.eval import get_benchmark

    return len(get_benchmark("arith").load())


@dataclass(frozen=True)
class CostModel:
    """CPU seconds of a run: a fixed cost (loading, first validation, ...), a rate per training response (by
    :func:`cost_class`) and a rate per sampled validation or test answer."""

    train_rate: dict[str, float]
    sample_rate: float
    fixed: float
    runs: int

    def cpu_seconds(self, spec: RunSpec) -> float:
        overall = sum(self.train_rate.values()) / len(self.train_rate)
        rate = self.train_rate.get(cost_class(spec.config), overall)
        t = spec.test_settings
        test_answers = (t["size"] or arith_test_size()) * t["n"] * (2 if t["best"] else 1)
        return self.fixed + rate * spec.train_responses + self.sample_rate * (spec.val_samples + test_answers)


def fit_costs(results: Iterable[dict[str, Any]]) -> CostModel:
    """Fit :class:`CostModel` to finished results trained in one go (a resumed run's times miss its first
    part): training CPU less validation = fixed + rate[class] x responses by least squares when the runs'
    sizes tell the two apart (a non-negative fixed cost), else rate = the mean CPU per response;
    sampling rate = validation and test CPU over their answers."""
    rows: list[tuple[str, float, float]] = []
    sample_cpu = sample_count = 0.0
    for r in results:
        t, c = r.get("timing", {}), r.get("counts", {})
        if t.get("resumed_from_step", 1) != 0 or not c.get("train_responses"):
            continue
        config = spec_from_dict(r["spec"]).config
        rows.append((cost_class(config), float(c["train_responses"]), t["train_cpu_s"] - t["val_cpu_s"]))
        sample_cpu += t["val_cpu_s"] + t["test_cpu_s"]
        sample_count += c["val_samples"] + c["test_samples"]
    if not rows:
        raise ValueError("no finished runs trained in one go to estimate from (run --quick first)")
    classes = sorted({name for name, _, _ in rows})
    x = np.array([[1.0] + [n if name == k else 0.0 for k in classes] for name, n, _ in rows])
    y = np.array([cpu for _, _, cpu in rows])
    fixed, rates = 0.0, {}
    if np.linalg.matrix_rank(x) == x.shape[1]:
        coef = np.linalg.lstsq(x, y, rcond=None)[0]
        if coef[0] >= 0 and bool((coef[1:] > 0).all()):
            fixed, rates = float(coef[0]), {k: float(v) for k, v in zip(classes, coef[1:])}
    if not rates:  # too few distinct sizes to separate a fixed cost
        rates = {k: float(np.mean([cpu / n for name, n, cpu in rows if name == k])) for k in classes}
    return CostModel(rates, sample_cpu / max(sample_count, 1.0), fixed, len(rows))


@dataclass(frozen=True)
class Estimate:
    runs: int
    cpu_s: float
    wall_s: float
    jobs: int
    basis: int

    def text(self) -> str:
        return (
            f"{self.runs} runs: {self.cpu_s / 60:.1f} CPU min, projected wall time {self.wall_s / 60:.1f} min with "
            f"--jobs {self.jobs} on an idle machine (from the CPU seconds of {self.basis} finished runs)"
        )


def estimate(runs: Sequence[RunSpec], costs: CostModel, jobs: int) -> Estimate:
    """Projected CPU seconds of ``runs`` and their wall time with ``jobs`` single-threaded workers."""
    free = [0.0] * max(1, jobs)
    total = 0.0
    for spec in runs:
        cpu = costs.cpu_seconds(spec)
        total += cpu
        i = free.index(min(free))
        free[i] += cpu
    return Estimate(len(runs), total, max(free), max(1, jobs), costs.runs)
