"""The learning benchmark's plan, execution (restart after a kill, the process pool) and time estimate."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from benchmarks.learning import matrix
from benchmarks.learning.methods import ESTIMATORS, PUBLISHED, Selection
from benchmarks.learning.run import RESULT_FILE, read_result, run_dir, write_json_atomic
from benchmarks.learning.spec import EQUAL_RESPONSES, FIXED_PROMPTS, Budget, Cell
from learning_helpers import fake_result


def _plan(configs_dir, **design):
    budget = Budget(steps=10, responses=32, test_size=9).resolve(configs_dir)  # P = 8 (shared), R = 32
    return matrix.plan(matrix.Design(**design), budget, model_path="/m", configs=configs_dir)


def test_full_design_counts_by_hand(configs_dir):
    plan = _plan(configs_dir, seeds=(0, 1))
    # no selection, so no ebpo-best row: 15 rows (7 + 8) x 2 variants x 3 G = 90 cells per seed; the
    # sensitivity cells (published GRPO, fixed prompts, G 4 and 16) are two of them. Distinct runs per seed:
    # estimators/grpo = published/grpo, so 14 configs, each at fixed prompts G 4, 8, 16 and equal responses
    # G 8, 16 (R / 4 = 8 = P: the equal-responses G = 4 run is the fixed-prompts one): 14 x 5 = 70.
    assert len(plan.cells) == 2 * 90 and len(plan.runs) == 2 * 70
    assert [c.seed for c in plan.cells] == [0] * 90 + [1] * 90  # seed-major: a partial matrix has whole seeds
    assert plan.cells[:2] == [Cell(PUBLISHED, "grpo", FIXED_PROMPTS, G, 0) for G in (4, 16)]
    assert "ebpo-best" not in {c.method for c in plan.cells}
    assert plan.best_how.startswith("no `ebpo-best` row: no selection")  # the page says why
    shared = plan.spec_of(Cell(ESTIMATORS, "grpo", EQUAL_RESPONSES, 4, 1))
    assert shared.key == plan.spec_of(Cell(PUBLISHED, "grpo", FIXED_PROMPTS, 4, 1)).key


def test_sweep_limits_the_g_and_budget_variants_to_some_methods(configs_dir):
    plan = _plan(configs_dir, seeds=(0, 1), sweep=("grpo",))
    # per seed: GRPO in both arms at 6 cells (5 runs, shared across arms), the other 13 rows at the headline
    # cell only (fixed prompts, G = 4): 12 + 13 = 25 cells and 5 + 13 = 18 runs
    assert len(plan.cells) == 2 * 25 and len(plan.runs) == 2 * 18
    others = [c for c in plan.cells if c.method != "grpo"]
    assert {(c.variant, c.group_size) for c in others} == {(FIXED_PROMPTS, 4)}
    small = _plan(
        configs_dir, arms=(ESTIMATORS,), methods=("ebpo", "grpo"), seeds=(3,), sweep=(), sensitivity=None
    )
    assert small.cells == [Cell(ESTIMATORS, m, FIXED_PROMPTS, 4, 3) for m in ("grpo", "ebpo")]  # table order


def test_plan_refuses_unknown_methods_bad_budgets_and_selection_seeds(configs_dir):
    with pytest.raises(ValueError, match="'ppo'"):
        _plan(configs_dir, methods=("ppo",))
    with pytest.raises(ValueError, match="'published/ebpo-prior'"):
        _plan(configs_dir, methods=("published/ebpo-prior",))  # arm (a) only
    with pytest.raises(ValueError, match=r"R=\d+ .*G=6\b"):
        _plan(configs_dir, groups=(4, 6))
    with pytest.raises(ValueError, match=r"\[0, 0\]"):
        matrix.Design(seeds=(0, 0))
    budget = Budget(steps=10).resolve(configs_dir)
    selection = Selection("ebpo-prior", "test", (1, 100), "/m", "cmd", resolved=True)
    with pytest.raises(ValueError, match=r"seeds \[1\] .*ebpo-best"):
        matrix.plan(
            matrix.Design(seeds=(0, 1)), budget, model_path="/m", configs=configs_dir, selection=selection
        )
    plan = matrix.plan(
        matrix.Design(seeds=(0, 2)), budget, model_path="/m", configs=configs_dir, selection=selection
    )
    assert plan.best_how == "`ebpo-best` = ebpo-prior: test (seeds [1, 100])"
    best = plan.spec_of(Cell(ESTIMATORS, "ebpo-best", FIXED_PROMPTS, 4, 2))
    assert best.key == plan.spec_of(Cell(ESTIMATORS, "ebpo-prior", FIXED_PROMPTS, 4, 2)).key  # its options


def test_a_selection_without_a_resolved_winner_runs_the_paper_options_under_their_own_name(configs_dir):
    """The leader's lead over ebpo is not resolved: no ebpo-best row (ebpo is already a row), so the reported
    seeds may even overlap the selection's; asking for ebpo-best by name is one clear error."""
    budget = Budget(steps=10).resolve(configs_dir)
    unresolved = Selection("ebpo-pooled", "highest mean validation AUC: ...", (1, 100), "/m", "cmd")
    plan = matrix.plan(
        matrix.Design(seeds=(0, 1)), budget, model_path="/m", configs=configs_dir, selection=unresolved
    )
    methods = {c.method for c in plan.cells if c.arm == ESTIMATORS}
    assert "ebpo-best" not in methods and "ebpo-pooled" not in methods and "ebpo" in methods
    assert plan.best_how.startswith("no `ebpo-best` row: the selection found no resolved winner (highest")
    assert "`ebpo` runs the paper's options under their own name" in plan.best_how
    with pytest.raises(ValueError, match=r"^estimators/ebpo-best was asked for, but the selection found no"):
        matrix.plan(
            matrix.Design(methods=("ebpo-best",), seeds=(0,)),
            budget,
            model_path="/m",
            configs=configs_dir,
            selection=unresolved,
        )
    with pytest.raises(ValueError, match=r"^estimators/ebpo-best was asked for, but no selection was made"):
        matrix.plan(matrix.Design(methods=("estimators/ebpo-best",), seeds=(0,)), budget, model_path="/m")


