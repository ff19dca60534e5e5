"""Command line of the learning benchmark: ``python -m benchmarks.learning [mode] [flags]``.

Modes: (none) run the matrix, then write the report; ``--plan`` count the cells and runs and project the
time; ``--dry-run`` list every run and its status; ``--estimate`` only the projection; ``--report-only``
tables and plots from the finished runs; ``--select-options`` run the EBPO option candidates on the
selection seeds and write the leader, which ``ebpo-best`` runs when its lead over the paper's options is resolved. ``--quick`` is a smoke matrix of a few
minutes. Only running builds the base model; the other modes read configs and result files.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.learning import matrix, report
from benchmarks.learning.methods import (
    ARMS,
    CONFIGS,
    ESTIMATORS,
    OPTION_CANDIDATES,
    PAPER_OPTIONS,
    REPO,
    SELECTION_SEEDS,
    Selection,
    check_disjoint,
    model_identity,
    read_selection,
    select_best,
)
from benchmarks.learning.run import LOG_FILE, add_answer_kinds, load_results, run_dir, write_json_atomic
from benchmarks.learning.spec import FIXED_PROMPTS, VARIANTS, Budget, model_path_from
from benchmarks.learning.testbeds import DEFAULT_TESTBED, TESTBEDS, Testbed, get_testbed
from ebpo import console
from ebpo.plugins import HELP as PLUGINS_HELP
from ebpo.plugins import load_plugins

DEFAULTS: dict[str, Any] = {
    "groups": [4, 8, 16],
    "seeds": [0, 1, 2, 3, 4],
    "headline": 4,
    "sensitivity": [4, 16],
    "sweep": ["grpo", "estimators/ebpo", "estimators/ebpo-best"],
    "threshold": 10.0,
}
"""Matrix defaults not taken from src/ebpo/configs/ebpo.yaml (steps, prompts per step, lr, validation size and
cadence are). ``sweep``: the methods run at every G and budget variant; sized so that the matrix fits 2 hours
on 2 cores with the shipped base model at ebpo.yaml's sizes (docs/benchmarks.md has the measured times)."""

