"""Runs of the learning benchmark through the trainer on a tiny model: result, restart after a kill before the
first checkpoint, exact resume after one, and the process pool with real runs."""

from __future__ import annotations

import json
import math
import re

import pytest
from benchmarks.learning import matrix
from benchmarks.learning.methods import ESTIMATORS, get_method
from benchmarks.learning.run import (
    RESULT_FILE,
    TEST_SAMPLES,
    add_answer_kinds,
    execute,
    load_results,
    read_result,
    run_dir,
)
from benchmarks.learning.spec import FIXED_PROMPTS, Budget, build_spec

from ebpo.tasks import arith

TINY = dict(
    steps=2, prompts=2, updates=1, eval_every=1, val_size=4, eval_n=2, test_size=9, test_n=2, max_new_tokens=4
)


def _spec(tiny_model_dir, configs_dir, method=("estimators", "ebpo"), seed=0, **budget):
    b = Budget(**{**TINY, **budget}).resolve(configs_dir)
    return build_spec(
        get_method(*method), FIXED_PROMPTS, 2, seed, b, str(tiny_model_dir), configs=configs_dir
    )


def test_tiny_model_run_writes_its_result_and_is_not_rerun(tiny_model_dir, configs_dir, tmp_path):
    spec = _spec(tiny_model_dir, configs_dir, test_best=True)
    result = execute(spec, tmp_path, command="python -m benchmarks.learning --unit")
    directory = run_dir(tmp_path, spec)
    assert json.loads((directory / RESULT_FILE).read_text())["key"] == spec.key
    assert not (directory / "checkpoints").exists()  # removed once the result is written
    assert result["command"] == "python -m benchmarks.learning --unit" and result["steps"] == 2
    assert result["test"]["num_problems"] == 9 and 0.0 <= result["test"]["pass@1"] <= 1.0
    assert set(result["test"]["by_level"]) == {"1", "2", "3", "4", "5"}
    # the 18 test samples by kind: shares of one whole, and "right" is exactly what Pass@1 counts
    kinds = result["test"]["answer_kinds"]
    assert list(kinds) == list(arith.ANSWER_KINDS) and sum(kinds.values()) == pytest.approx(1.0)
    assert kinds["right"] == pytest.approx(result["test"]["pass@1"])
    assert all(round(share * 18, 9).is_integer() for share in kinds.values())
    # validation at steps 0, 1, 2 (eval_every 1); training curves at steps 1, 2
    assert [s for s, _ in result["curves"]["eval/pass@1"]] == [0.0, 1.0, 2.0]
    assert [s for s, _ in result["curves"]["reward/mean"]] == [1.0, 2.0]
    assert all(math.isfinite(v) for _, v in result["curves"]["actor/step_kl"])
    t = result["timing"]
    assert t["resumed_from_step"] == 0 and 0 < t["val_cpu_s"] <= t["train_cpu_s"]
    # --test-best: the best validation checkpoint is tested too, unless it is the final one
    best = result["test_best"]
    assert best["rule"] == "best" and best["step"] == result["val_best_step"]
    tests = 1 if best["step"] == 2 else 2
    if tests == 1:
        assert {k: v for k, v in best.items() if k not in ("rule", "step")} == result["test"]
    # 2 steps x 2 prompts x G 2 responses; 3 validations x 4 problems x 2 samples; 9 test problems x 2
    assert result["counts"] == {"train_responses": 8, "val_samples": 24, "test_samples": 18 * tests}
    mtime = (directory / RESULT_FILE).stat().st_mtime_ns
    assert execute(spec, tmp_path) == result  # finished: read back, not retrained
    assert (directory / RESULT_FILE).stat().st_mtime_ns == mtime


def _kill_on_step(monkeypatch, step: int) -> None:
    from ebpo.trainer.trainer import Trainer

    original = Trainer._train_step

    def killed(self):
        if self.step + 1 == step:
            raise KeyboardInterrupt(f"killed during step {step}")
        return original(self)

    monkeypatch.setattr(Trainer, "_train_step", killed)


def test_run_killed_before_its_first_checkpoint_starts_over(
    tiny_model_dir, configs_dir, tmp_path, monkeypatch, plugin_pkg_dir, plugin_sandbox
):
    from ebpo.plugins import load_plugins
    from ebpo.trainer import Trainer
    from ebpo.trainer.config import ConfigError
    from helpers.plugins import PKG_ESTIMATOR

    # the row of an installed package's estimator (its entry point, loaded as the command line loads it), with
    # an option
    monkeypatch.syspath_prepend(str(plugin_pkg_dir))
    load_plugins()
    spec = _spec(tiny_model_dir, configs_dir, (ESTIMATORS, f"{PKG_ESTIMATOR}:trim=1"), save_every=2)
    with monkeypatch.context() as patch:
        _kill_on_step(patch, 1)
        with pytest.raises(KeyboardInterrupt):
            execute(spec, tmp_path)
    directory = run_dir(tmp_path, spec)
    # the attempt left its step-0 validation and best checkpoint, but no checkpoints/last to resume from
    assert (directory / "metrics.jsonl").is_file() and (directory / "checkpoints" / "best").is_dir()
    assert not (directory / "checkpoints" / "last").exists()
    with pytest.raises(
        ConfigError, match=rf"{re.escape(str(directory))} .*metrics\.jsonl"
    ):  # why execute must pass overwrite=True
        Trainer(spec.load_config(), run_dir=directory)
    result = execute(spec, tmp_path)
    assert result["timing"]["resumed_from_step"] == 0
    assert [s for s, _ in result["curves"]["eval/pass@1"]] == [0.0, 1.0, 2.0]  # one history, not two
    assert f"algorithm.estimator={PKG_ESTIMATOR}" in result["spec"]["overrides"]


