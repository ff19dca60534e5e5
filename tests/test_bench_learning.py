"""benchmarks/learning.py: the matrix plan, equal budget, resume, statistics and tables (synthetic results),
plus one tiny-model run through the trainer's public API."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_learning", REPO / "benchmarks" / "learning.py")
learning = importlib.util.module_from_spec(_spec)
sys.modules["bench_learning"] = learning
_spec.loader.exec_module(learning)


def override(spec, key: str) -> str:
    """The value of ``key=value`` in a run's trainer overrides (the last one wins, as in load_config)."""
    values = [item.split("=", 1)[1] for item in spec.overrides() if item.split("=", 1)[0] == key]
    assert values, f"{key} not in overrides"
    return values[-1]


# --- budget and plan ---------------------------------------------------------------------------------


def test_budget_prompts_and_minibatches_by_hand():
    budget = learning.Budget(responses_per_step=64, updates=2)
    # 64 responses: G=4 -> 16 prompts in 2 updates of 8; G=32 -> 2 prompts in 2 updates of 1
    assert budget.prompts_per_step(4) == 16 and budget.mini_batch_size(4) == 8
    assert budget.prompts_per_step(32) == 2 and budget.mini_batch_size(32) == 1
    # 4 updates asked but G=32 leaves 2 prompts: the updates drop to 2 (the largest divisor of 2 <= 4)
    assert learning.Budget(responses_per_step=64, updates=4).mini_batch_size(32) == 1
    # 3 updates of 16 prompts do not divide: the largest divisor of 16 below 3 is 2 -> mini-batch 8
    assert learning.Budget(responses_per_step=64, updates=3).mini_batch_size(4) == 8
    with pytest.raises(ValueError, match="not a multiple of G=5"):
        budget.prompts_per_step(5)
    with pytest.raises(ValueError, match="checkpoint"):
        learning.Budget(checkpoint="median")


def test_plan_is_seed_major_and_keeps_the_response_budget_equal():
    methods = [learning.get_method("ebpo-naive"), learning.get_method("grpo")]
    budget = learning.Budget(steps=5, responses_per_step=128, updates=4)
    specs = learning.plan(methods, [4, 8, 16, 32], [0, 1], budget)
    assert len(specs) == 2 * 4 * 2
    assert [s.seed for s in specs] == [0] * 8 + [1] * 8  # one seed of every cell first
    for spec in specs:
        G = int(override(spec, "data.group_size"))
        prompts = int(override(spec, "data.batch_size"))
        assert prompts * G == 128  # equal budget of sampled responses per step
        assert int(override(spec, "data.train_size")) == 5 * prompts  # one epoch over the training set
        assert prompts // int(override(spec, "optim.mini_batch_size")) == 4  # same updates per step
        assert override(spec, "run.seed") == str(spec.seed)
    with pytest.raises(ValueError, match="not a multiple"):
        learning.plan(methods, [4, 6], [0], budget)


def test_every_method_trains_under_identical_conditions():
    budget = learning.Budget(steps=3, responses_per_step=32)
    configs = {}
    for name in learning.MAIN_METHODS:
        method = (
            learning.best_method(Path("/nonexistent"))[0]
            if name == "ebpo-best"
            else learning.get_method(name)
        )
        cfg = learning.RunSpec(method, 8, 1, budget).load_config()
        assert cfg.data.group_size * cfg.data.batch_size == 32
        assert cfg.run.steps == 3 and cfg.run.seed == 1
        configs[name] = cfg.to_dict()
    # everything but the algorithm and the prompt order (sampler, its cluster key / difficulty source) is
    # the same for every method: the shared sections of configs/ebpo.yaml, then the budget
    order_fields = {"sampler", "cluster_key", "difficulty_source"}
    reference = configs["grpo"]
    for name, values in configs.items():
        for section in ("model", "rollout", "optim", "run"):
            assert values[section] == reference[section], (name, section)
        data = {k: v for k, v in values["data"].items() if k not in order_fields}
        assert data == {k: v for k, v in reference["data"].items() if k not in order_fields}, name
    assert (
        configs["ebpo-naive"]["data"]["sampler"] == "random"
        and configs["ebpo-topic"]["data"]["sampler"] == "topic"
    )
    assert configs["grpo"]["algorithm"]["loss_agg_mode"] == "seq-mean-token-mean"
    assert learning.get_method("ebpo-diff").checkpoint == "last"  # the paper's rule for the curriculum
    with pytest.raises(ValueError, match="valid: ebpo-naive"):
        learning.get_method("ppo")


