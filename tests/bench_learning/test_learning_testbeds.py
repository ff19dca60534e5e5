"""The learning benchmark's testbeds: S1 adds nothing to a run (its keys stay), S2 plans its model, task and
settings; the test set follows the run's task; a gym run end to end on the shipped S2; its answer kinds and page."""

from __future__ import annotations

import json

import pytest
from benchmarks.learning import cli, matrix, report
from benchmarks.learning.methods import ESTIMATORS, PUBLISHED, get_method
from benchmarks.learning.run import execute
from benchmarks.learning.spec import FIXED_PROMPTS, Budget, build_spec
from benchmarks.learning.testbeds import (
    KIND_ORDER,
    answer_kinds_of,
    benchmark_of,
    get_testbed,
)
from learning_helpers import fake_result

pytest.importorskip("reasoning_gym", reason="the s2 testbed's task needs the ebpo[gym] extra")

from ebpo.models.recipes.gym import ANSWER_KINDS as GYM_KINDS  # noqa: E402
from ebpo.models.recipes.gym import DATASETS, MIXTURE, TASK, gold_answer  # noqa: E402
from ebpo.models.recipes.gym import SHIPPED_DIR as GYM_SHIPPED_DIR  # noqa: E402
from ebpo.tasks import arith, get_task  # noqa: E402


def _plan(argv: list[str], configs_dir) -> tuple[matrix.Plan, str]:
    """The plan ``python -m benchmarks.learning ARGV`` makes with the test presets, and its model path."""
    args = cli.build_parser().parse_args(argv)
    testbed = get_testbed(args.testbed)
    model = cli.testbed_model(testbed, configs_dir, args.model_path)
    budget = cli.budget_from(args).resolve(configs_dir)
    return matrix.plan(cli.design_from(args), budget, model_path=model, configs=configs_dir), model


def test_s1_adds_no_setting_and_s2_sets_its_model_task_and_mixture(configs_dir):
    assert get_testbed("s1").settings() == () and get_testbed("s1").model is None
    flags = ["--methods", "grpo", "--sweep", "--no-sensitivity", "--seeds", "0", "--steps", "3"]
    s1, s1_model = _plan(flags, configs_dir)
    s2, s2_model = _plan(["--testbed", "s2", *flags], configs_dir)
    assert s2_model == str(GYM_SHIPPED_DIR) and s1_model != s2_model  # the shipped S2, built or not
    assert len(s1.runs) == len(s2.runs) == 1
    (one,), (two,) = s1.runs, s2.runs
    assert one.config["data"]["task"] == "arith" and one.config["data"]["task_options"] == {}
    data = two.load_config().data
    assert data.task == TASK and data.task_options == MIXTURE  # the levels keep their whole-number keys
    # the same method, budget and seed: only the model and the task differ, and the key follows them
    for config in (one.config, two.config):
        config["data"] = {k: v for k, v in config["data"].items() if k not in ("task", "task_options")}
        config["model"] = {k: v for k, v in config["model"].items() if k != "path"}
    assert one.config == two.config and one.key != two.key
    with pytest.raises(SystemExit):  # argparse lists the choices
        cli.build_parser().parse_args(["--testbed", "s3"])


def test_the_test_set_is_the_test_split_of_the_runs_task():
    s1 = benchmark_of({"task": "arith", "task_options": {}})
    assert s1.name == "arith" and s1.reward == "arith" and len(s1.load()) == 450
    s2 = benchmark_of({"task": TASK, "task_options": MIXTURE})
    records = s2.load()
    assert s2.name == TASK and s2.reward == "gym" and len(records) == 450
    assert [r.id for r in records] == [r.id for r in get_task(TASK, **MIXTURE).generate("test", 450, seed=0)]
    assert {r.topic for r in records} == set(DATASETS) and {r.level for r in records} == {1, 2, 3}