# --- execution -----------------------------------------------------------------------------------------


def fake_worker(spec, root: str, keep_checkpoints: bool, command: str) -> tuple[str, str]:
    """Writes a fake result, as execute_logged would (top level: a spawned worker imports it)."""
    directory = run_dir(Path(root), spec)
    directory.mkdir(parents=True, exist_ok=True)
    if spec.overrides and "run.seed=1" in spec.overrides and "data.group_size=16" in spec.overrides:
        return spec.key, "ValueError: boom"
    write_json_atomic(directory / RESULT_FILE, fake_result(spec, 0.5, command=command))
    return spec.key, ""


def test_killed_matrix_continues_run_by_run(configs_dir, tmp_path):
    runs = _plan(configs_dir, arms=(PUBLISHED,), methods=("grpo",), seeds=(0,), sensitivity=None).runs
    assert len(runs) == 5  # fixed prompts G 4, 8, 16; equal responses G 8, 16 (its G 4 is fixed prompts' G 4)
    calls, killed = [], []

    def killed_on_third(spec, root, keep, command):
        calls.append(spec.key)
        if len(calls) == 3 and not killed:
            killed.append(spec.key)
            raise KeyboardInterrupt  # the matrix is killed during its third run
        return fake_worker(spec, root, keep, command)

    with pytest.raises(KeyboardInterrupt):
        matrix.run_matrix(runs, tmp_path, worker=killed_on_third, log=lambda _: None, command="c")
    assert calls == [s.key for s in runs[:3]]
    calls.clear()
    outcome = matrix.run_matrix(runs, tmp_path, worker=killed_on_third, log=lambda _: None, command="c")
    assert calls == [s.key for s in runs[2:]]  # the killed run again, then the rest; finished ones skipped
    assert (outcome.already_done, outcome.finished, outcome.failed) == (2, 3, {})
    sessions = matrix.read_sessions(tmp_path)  # both invocations recorded, the killed one too
    assert [s["finished"] for s in sessions] == [2, 3] and all(s["wall_s"] >= 0 for s in sessions)
    # another design sharing the runs directory: each report sums the invocations of its own tag
    matrix.run_matrix(runs, tmp_path, worker=killed_on_third, log=lambda _: None, command="c", tag="other")
    assert len(matrix.read_sessions(tmp_path)) == 3 and len(matrix.read_sessions(tmp_path, "other")) == 1
    with open(
        tmp_path / matrix.SESSIONS_FILE, "a"
    ) as handle:  # a record without a tag field: read from its command
        handle.write(
            json.dumps({"command": "python -m benchmarks.learning --tag lr1e-4 --jobs 2", "wall_s": 1.0})
        )
        handle.write("\n" + json.dumps({"command": "python -m benchmarks.learning --select-options"}) + "\n")
    assert [s["wall_s"] for s in matrix.read_sessions(tmp_path, "lr1e-4")] == [1.0]
    assert len(matrix.read_sessions(tmp_path, "options")) == 1
    # a torn result or one written under another key is not finished
    (run_dir(tmp_path, runs[0]) / RESULT_FILE).write_text('{"key": ')
    assert read_result(tmp_path, runs[0]) is None
    (run_dir(tmp_path, runs[1]) / RESULT_FILE).write_text(json.dumps({"key": "another"}))
    assert read_result(tmp_path, runs[1]) is None