def test_preset_is_frozen_into_the_spec(tmp_path, monkeypatch):
    method = learning.get_method("grpo")
    spec = learning.RunSpec(method, 4, 0, learning.Budget(steps=2))
    frozen = json.loads(spec.preset_values)
    assert frozen["algorithm"]["estimator"] == "grpo" and "data" in frozen
    # a preset edited after planning changes new specs, not the planned one
    (tmp_path / "grpo.yaml").write_text("algorithm: {estimator: grpo, kl_coef: 0.5}\n")
    (tmp_path / "ebpo.yaml").write_text((learning.CONFIGS / "ebpo.yaml").read_text())
    monkeypatch.setattr(learning, "CONFIGS", tmp_path)
    replanned = learning.RunSpec(method, 4, 0, learning.Budget(steps=2))
    frozen_kl = frozen["algorithm"].get("kl_coef", 0.0)
    assert frozen_kl != 0.5
    assert replanned.key() != spec.key() and spec.load_config().algorithm.kl_coef == frozen_kl
    assert replanned.load_config().algorithm.kl_coef == 0.5


def test_spec_key_round_trip_and_sensitivity():
    method = learning.get_method("ebpo-topic")
    spec = learning.RunSpec(method, 4, 2, learning.Budget(steps=7))
    again = learning.RunSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec and again.key() == spec.key()
    assert learning.RunSpec(method, 4, 2, learning.Budget(steps=8)).key() != spec.key()
    assert learning.RunSpec(method, 4, 3, learning.Budget(steps=7)).key() != spec.key()
    assert (
        learning.RunSpec(learning.get_method("ebpo-naive"), 4, 2, learning.Budget(steps=7)).key()
        != spec.key()
    )


def test_best_method_reads_the_selection_file(tmp_path):
    spec, how = learning.best_method(tmp_path)
    assert spec.name == "ebpo-best" and "not measured" in how
    assert spec.overrides == learning.get_method(learning.DEFAULT_BEST).overrides
    (tmp_path / learning.BEST_OPTIONS_FILE).write_text(
        json.dumps({"method": "ebpo-latent", "chosen_by": "test"})
    )
    spec, how = learning.best_method(tmp_path)
    assert spec.overrides == ("algorithm.estimator_options.tau2=latent",) and how == "test"


# --- resume ------------------------------------------------------------------------------------------


def fake_result(spec, pass1: float, val: float | None = None, dynamics: dict | None = None) -> dict:
    return {
        "key": spec.key(),
        "spec": spec.to_dict(),
        "method": spec.method.name,
        "group_size": spec.group_size,
        "seed": spec.seed,
        "checkpoint": "best",
        "checkpoint_step": 1,
        "val_best_maj": val,
        "val_best_step": 1,
        "train_s": 1.0,
        "eval_s": 1.0,
        "test": {
            "pass@1": pass1,
            "maj@4": pass1,
            "by_topic": {"mod": {"pass@1": pass1, "maj@4": pass1}, "dot": {"pass@1": pass1 / 2, "maj@4": 0}},
            "by_level": {"1": {"pass@1": pass1, "maj@4": pass1}, "5": {"pass@1": 0.0, "maj@4": 0.0}},
        },
        "curves": {"reward/mean": [[1, pass1], [2, pass1]], "actor/grad_norm": [[1, 0.5], [2, 0.25]]},
        "dynamics": dynamics or {"actor/entropy/mean": 1.0},
    }