def test_answer_kinds_by_task_family_by_hand():
    record = get_task(TASK, **MIXTURE).generate("test", 1, seed=0)[0]
    gold = gold_answer(record)
    # four samples: right, the answer run on by a digit, something else, no <answer> tags: a quarter each
    shares = answer_kinds_of(TASK).shares([([gold, gold + "7", "x" + gold, None], record)])
    assert shares == {"right": 0.25, "run-on": 0.25, "other": 0.25, "no answer": 0.25}
    assert list(shares) == list(GYM_KINDS) and answer_kinds_of(TASK).source == "gym_recipe.answer_kind"
    problem = arith.generate("test", 1, seed=0)[0]  # arith's kinds as arith.answer_kind_shares gives them
    answers = [problem.answer, problem.answer + "3", None]
    assert answer_kinds_of("arith").shares([(answers, problem)]) == arith.answer_kind_shares(
        [(answers, problem.answer)]
    )
    assert answer_kinds_of("math") is None  # another family: no kinds
    assert [k for k in KIND_ORDER if k in GYM_KINDS] == list(GYM_KINDS)


def test_a_tiny_run_on_s2_end_to_end(configs_dir, tmp_path):
    """The shipped S2 on its mixture, 1 step of 2 prompts x G 2: validated on the mixture's validation split,
    tested on its test split, answers sorted by the gym's kinds."""
    budget = Budget(
        steps=1, prompts=2, updates=1, eval_every=1, val_size=4, eval_n=2, test_size=8, test_n=2,
        settings=get_testbed("s2").settings(),
    ).resolve(configs_dir)  # fmt: skip
    spec = build_spec(
        get_method(ESTIMATORS, "ebpo"), FIXED_PROMPTS, 2, 0, budget, str(GYM_SHIPPED_DIR), configs=configs_dir
    )
    result = execute(spec, tmp_path)
    test = result["test"]
    assert test["benchmark"] == TASK and test["num_problems"] == 8
    first = get_task(TASK, **MIXTURE).generate("test", 8, seed=0)  # cells in turn: chain_sum L1-3, ...
    assert set(test["by_topic"]) == {r.topic for r in first} == {"chain_sum", "basic_arithmetic", "gcd"}
    assert set(test["by_level"]) == {"1", "2", "3"}
    kinds = test["answer_kinds"]
    assert list(kinds) == list(GYM_KINDS) and sum(kinds.values()) == pytest.approx(1.0)
    assert all(round(share * 16, 9).is_integer() for share in kinds.values())  # 8 problems x 2 samples
    assert [s for s, _ in result["curves"]["eval/pass@1"]] == [0.0, 1.0]
    assert json.loads((tmp_path / spec.key / "spec.json").read_text())["key"] == spec.key


def test_a_gym_page_names_its_test_set_and_kinds_and_shortens_the_mixture(configs_dir, tmp_path):
    budget = Budget(steps=10, test_size=9, settings=get_testbed("s2").settings()).resolve(configs_dir)
    plan = matrix.plan(
        matrix.Design(arms=(PUBLISHED,), methods=("grpo",), groups=(4, 16), variants=(FIXED_PROMPTS,), seeds=(0, 1)),
        budget,
        model_path="/m",
        configs=configs_dir,
    )  # fmt: skip
    rows = []
    for cell, spec in zip(plan.cells, plan.specs):
        result = fake_result(spec, 0.5)
        result["test"]["benchmark"] = TASK
        result["test"]["answer_kinds"] = {"no answer": 0.0, "other": 0.25, "right": 0.5, "run-on": 0.25}
        rows.append(report.Row(cell, result))
    page = report.report_markdown(
        rows, tag="s2_unit", command="python -m benchmarks.learning --testbed s2", missing=0, headline=4,
        sensitivity_pair=(4, 16), threshold=0.1,
    )  # fmt: skip
    assert f"test = first 9 `{TASK}` test problems" in page
    assert "data.task_options=<" in page and "characters, in each run's spec.json>" in page
    assert "(% of all samples; `gym_recipe.answer_kind`):" in page
    assert "| runs | right | run-on | other | no answer |" in page  # KIND_ORDER, not alphabetical
    assert report.shown_override("data.task=arith") == "data.task=arith"