QUICK: dict[str, Any] = {
    "methods": ["grpo", "estimators/ebpo", "estimators/ebpo-prior", "published/entropymech-clip-cov"],
    "sweep": ["grpo"],
    "groups": [4, 16],
    "seeds": [0, 1],
    "steps": 6,
    "prompts": 8,
    "responses": 64,
    "updates": 2,
    "eval_every": 3,
    "val_size": 45,
    "eval_n": 4,
    "test_size": 90,
    "test_n": 4,
}
"""``--quick``: GRPO in both arms at G 4 and 16 under both budget variants (the sensitivity check), EBPO,
EBPO normalize=prior and Clip-Cov at the headline cell; 2 seeds, 6 steps. Explicit flags still win."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.learning",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Design and sizing: docs/benchmarks.md. Results: docs/results/README.md.",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--plan", action="store_true", help="print the number of cells and runs and the projected time"
    )
    mode.add_argument(
        "--dry-run", action="store_true", help="list every planned run and its status; run nothing"
    )
    mode.add_argument("--estimate", action="store_true", help="print the projected time of the planned runs")
    mode.add_argument(
        "--report-only", action="store_true", help="only write tables and plots from finished runs"
    )
    p.add_argument(
        "--select-options",
        action="store_true",
        help=f"the selection matrix instead: the EBPO candidates ({', '.join(OPTION_CANDIDATES)}) in arm (a) at "
        f"the headline cell on the selection seeds (default {' '.join(map(str, SELECTION_SEEDS))}); running it "
        "(or --report-only) writes the one with the highest validation AUC to --best-file, which the matrix "
        "runs as ebpo-best only if its lead over ebpo (paired by seed) has a 95%% interval above 0",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke matrix of a few minutes: GRPO in both arms at G 4 and 16 under both budget variants, EBPO, "
        "EBPO normalize=prior and Clip-Cov at the headline cell; seeds 0 1, 6 steps (explicit flags win)",
    )

    d = p.add_argument_group("design (which cells)")
    d.add_argument("--arms", nargs="+", choices=ARMS, default=None, help=f"arms (default: {' '.join(ARMS)})")
    d.add_argument(
        "--methods",
        nargs="+",
        default=None,
        help="methods: NAME (every arm with it) or ARM/NAME (default: every row); in arm (a) also any registered "
        "estimator as NAME or NAME:KEY=VALUE,... (ebpo diagnose's spelling), yours through --plugins",
    )
    d.add_argument(
        "--sweep",
        nargs="*",
        default=None,
        help="methods that run at every G and budget variant (others: the headline cell only); 'all', or no "
        f"names for none (default {' '.join(DEFAULTS['sweep'])})",
    )
    d.add_argument(
        "--groups", nargs="+", type=int, default=None, help=f"G of the sweep (default {DEFAULTS['groups']})"
    )
    d.add_argument(
        "--budgets",
        nargs="+",
        choices=VARIANTS,
        default=None,
        help="budget variants of the sweep (default both)",
    )
    d.add_argument(
        "--headline-group",
        type=int,
        default=None,
        help=f"G of the headline cell (default {DEFAULTS['headline']})",
    )
    d.add_argument(
        "--seeds", nargs="+", type=int, default=None, help=f"reported seeds (default {DEFAULTS['seeds']})"
    )
    d.add_argument(
        "--sensitivity-groups",
        nargs=2,
        type=int,
        default=None,
        help=f"the two G of the GRPO sensitivity check (default {DEFAULTS['sensitivity']})",
    )
    d.add_argument("--no-sensitivity", action="store_true", help="leave the sensitivity check out")

    d.add_argument(
        "--testbed",
        choices=TESTBEDS.names(),
        default=DEFAULT_TESTBED,
        help="base model and task: s1 = the arith base model on arith (ebpo.yaml's); s2 = the gym base model "
        "(Qwen3, BPE, ChatML) on its reasoning-gym mixture, tested on the mixture's test split, pages in "
        f"docs/results/gym and tags prefixed s2_ by default (default {DEFAULT_TESTBED})",
    )

    b = p.add_argument_group("budget (sizes of each run; unset = src/ebpo/configs/ebpo.yaml's value)")
    b.add_argument("--steps", type=int, default=None, help="training steps per run (run.steps)")
    b.add_argument(
        "--prompts", type=int, default=None, help="P: prompts per step, fixed-prompts (data.batch_size)"
    )
    b.add_argument(
        "--responses", type=int, default=None, help="R: responses per step, equal-responses (P x G)"
    )
    b.add_argument(
        "--updates", type=int, default=None, help="optimizer updates per step (batch / mini-batch)"
    )
    b.add_argument("--lr", type=float, default=None, help="learning rate of every method (optim.lr)")
    b.add_argument(
        "--max-new-tokens", type=int, default=None, help="response length (rollout.max_new_tokens)"
    )
    b.add_argument(
        "--eval-every", type=int, default=None, help="validation cadence in steps (run.eval_every)"
    )
    b.add_argument("--save-every", type=int, default=None, help="checkpoint cadence (default: --eval-every)")
    b.add_argument("--val-size", type=int, default=None, help="validation problems (data.val_size)")
    b.add_argument("--eval-n", type=int, default=None, help="validation samples per problem (run.eval_n)")
    b.add_argument("--test-size", type=int, default=None, help="first N arith test problems (default all)")
    b.add_argument("--test-n", type=int, default=None, help="test samples per problem (default 8)")
    b.add_argument(
        "--test-best", action="store_true", help="also test the paper's checkpoint (best validation maj@k)"
    )
    b.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    b.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a trainer override every run takes (repeatable); settings at the trainer's earlier defaults "
        "leave run keys unchanged, e.g. the exact log-prob paths: --set rollout.old_logp=recompute "
        "--set run.step_kl=all --set optim.shared_prompts=false",
    )
    b.add_argument(
        "--model-path",
        default=None,
        help="initial policy (default: the testbed's; s1: src/ebpo/configs/ebpo.yaml's model)",
    )
    b.add_argument(
        "--configs-dir",
        default=None,
        help="read the presets from here (default: the shipped presets, src/ebpo/configs/)",
    )

    b.add_argument(
        "--plugins",
        action="append",
        default=[],
        metavar="NAME",
        help=f"{PLUGINS_HELP}; every run imports them too (run.plugins)",
    )

    o = p.add_argument_group("execution and output")
    o.add_argument("--jobs", type=int, default=2, help="runs side by side, one process each (default 2)")
    o.add_argument(
        "--tag",
        default=None,
        help="name in file names (default matrix, quick or options; prefixed with the testbed's, e.g. s2_matrix)",
    )
    o.add_argument("--runs-dir", default=None, help="run directories (default runs/bench_learning/<tag>)")
    o.add_argument(
        "--results-dir",
        default=None,
        help="tables, CSV, plots (default the testbed's: docs/results, s2: docs/results/gym)",
    )
    o.add_argument(
        "--best-file",
        default=None,
        help="the selection of ebpo-best (default <results-dir>/ebpo_best_options.json); without one, or with "
        "one whose leader is not resolved, the matrix has no ebpo-best row",
    )
    o.add_argument(
        "--estimate-from",
        default=None,
        help="runs whose CPU seconds --plan/--estimate use (default --runs-dir)",
    )
    o.add_argument(
        "--threshold",
        type=float,
        default=None,
        help=f"points above step 0 for steps-to-threshold (default {DEFAULTS['threshold']})",
    )
    o.add_argument("--keep-checkpoints", action="store_true", help="keep the checkpoints of finished runs")
    return p


def _pick(args: argparse.Namespace, name: str, default: Any = None) -> Any:
    """A flag's value, else ``--quick``'s, else ``default``."""
    value = getattr(args, name)
    if value is not None:
        return value
    return QUICK.get(name, default) if args.quick else default


def budget_from(args: argparse.Namespace) -> Budget:
    """The sizes of every run; its settings are the testbed's (its task), then ``--set``'s."""
    names = ("steps", "prompts", "responses", "updates", "lr", "max_new_tokens", "eval_every", "save_every")
    names += ("val_size", "eval_n", "test_size")
    return Budget(
        **{name: _pick(args, name) for name in names},
        test_n=_pick(args, "test_n", 8),
        test_best=args.test_best,
        threads=args.threads,
        settings=get_testbed(args.testbed).settings() + tuple(args.settings),
    )


def design_from(args: argparse.Namespace) -> matrix.Design:
    if args.select_options:
        return matrix.Design(
            arms=(ESTIMATORS,),
            methods=tuple(args.methods or OPTION_CANDIDATES),
            groups=(_pick(args, "headline_group", DEFAULTS["headline"]),),
            variants=(FIXED_PROMPTS,),
            seeds=tuple(args.seeds or SELECTION_SEEDS),
            headline=_pick(args, "headline_group", DEFAULTS["headline"]),
            sweep=(),
            sensitivity=None,
        )
    sweep = _pick(args, "sweep", DEFAULTS["sweep"])
    sensitivity = _pick(args, "sensitivity_groups", DEFAULTS["sensitivity"])
    return matrix.Design(
        arms=tuple(args.arms or ARMS),
        methods=tuple(_pick(args, "methods")) if _pick(args, "methods") else None,
        groups=tuple(_pick(args, "groups", DEFAULTS["groups"])),
        variants=tuple(args.budgets or VARIANTS),
        seeds=tuple(_pick(args, "seeds", DEFAULTS["seeds"])),
        headline=_pick(args, "headline_group", DEFAULTS["headline"]),
        sweep=None if "all" in sweep else tuple(sweep),
        sensitivity=None if args.no_sensitivity else tuple(sensitivity),
    )


def testbed_model(testbed: Testbed, configs: Path, given: str | None) -> str:
    """The initial policy of every run: ``--model-path``, else the testbed's base model, else (s1)
    ``src/ebpo/configs/ebpo.yaml``'s (:func:`model_path_from`). Nothing is built here."""
    if given is None and testbed.model is not None:
        return testbed.model()
    return model_path_from(configs, given)