def test_killed_matrix_continues_and_skips_finished_runs(tmp_path, monkeypatch):
    specs = learning.plan(
        [learning.get_method("grpo"), learning.get_method("dapo")],
        [4, 8],
        [0],
        learning.Budget(steps=2, test_n=4),
    )
    calls = []

    def fake_execute(spec, root, *, keep_checkpoints=False, threads=None):
        calls.append(spec.name)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the matrix is killed during its third run
        directory = learning.run_dir(root, spec)
        directory.mkdir(parents=True, exist_ok=True)
        learning.write_json_atomic(directory / learning.RESULT_FILE, fake_result(spec, 0.5))
        return fake_result(spec, 0.5)

    monkeypatch.setattr(learning, "execute", fake_execute)
    with pytest.raises(KeyboardInterrupt):
        learning.run_matrix(specs, tmp_path, log=lambda _: None)
    assert calls == [s.name for s in specs[:3]]
    calls.clear()
    results = learning.run_matrix(specs, tmp_path, log=lambda _: None)
    assert calls == [s.name for s in specs[2:]]  # the killed run again, then the rest; finished ones skipped
    assert len(results) == 4
    calls.clear()
    learning.run_matrix(specs, tmp_path, log=lambda _: None)
    assert calls == []
    # a result written under another spec (here: more steps) is not taken as finished
    longer = learning.plan([learning.get_method("grpo")], [4], [0], learning.Budget(steps=3, test_n=4))
    assert learning.read_result(tmp_path, longer[0]) is None
    # a torn result file is not finished either
    (learning.run_dir(tmp_path, specs[0]) / learning.RESULT_FILE).write_text('{"key": ')
    assert learning.read_result(tmp_path, specs[0]) is None


# --- statistics --------------------------------------------------------------------------------------


def test_mean_ci_by_hand():
    # values 0.2, 0.4, 0.6: mean 0.4, s = sqrt((0.04 + 0 + 0.04) / 2) = 0.2, t_{0.975, 2} = 4.303,
    # half-width = 4.303 * 0.2 / sqrt(3) = 0.4969
    ci = learning.mean_ci([0.2, 0.4, 0.6])
    assert ci.n == 3 and ci.mean == pytest.approx(0.4)
    assert ci.half_width == pytest.approx(4.303 * 0.2 / math.sqrt(3), rel=1e-3)
    assert ci.format() == "40.0 ± 49.7"
    one = learning.mean_ci([0.25])
    assert one.n == 1 and math.isnan(one.half_width) and one.format() == "25.0"
    assert learning.mean_ci([]).format() == "-"
    assert learning.mean_ci([0.1, float("nan"), 0.3]).n == 2  # a missing value is not a zero
    same = learning.mean_ci([0.5, 0.5])
    assert same.half_width == 0.0


def test_t_quantile_table_matches_scipy_and_is_conservative(monkeypatch):
    stats = pytest.importorskip("scipy.stats")
    for df in learning.T_975:
        assert learning.t_quantile(df) == pytest.approx(stats.t.ppf(0.975, df), abs=1e-3)
    monkeypatch.setitem(sys.modules, "scipy", None)  # the fallback path: import scipy fails
    assert learning.t_quantile(3) == 3.182
    assert learning.t_quantile(11) == 2.228 >= stats.t.ppf(0.975, 11)  # df 10's value: wider, not narrower
    assert learning.t_quantile(100) == 1.96
    with pytest.raises(ValueError, match="df >= 1"):
        learning.t_quantile(0)


def test_mean_ci_loop_against_scipy_interval():
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(0)
    for _ in range(20):
        n = rng.randint(2, 12)
        xs = [rng.random() for _ in range(n)]
        ci = learning.mean_ci(xs)
        mean = sum(xs) / n
        low, high = stats.t.interval(0.95, n - 1, loc=mean, scale=stats.sem(xs))
        assert ci.mean == pytest.approx(mean)
        assert ci.half_width == pytest.approx((high - low) / 2, rel=1e-9)


