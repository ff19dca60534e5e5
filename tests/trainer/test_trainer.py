"""The reference trainer on the tiny random model: a run end to end, exact resume, bad input, reward errors.

The runs use ``helpers.trainer``'s dense test reward (the fraction of digits in the completion) and its
small config.
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from ebpo.errors import ConfigError
from ebpo.trackers import read_metrics
from ebpo.trainer.config_files import load_config
from ebpo.trainer.trainer import RewardError, Trainer
from helpers.trainer import FLAKY, final_params, tiny_config, tiny_overrides, training_rows


@pytest.fixture(autouse=True)
def _disarm():
    FLAKY.update(armed=False, fail_first="", calls=0)
    yield
    FLAKY.update(armed=False, fail_first="", calls=0)


def test_end_to_end_run_learns_and_logs(tiny_model_dir, tmp_path):
    cfg = tiny_config(
        tiny_model_dir, "run.steps=2", "run.plot=true", "algorithm.kl_coef=0.001", "run.eval_every=1"
    )
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    trainer = Trainer(cfg, run_dir=tmp_path / "run")
    result = trainer.train()

    assert result.step == 2
    rows = read_metrics(tmp_path / "run")
    assert [row["step"] for row in rows] == [0, 1, 2]  # step 0 = validation before training
    for row in rows[1:]:
        for name in (
            "actor/pg_loss",
            "actor/grad_norm",
            "actor/entropy",
            "actor/step_kl",
            "actor/kl_ref",
            "actor/pg_clipfrac",
            "reward/mean",
            "groups/all_fail",
            "groups/all_pass",
            "ebpo/mu_glob",
            "ebpo/shrinkage",
            "perf/tokens_per_s",
            "timing_s/rollout",
            "timing_s/update",
            "eval/pass@1",
            "eval/maj@2",
        ):
            assert name in row, name
            assert math.isfinite(row[name]), (name, row[name])
        assert row["actor/grad_norm"] > 0  # distinct rewards in a group -> a real gradient
        assert row["actor/step_kl"] > 0  # the policy moved on its own samples
        assert 0 <= row["reward/mean"] <= 1
    moved = final_params(tmp_path / "run")
    assert any(not torch.equal(moved[name], initial[name]) for name in initial)
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    assert (tmp_path / "run" / "training.png").stat().st_size > 1000
    assert (tmp_path / "run" / "checkpoints" / "best" / "best.json").is_file()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["step"] == 2 and "eval/pass@1" in summary["eval_after"]
    per_topic = [k for k in summary["eval_after"] if k.startswith("eval/pass@1/")]
    # arith cycles through its (topic, level) cells topic-major; default levels: all five, so 9 problems =
    # 5 of mod (levels 1-5) and 4 of sequence (levels 1-4)
    assert sorted(per_topic) == ["eval/pass@1/mod", "eval/pass@1/sequence"]


@pytest.mark.parametrize(
    "fast", [(), ("rollout.old_logp=sampler", "run.step_kl=subset")], ids=["default", "fast"]
)
def test_exact_resume_is_bit_for_bit(tiny_model_dir, tmp_path, fast):
    # one run of 4 steps ...
    Trainer(tiny_config(tiny_model_dir, "run.steps=4", *fast), run_dir=tmp_path / "straight").train()
    # ... equals 2 steps, the process gone, a resume from the checkpoint and 2 more
    Trainer(tiny_config(tiny_model_dir, "run.steps=2", *fast), run_dir=tmp_path / "split").train()
    Trainer(tiny_config(tiny_model_dir, "run.steps=4", *fast), resume=tmp_path / "split").train()

    straight, split = final_params(tmp_path / "straight"), final_params(tmp_path / "split")
    assert straight.keys() == split.keys()
    for name in straight:
        assert torch.equal(straight[name], split[name]), name
    assert training_rows(tmp_path / "split") == training_rows(tmp_path / "straight")
    assert [row["step"] for row in read_metrics(tmp_path / "split")] == [0, 1, 2, 3, 4]


def test_reward_error_stops_with_checkpoint_and_resume_loses_nothing(tiny_model_dir, tmp_path):
    Trainer(tiny_config(tiny_model_dir, "run.steps=3"), run_dir=tmp_path / "straight").train()

    FLAKY.update(armed=True, fail_first="".join(chr(c) for c in range(32, 127)))  # every completion fails
    trainer = Trainer(
        tiny_config(tiny_model_dir, "run.steps=3", "run.save_every=0"), run_dir=tmp_path / "broken"
    )
    calls_before = FLAKY["calls"]
    with pytest.raises(RewardError) as err:
        trainer.train()
    message = str(err.value)
    assert "raised on sample 0 of step 1" in message and "verifier crashed" in message
    assert "prompt: " in message and "completion: " in message and "--resume" in message
    assert FLAKY["calls"] > calls_before
    state = torch.load(tmp_path / "broken" / "checkpoints" / "last" / "trainer_state.pt", weights_only=False)
    assert state["step"] == 0  # the state before the failing step

    FLAKY["armed"] = False  # the reward is fixed; the resumed run equals one that never failed
    Trainer(tiny_config(tiny_model_dir, "run.steps=3"), resume=tmp_path / "broken").train()
    straight, resumed = final_params(tmp_path / "straight"), final_params(tmp_path / "broken")
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    assert training_rows(tmp_path / "broken") == training_rows(tmp_path / "straight")


def test_skip_reward_errors_masks_and_counts(tiny_model_dir, tmp_path):
    FLAKY.update(armed=True, fail_first="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    cfg = tiny_config(tiny_model_dir, "run.steps=2", "algorithm.skip_reward_errors=true")
    Trainer(cfg, run_dir=tmp_path / "run").train()
    rows = read_metrics(tmp_path / "run")[1:]
    errors = sum(row["reward/errors"] for row in rows)
    assert 0 < errors < 2 * 8  # some of the 2 steps x 8 samples failed, not all
    assert all(math.isfinite(row["actor/pg_loss"]) for row in rows)


def test_dapo_preset_runs_with_dynamic_sampling(tiny_model_dir, tmp_path):
    extra = ["algorithm.overlong_cache_len=2", "run.steps=1"]
    cfg = load_config("dapo", tiny_overrides(tiny_model_dir) + extra)  # the shipped preset, by name
    assert cfg.algorithm.dynamic_sampling and cfg.algorithm.overlong_shaping
    Trainer(cfg, run_dir=tmp_path / "run").train()
    row = read_metrics(tmp_path / "run")[1]
    assert row["dynamic/rounds"] >= 1 and "reward/shaped_mean" in row
    assert math.isfinite(row["actor/pg_loss"])


def test_bad_input_is_reported_before_training(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="^model.path: /no/such/model "):
        Trainer(tiny_config("/no/such/model"), run_dir=tmp_path / "a")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ConfigError, match=rf"\btraining\b.*{re.escape(str(empty))}"):
        Trainer(tiny_config(tiny_model_dir, f"data.train_file={empty}"), run_dir=tmp_path / "b")
    long_prompt = tmp_path / "long.jsonl"
    long_prompt.write_text(json.dumps({"id": "p0", "prompt": "1+" * 300 + "1=", "answer": "301"}) + "\n")
    with pytest.raises(
        ConfigError, match=r"validation record 0 \(id 'p0'\).*\b602\b.*rollout\.max_new_tokens=6\b.*\b512\b"
    ):
        Trainer(tiny_config(tiny_model_dir, f"data.val_file={long_prompt}"), run_dir=tmp_path / "c")
    bad_row = tmp_path / "bad.jsonl"
    bad_row.write_text(json.dumps({"id": "q1", "prompt": "1+1="}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl, line 1, field 'answer'"):
        Trainer(tiny_config(tiny_model_dir, f"data.train_file={bad_row}"), run_dir=tmp_path / "d")


def test_cli_reports_bad_config(capsys):
    from ebpo.cli import main

    assert main(["train", "algorithm.estimator=ppo"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("ebpo train: error: algorithm.estimator:")
        and "'ppo'" in err
        and "valid choices" in err
    )
    assert main(["train", "--help-config"]) == 0
    assert "algorithm.estimator" in capsys.readouterr().out


def test_the_eval_table_goes_to_the_stdout_of_the_call_not_the_one_at_import(monkeypatch):
    # a stdout replaced after the module was imported (pytest's capture of a later test, a notebook) gets the
    # table: the default is looked up when the table is printed
    import io
    import sys

    from ebpo.trainer.report import print_eval_table

    later = io.StringIO()
    monkeypatch.setattr(sys, "stdout", later)
    print_eval_table({"eval/pass@1": 0.25}, {"eval/pass@1": 0.5})
    assert "all (pass@1)    0.250    0.500   +0.250" in later.getvalue()