def ensure_model(model_path: str, testbed: Testbed | None = None) -> None:
    """Build the testbed's base model (s1: the built-in one) once, before any run, if it is the one asked for
    and missing."""
    from ebpo.models.build import build_base_model, default_base_model_path

    if Path(model_path).exists():
        return
    if testbed is not None and testbed.model is not None and testbed.build is not None:
        if model_path == testbed.model():
            testbed.build()
            return
    if model_path == str(default_base_model_path()):
        build_base_model()
        return
    raise ValueError(
        f"model {model_path} does not exist; pass --model-path or set model.path in src/ebpo/configs/ebpo.yaml"
    )


def describe(plan: matrix.Plan, root: Path, budget: Budget, testbed: Testbed | None = None) -> list[str]:
    """The plan in a few lines: cells, distinct runs, finished, the testbed, the resolved budget (the testbed's
    own settings named by the testbed, not spelled out)."""
    from benchmarks.learning.run import read_result

    testbed = testbed or get_testbed(DEFAULT_TESTBED)
    own = testbed.settings()
    settings = budget.settings[len(own) :] if budget.settings[: len(own)] == own else budget.settings

    runs = plan.runs
    done = sum(read_result(root, spec) is not None for spec in runs)
    by_block: dict[str, int] = {}
    for cell in sorted(plan.cells):
        block = f"{cell.arm} {cell.variant} G={cell.group_size}"
        by_block[block] = by_block.get(block, 0) + 1
    return [
        f"{len(plan.cells)} cells, {len(runs)} distinct runs ({done} finished, {len(runs) - done} to run) in {root}",
        f"testbed {testbed.name}: {testbed.title}",
        "cells per block: " + ", ".join(f"{k}: {v}" for k, v in by_block.items()),
        f"budget per run: {budget.steps} steps, P = {budget.prompts} prompts (fixed-prompts), R = {budget.responses} "
        f"responses (equal-responses), {budget.updates} updates per step, lr {budget.lr}, <= {budget.max_new_tokens} "
        f"tokens, validation {budget.val_size} x {budget.eval_n} every {budget.eval_every} steps, test "
        f"{budget.test_size or 'all'} x {budget.test_n}"
        + (f"; every run also {' '.join(settings)}" if settings else ""),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    console.setup()  # the library's messages (the base model's build) as the ebpo commands show them
    args = build_parser().parse_args(argv)
    command = "python -m benchmarks.learning " + shlex.join(list(sys.argv[1:] if argv is None else argv))
    try:
        return _main(args, command)
    except ValueError as err:  # ConfigError is a ValueError: one line (EBPO_DEBUG=1: its traceback before it)
        console.show_traceback(err)
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "interrupted: finished runs are kept, runs in flight continue from their last checkpoint; "
            "run the same command again to go on",
            file=sys.stderr,
        )
        return 130