def test_run_killed_after_a_checkpoint_resumes_exactly(tiny_model_dir, configs_dir, tmp_path, monkeypatch):
    spec = _spec(tiny_model_dir, configs_dir, steps=3, save_every=1, eval_every=3)
    with monkeypatch.context() as patch:
        _kill_on_step(patch, 3)
        with pytest.raises(KeyboardInterrupt):
            execute(spec, tmp_path / "killed")
    resumed = execute(spec, tmp_path / "killed")
    whole = execute(spec, tmp_path / "whole")
    assert resumed["timing"]["resumed_from_step"] == 2 and whole["timing"]["resumed_from_step"] == 0
    for name in ("reward/mean", "actor/step_kl", "eval/pass@1"):  # the trainer's exact resume
        assert resumed["curves"][name] == whole["curves"][name], name
    assert resumed["test"] == whole["test"]


def test_a_forged_checkpoint_of_a_killed_run_is_refused_unread(
    tiny_model_dir, configs_dir, tmp_path, monkeypatch
):
    from ebpo.persist import UnsafeFile, read_manifest, write_manifest
    from helpers.payloads import write_payload

    spec = _spec(tiny_model_dir, configs_dir, steps=3, save_every=1, eval_every=3)
    with monkeypatch.context() as patch:
        _kill_on_step(patch, 3)
        with pytest.raises(KeyboardInterrupt):
            execute(spec, tmp_path)
    last = run_dir(tmp_path, spec) / "checkpoints" / "last"
    marker = tmp_path / "created-by-the-pickle"
    write_payload(last / "trainer_state.pt", marker)
    write_manifest(last, step=read_manifest(last)["step"])  # as a forger would
    with pytest.raises(
        UnsafeFile, match=r"trainer_state\.pt holds a pickle that would run code to load \(io\.open\)"
    ):
        execute(spec, tmp_path)
    assert not marker.exists()


@pytest.mark.slow  # a spawned worker imports torch and transformers afresh (10-30 s on a busy 2-core machine)
def test_process_pool_runs_a_real_run(tiny_model_dir, configs_dir, tmp_path, plugin_sandbox):
    # the row of an estimator of one's own (a lone file's, with an option): the worker imports the plugin from
    # the run's config (run.plugins, which --plugins sets for every run)
    from ebpo.plugins import load_plugins
    from helpers.plugins import FILE_ESTIMATOR, MY_ESTIMATORS

    load_plugins([str(MY_ESTIMATORS)])
    plugins = f"run.plugins=[{MY_ESTIMATORS}]"
    spec = _spec(
        tiny_model_dir, configs_dir, (ESTIMATORS, f"{FILE_ESTIMATOR}:q=0.75"), steps=1, settings=(plugins,)
    )
    assert (
        spec.key == _spec(tiny_model_dir, configs_dir, (ESTIMATORS, f"{FILE_ESTIMATOR}:q=0.75"), steps=1).key
    )
    outcome = matrix.run_matrix([spec], tmp_path, jobs=2, command="c", log=lambda _: None)
    assert outcome.failed == {} and outcome.finished == 1
    result = read_result(tmp_path, spec)
    assert result["steps"] == 1 and f"algorithm.estimator={FILE_ESTIMATOR}" in result["spec"]["overrides"]
    assert (run_dir(tmp_path, spec) / "run.log").is_file()  # the worker's output went to the run's log


def test_results_written_before_the_answer_kinds_get_them_from_their_test_samples(tmp_path):
    gold = {str(r.id): r.answer for r in arith.generate("test", 2, seed=0)}
    (a, answer_a), (b, answer_b) = gold.items()
    old = tmp_path / "old"  # a result written before answer kinds were recorded: its samples beside it
    old.mkdir()
    (old / RESULT_FILE).write_text(json.dumps({"key": "old", "test": {"pass@1": 0.5}}))
    samples = [{"id": a, "answers": [answer_a, answer_a + "3"]}, {"id": b, "answers": [answer_b, None]}]
    (old / TEST_SAMPLES).write_text("".join(json.dumps(x) + "\n" for x in samples))
    torn = tmp_path / "torn"  # its samples file cut short by a kill: the result loads, without kinds
    torn.mkdir()
    (torn / RESULT_FILE).write_text(json.dumps({"key": "torn", "test": {"pass@1": 0.5}}))
    (torn / TEST_SAMPLES).write_text('{"id": "' + a + '", "answ')
    recorded = tmp_path / "new"  # kinds recorded at test time are kept as they are
    recorded.mkdir()
    (recorded / RESULT_FILE).write_text(json.dumps({"key": "new", "test": {"answer_kinds": {"right": 1.0}}}))
    (recorded / TEST_SAMPLES).write_text("".join(json.dumps(x) + "\n" for x in samples))

    results = load_results(tmp_path)
    assert all(
        "answer_kinds" not in r["test"] for k, r in results.items() if k != "new"
    )  # loading reads no samples
    add_answer_kinds(results, tmp_path)
    # 4 samples: 2 right, 1 run-on, 1 no number
    assert results["old"]["test"]["answer_kinds"] == {
        "right": 0.5,
        "near miss": 0.0,
        "run-on": 0.25,
        "other": 0.0,
        "no number": 0.25,
    }
    assert "answer_kinds" not in results["torn"]["test"]
    assert results["new"]["test"]["answer_kinds"] == {"right": 1.0}
    assert "answer_kinds" not in json.loads((old / RESULT_FILE).read_text())["test"]  # nothing rewritten