def test_aggregate_margin_and_selection_on_synthetic_results():
    budget = learning.Budget(steps=2, test_n=4)
    ebpo, grpo = learning.get_method("ebpo-topic"), learning.get_method("grpo")
    results = []
    # EBPO-topic Pass@1 0.5, 0.6, 0.7 and GRPO 0.4, 0.4, 0.6 at G=4 (seeds 0, 1, 2): paired differences
    # 0.1, 0.2, 0.1 -> mean 0.1333, s = 0.0577, half-width 4.303 * 0.0577 / sqrt(3) = 0.1434
    for seed, (a, b) in enumerate([(0.5, 0.4), (0.6, 0.4), (0.7, 0.6)]):
        results.append(fake_result(learning.RunSpec(ebpo, 4, seed, budget), a, val=0.1))
        results.append(fake_result(learning.RunSpec(grpo, 4, seed, budget), b, val=0.9))
    agg = learning.aggregate(results, "test|pass@1")
    assert agg[("ebpo-topic", 4)].mean == pytest.approx(0.6) and agg[("grpo", 4)].n == 3
    topic = learning.aggregate(results, "test|by_topic|dot|pass@1")
    assert topic[("ebpo-topic", 4)].mean == pytest.approx(0.3)
    assert math.isnan(learning.get_path(results[0], "test|by_topic|area|pass@1"))
    margin = learning.table_margin(results, "ebpo-topic", ["grpo"])
    assert "| ebpo-topic − grpo | 13.3 ± 14.3 |" in margin
    # the selection reads validation maj@k, never the test score: GRPO's validation is higher here
    winner, how = learning.select_best(results, ["ebpo-topic", "grpo"])
    assert winner == "grpo" and "validation" in how
    with pytest.raises(ValueError, match="no finished runs"):
        learning.select_best(results, ["ebpo-latent"])
    # a tie goes to the SPEC default (ebpo-topic-cluster), whatever the names' order
    tie = [
        fake_result(learning.RunSpec(learning.get_method(m), 4, 0, budget), 0.1, val=0.2)
        for m in ("ebpo-ewm", "ebpo-topic-cluster", "ebpo-naive")
    ]
    winner, how = learning.select_best(tie, ["ebpo-ewm", "ebpo-topic-cluster", "ebpo-naive"])
    assert winner == learning.DEFAULT_BEST == "ebpo-topic-cluster" and "a tie between" in how
    steps, mean, half = learning.curve_band(results, "grpo", 4, "actor/grad_norm")
    assert steps == [1, 2] and mean == pytest.approx([0.5, 0.25]) and half == pytest.approx([0.0, 0.0])


def test_curves_and_dynamics_from_metrics_rows():
    rows = [{"step": 0, "eval/pass@1": 0.1}] + [
        {"step": s, "reward/mean": s / 10, "actor/step_kl": 0.001 * s, "actor/entropy": 2.0}
        for s in range(1, 9)
    ]
    curves = learning.curves_from_metrics(rows)
    assert curves["eval/pass@1"] == [[0.0, 0.1]] and len(curves["reward/mean"]) == 8
    assert "actor/grad_norm" not in curves
    dyn = learning.dynamics_summary(curves)
    # reward 0.1..0.8: mean 0.45; last quarter = steps 7, 8 -> 0.75; KL max at step 8 = 0.008
    assert dyn["reward/mean/mean"] == pytest.approx(0.45)
    assert dyn["reward/mean/last_quarter"] == pytest.approx(0.75)
    assert dyn["actor/step_kl/max"] == pytest.approx(0.008)
    # validation 0.1 at step 0 only: first = last = 0.1, change 0; a run without validation gives nan
    result = {"curves": {"eval/pass@1": [[20, 0.25], [0, 0.1]]}}
    assert (
        learning.validation_point(result, "first") == 0.1
        and learning.validation_point(result, "last") == 0.25
    )
    assert learning.validation_point(result, "change") == pytest.approx(0.15)
    assert math.isnan(learning.validation_point({"curves": {}}, "change"))