@pytest.mark.parametrize("dies_in", [1, 3])
def test_a_matrix_killed_without_warning_keeps_its_time_up_to_its_last_finished_run(
    configs_dir, tmp_path, dies_in
):
    """Killed during its first run (recorded as it started) or its third (recorded after the second)."""
    runs = _plan(configs_dir, arms=(PUBLISHED,), methods=("grpo",), seeds=(0,), sensitivity=None).runs
    calls = []

    def dies_during_a_run(spec, root, keep, command):
        calls.append(spec.key)
        if len(calls) == dies_in:
            os._exit(9)  # as SIGKILL or an out-of-memory kill: no finally, no exit handler runs
        return fake_worker(spec, root, keep, command)

    pid = os.fork()
    if pid == 0:  # the matrix in a child process, which dies during run number dies_in
        try:
            matrix.run_matrix(
                runs, tmp_path, worker=dies_during_a_run, log=lambda _: None, command="c", tag="t"
            )
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 9
    (killed,) = matrix.read_sessions(tmp_path, "t")  # one invocation, as its last record left it
    assert (killed["finished"], killed["ended"], killed["command"]) == (dies_in - 1, False, "c")
    assert killed["wall_s"] >= 0 and killed["to_run"] == 5
    outcome = matrix.run_matrix(runs, tmp_path, worker=fake_worker, log=lambda _: None, command="c", tag="t")
    assert outcome.finished == 5 - (dies_in - 1)
    assert [(s["finished"], s["ended"]) for s in matrix.read_sessions(tmp_path, "t")] == [
        (dies_in - 1, False),
        (5 - (dies_in - 1), True),
    ]


def test_process_pool_runs_every_run_and_reports_failures(configs_dir, tmp_path):
    runs = _plan(
        configs_dir, arms=(PUBLISHED,), methods=("grpo",), groups=(4, 16), seeds=(0, 1), sensitivity=None
    ).runs
    lines = []
    outcome = matrix.run_matrix(runs, tmp_path, jobs=2, worker=fake_worker, log=lines.append, command="cmd")
    failing = [s for s in runs if "run.seed=1" in s.overrides and "data.group_size=16" in s.overrides]
    assert len(failing) == 2 and set(outcome.failed) == {s.key for s in failing}
    assert outcome.finished == len(runs) - 2
    assert all(read_result(tmp_path, s)["command"] == "cmd" for s in runs if s not in failing)
    assert sum("FAILED: ValueError: boom" in line for line in lines) == 2