def _main(args: argparse.Namespace, command: str) -> int:
    plugins = load_plugins(args.plugins)  # before any method or estimator name is looked up
    if plugins:  # and in every run's process (the matrix spawns them)
        args.settings = [*args.settings, f"run.plugins={json.dumps(plugins)}"]
    configs = Path(args.configs_dir) if args.configs_dir else CONFIGS
    testbed = get_testbed(args.testbed)
    mode = "options" if args.select_options else "quick" if args.quick else "matrix"
    tag = args.tag or testbed.tag_prefix + mode
    root = Path(args.runs_dir) if args.runs_dir else REPO / "runs" / "bench_learning" / tag
    results_dir = Path(args.results_dir) if args.results_dir else REPO / testbed.results_dir
    best_file = Path(args.best_file) if args.best_file else results_dir / "ebpo_best_options.json"
    budget = budget_from(args).resolve(configs)
    design = design_from(args)
    model_path = testbed_model(testbed, configs, args.model_path)
    if args.select_options:
        check_disjoint(tuple(DEFAULTS["seeds"]), design.seeds)
        if PAPER_OPTIONS not in {name.rpartition("/")[2] for name in design.methods or ()}:
            raise ValueError(
                f"--select-options measures each candidate against {PAPER_OPTIONS} (the paper's options): "
                f"add it to --methods"
            )
    selection = None if args.select_options else read_selection(best_file)
    plan = matrix.plan(design, budget, model_path=model_path, configs=configs, selection=selection)
    threshold = _pick(args, "threshold", DEFAULTS["threshold"]) / 100

    if args.dry_run or args.plan or args.estimate:
        if args.dry_run:
            _print_runs(plan, root)
        if not args.estimate:
            print("\n".join(describe(plan, root, budget, testbed)))
        source = Path(args.estimate_from) if args.estimate_from else root
        try:
            costs = matrix.fit_costs(load_results(source).values())
        except ValueError as err:
            if args.estimate:
                raise ValueError(f"{err}; looked in {source} (--estimate-from)") from None
            print(f"projected time: no finished runs in {source} to estimate from (--estimate-from DIR)")
            return 0
        from benchmarks.learning.run import read_result

        pending = [spec for spec in plan.runs if read_result(root, spec) is None]
        print("all planned runs: " + matrix.estimate(plan.runs, costs, args.jobs).text())
        print("still to run:     " + matrix.estimate(pending, costs, args.jobs).text())
        return 0

    if not args.report_only:
        ensure_model(model_path, testbed)
        outcome = matrix.run_matrix(
            plan.runs, root, jobs=args.jobs, keep_checkpoints=args.keep_checkpoints, command=command, tag=tag
        )
        print(
            f"matrix wall time {outcome.wall_s / 60:.1f} min: {outcome.finished} runs finished, "
            f"{len(outcome.failed)} failed, {outcome.already_done} were already done"
        )
    results = load_results(root)
    add_answer_kinds(results, root)
    rows = [
        report.Row(cell, results[spec.key])
        for cell, spec in zip(plan.cells, plan.specs)
        if spec.key in results
    ]
    best_how = plan.best_how
    if args.select_options:
        names = [name.rpartition("/")[2] for name in design.methods or OPTION_CANDIDATES]
        scores = {name: report.by_seed(rows, "auc", method=name) for name in names}
        leader, resolved, how = select_best({name: values for name, values in scores.items() if values})
        chosen = Selection(
            leader,
            how,
            design.seeds,
            report.portable_path(model_path, "model-path"),
            report.portable_command(command),
            model_identity(model_path),
            resolved,
        )
        write_json_atomic(best_file, chosen.to_dict())
        best_how = f"**Selection**: {how}"
        verdict = f"ebpo-best = {leader}" if resolved else "no resolved winner (no ebpo-best row)"
        print(f"{verdict}: {how}\nwrote {best_file}")
    for path in report.write_report(
        rows,
        results_dir,
        tag,
        command=command,
        missing=len(plan.cells) - len(rows),
        headline=design.headline,
        sensitivity_pair=design.sensitivity,
        threshold=threshold,
        sessions=matrix.read_sessions(root, tag),
        best_how=best_how,
    ):
        print(f"wrote {path}")
    failed = not args.report_only and outcome.failed
    return 1 if failed else 0


def _print_runs(plan: matrix.Plan, root: Path) -> None:
    from benchmarks.learning.run import read_result

    cells_of: dict[str, list[str]] = {}
    for cell, spec in zip(plan.cells, plan.specs):
        cells_of.setdefault(spec.key, []).append(cell.label)
    for spec in plan.runs:
        directory = run_dir(root, spec)
        status = (
            "done" if read_result(root, spec) else "partial" if (directory / LOG_FILE).exists() else "to run"
        )
        also = f" (also {', '.join(cells_of[spec.key][1:])})" if len(cells_of[spec.key]) > 1 else ""
        print(f"{spec.key} {status:<7} {cells_of[spec.key][0]}{also}")