def test_report_tables_csv_and_plots(tmp_path):
    budget = learning.Budget(steps=2, test_n=4)
    results = []
    for method, base in (("ebpo-naive", 0.3), ("ebpo-topic", 0.5), ("grpo", 0.2)):
        for G in (4, 8):
            for seed in (0, 1):
                spec = learning.RunSpec(learning.get_method(method), G, seed, budget)
                results.append(fake_result(spec, base + 0.1 * seed, dynamics={"actor/entropy/mean": base}))
    written = learning.write_report(results, tmp_path, "unit", "python benchmarks/learning.py --unit")
    names = sorted(p.name for p in written)
    assert names == sorted(
        [
            "learning_unit.md",
            "learning_unit_runs.csv",
            "learning_unit_curves_G4.png",
            "learning_unit_curves_G8.png",
            "learning_unit_levels_G4.png",
            "learning_unit_vs_G.png",
        ]
    )
    assert all(p.stat().st_size > 0 for p in written)
    text = (tmp_path / "learning_unit.md").read_text()
    # ebpo-topic at G=4: seeds 0.5 and 0.6 -> 55.0 ± 12.706 * 0.0707 / sqrt(2) * 100 = 63.5, best in bold
    assert "**55.0 ± 63.5**" in text
    assert "## Clustering ablation" in text and "ebpo-topic − grpo" in text
    csv_lines = (tmp_path / "learning_unit_runs.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + 12 and "test/by_topic/mod/pass@1" in csv_lines[0]
    assert "No finished runs" in learning.report_markdown([], tag="x", command="c")


# --- one real run through the trainer's public API ------------------------------------------------------


def test_tiny_model_run_writes_result_and_is_skipped_when_done(tiny_model_dir, tmp_path):
    budget = learning.Budget(
        steps=2,
        responses_per_step=8,
        updates=1,
        val_size=9,
        eval_n=2,
        evals=1,
        test_n=2,
        test_size=9,
        max_new_tokens=4,
    )
    spec = learning.RunSpec(learning.get_method("ebpo-naive"), 4, 0, budget, str(tiny_model_dir))
    result = learning.execute(spec, tmp_path)
    directory = learning.run_dir(tmp_path, spec)
    assert json.loads((directory / learning.RESULT_FILE).read_text())["key"] == spec.key()
    assert not (directory / "checkpoints").exists()  # removed once the result is written
    assert result["test"]["num_problems"] == 9 and 0.0 <= result["test"]["pass@1"] <= 1.0
    assert set(result["test"]["by_level"]) == {"1", "2", "3", "4", "5"}
    assert [s for s, _ in result["curves"]["reward/mean"]] == [1.0, 2.0]
    assert all(math.isfinite(v) for _, v in result["curves"]["actor/step_kl"])
    mtime = (directory / learning.RESULT_FILE).stat().st_mtime_ns
    assert learning.execute(spec, tmp_path) == result  # finished: read back, not retrained
    assert (directory / learning.RESULT_FILE).stat().st_mtime_ns == mtime


def test_estimate_from_cpu_seconds_by_hand():
    grpo, dapo = learning.get_method("grpo"), learning.get_method("dapo")
    finished = []
    # two finished GRPO runs of 10 steps with 20 and 40 CPU seconds: 2 and 4 s per step, mean 3
    for seed, cpu in ((0, 15.0), (1, 35.0)):
        result = fake_result(learning.RunSpec(grpo, 4, seed, learning.Budget(steps=10)), 0.1)
        result.update(train_cpu_s=cpu, eval_cpu_s=5.0)
        finished.append(result)
    planned = learning.plan([grpo, dapo], [4], [0], learning.Budget(steps=5))
    # GRPO: 3 s x 5 steps = 15 s; DAPO has no runs: the overall mean 3 s x 5 = 15 s; 30 s over 2 jobs = 15 s
    assert learning.estimate_seconds(planned, finished, jobs=2) == pytest.approx(15.0)
    with pytest.raises(ValueError, match="no finished runs"):
        learning.estimate_seconds(planned, [], jobs=1)