def test_a_second_invocation_on_the_same_runs_directory_is_refused(configs_dir, tmp_path):
    """Two invocations on one runs directory would run the same pending runs twice (and write one run
    directory from two processes): the second one is one line, and it runs and records nothing."""
    from ebpo.persist import DirectoryInUse, DirectoryLock

    runs = _plan(configs_dir, arms=(PUBLISHED,), methods=("grpo",), seeds=(0,), sensitivity=None).runs
    calls = []

    def worker(spec, root, keep, command):
        calls.append(spec.key)
        return fake_worker(spec, root, keep, command)

    holder = DirectoryLock(
        tmp_path, what="benchmark runs directory", hint=""
    ).acquire()  # the first invocation
    with pytest.raises(
        DirectoryInUse, match=rf"{re.escape(str(tmp_path))} .*pid {os.getpid()}\b.*--runs-dir"
    ):
        matrix.run_matrix(runs, tmp_path, worker=worker, log=lambda _: None, command="c")
    assert calls == [] and matrix.read_sessions(tmp_path) == []
    holder.release()
    outcome = matrix.run_matrix(runs, tmp_path, worker=worker, log=lambda _: None, command="c")
    assert outcome.finished == len(runs) and len(calls) == len(runs)
    DirectoryLock(
        tmp_path, what="benchmark runs directory", hint=""
    ).acquire().release()  # released at the end


# --- estimate -----------------------------------------------------------------------------------------


def test_estimate_from_cpu_seconds_by_hand(configs_dir):
    runs = _plan(
        configs_dir,
        arms=(PUBLISHED,),
        methods=("grpo", "dapo"),
        groups=(4,),
        variants=(FIXED_PROMPTS,),
        seeds=(0,),
        sensitivity=None,
    ).runs
    grpo, dapo = runs
    # a finished GRPO run (fake timing): 10 steps x 8 prompts x G 4 = 320 responses, train CPU 8 - 2 (its
    # validations) = 6 s -> 6 / 320 s per response; validation 3 x 18 x 2 = 108 and test 9 x 8 = 72 answers
    # took 2 + 1 = 3 s -> 1/60 s per answer
    costs = matrix.fit_costs([fake_result(grpo, 0.5)])  # one run: no fixed cost can be told apart
    assert costs.train_rate == {"with reference model": pytest.approx(6 / 320)} and costs.fixed == 0.0
    assert costs.sample_rate == pytest.approx(3 / 180)
    # each planned run: 320 x 6 / 320 + (108 + 72) / 60 = 9 s (DAPO has no class of its own: the mean rate)
    assert costs.cpu_seconds(grpo) == pytest.approx(9.0) and costs.cpu_seconds(dapo) == pytest.approx(9.0)
    two = matrix.estimate(runs, costs, jobs=2)
    assert (two.cpu_s, two.wall_s) == (pytest.approx(18.0), pytest.approx(9.0))  # side by side
    assert matrix.estimate(runs, costs, jobs=1).wall_s == pytest.approx(18.0)
    assert "2 runs: 0.3 CPU min, projected wall time 0.1 min with --jobs 2" in two.text()
    resumed = fake_result(grpo, 0.5)
    resumed["timing"]["resumed_from_step"] = 5  # its times miss the first part: not used
    with pytest.raises(ValueError, match="--quick"):
        matrix.fit_costs([resumed])


def test_estimate_separates_a_fixed_cost_per_run_when_run_sizes_differ(configs_dir):
    plan = _plan(
        configs_dir,
        arms=(PUBLISHED,),
        methods=("grpo",),
        groups=(4, 16),
        variants=(FIXED_PROMPTS,),
        seeds=(0,),
        sensitivity=None,
    )
    g4, g16 = plan.runs  # 10 steps x 8 prompts x G: 320 and 1280 training responses
    small, large = fake_result(g4, 0.5), fake_result(g16, 0.5)
    # training CPU less validation: 320 responses -> 4 s, 1280 -> 10 s: slope 6 / 960 = 1/160 s per
    # response, fixed cost 4 - 320 / 160 = 2 s per run
    small["timing"].update(train_cpu_s=4.0 + 2.0)
    large["timing"].update(train_cpu_s=10.0 + 2.0)
    costs = matrix.fit_costs([small, large])
    assert costs.fixed == pytest.approx(2.0) and costs.train_rate["with reference model"] == pytest.approx(
        1 / 160
    )
    # sampling: (2 + 1) s per run over 180 answers per run -> 1/60 s; G = 4: 2 + 2 + 180 / 60 = 7 s
    assert costs.cpu_seconds(g4) == pytest.approx(7.0)
