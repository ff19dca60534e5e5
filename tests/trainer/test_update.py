"""``ebpo.trainer.update`` through the trainer: what ``optim.micro_batch_size`` changes and what it does not,
the old log-probs an update is served, the step KL's scope, and shared prompts."""

from __future__ import annotations

import math

import pytest
import torch

from ebpo.trainer.trainer import Trainer
from helpers.trainer import final_params, tiny_config


def _one_step(model_dir, run_dir, *overrides):
    # optim.eps=1: AdamW's first update is lr * g / (|g| + eps), about lr * g for these small gradients, so
    # the parameters move linearly in the gradient (with eps=1e-8 it is lr * sign(g), which turns rounding
    # noise in near-zero gradients into full-size differences)
    cfg = tiny_config(model_dir, "run.steps=1", "run.save_every=1", "optim.eps=1", *overrides)
    Trainer(cfg, run_dir=run_dir).train()
    return final_params(run_dir)


def _max_diff(a, b):
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def test_micro_batches_leave_the_vanilla_update_alone_but_change_kl_cov(tiny_model_dir, tmp_path):
    # 2 prompts x G = 4, one prompt per update: two mini-batches of 4 rows, split into micro-batches of 2.
    # Each part's loss is weighted by its share of the tokens (token-mean), so the vanilla gradient is the
    # whole mini-batch's up to float rounding. KL-Cov picks max(1, floor(2e-3 * n)) tokens by covariance
    # within each part: one token per micro-batch instead of one per mini-batch, so the update differs.
    whole = _one_step(tiny_model_dir, tmp_path / "whole")
    split = _one_step(tiny_model_dir, tmp_path / "split", "optim.micro_batch_size=2")
    assert _max_diff(whole, split) < 1e-7  # measured 3.7e-9

    kl_cov = ["algorithm.policy_loss=kl_cov"]
    whole = _one_step(tiny_model_dir, tmp_path / "kl_whole", *kl_cov)
    split = _one_step(tiny_model_dir, tmp_path / "kl_split", *kl_cov, "optim.micro_batch_size=2")
    assert _max_diff(whole, split) > 1e-5  # measured 1.7e-4


@pytest.mark.parametrize("extra", [(), ("optim.micro_batch_size=2", "optim.epochs=2")])
def test_first_update_serves_its_rows_old_logprobs_to_the_bit(tiny_model_dir, tmp_path, monkeypatch, extra):
    """The step's first update runs at the sampling policy, so its forward gives its rows' old log-probs and
    entropies; with the pass over the other rows they equal, to the bit, the reference log-probs of the
    sampling policy over the whole batch (tests/test_logprobs.py holds each path to it on random batches)."""
    import copy

    from ebpo.logprobs import reference_logprobs, step_kl
    from ebpo.losses import masked_mean

    # 4 prompts x G = 4, one prompt per update: the first update holds 4 of the 16 rows; the exact paths
    # (recomputed old log-probs, every row its own prompt), which the reference computes
    cfg = tiny_config(tiny_model_dir, "run.steps=1", "data.batch_size=4", *EXACT, *extra)
    trainer = Trainer(cfg, run_dir=tmp_path / "run")
    seen = {}

    def spy(model, tokens, old_logp_BT, options, stride):
        seen.update(tokens=tokens, old_logp_BT=old_logp_BT.clone())
        return step_kl(model, tokens, old_logp_BT, options, stride)

    monkeypatch.setattr("ebpo.trainer.trainer.step_kl", spy)
    sampling_policy = copy.deepcopy(trainer.model)
    metrics = trainer._train_step()
    tokens = seen["tokens"]
    with torch.no_grad():
        ref = reference_logprobs(sampling_policy, tokens, cfg.rollout.temperature, with_entropy=True)
    mask_BT = tokens.response_mask_BT.bool()
    assert tokens.num_rows == 16 and int(mask_BT.sum()) > 16
    assert torch.equal(seen["old_logp_BT"][mask_BT], ref.logp_BT[mask_BT])
    assert metrics["actor/entropy"] == float(masked_mean(ref.entropy_BT, tokens.response_mask_BT))
    trainer.run.release()


def test_step_kl_scope_changes_that_metric_and_nothing_else(tiny_model_dir, tmp_path):
    """run.step_kl=subset estimates actor/step_kl from every U-th row, none skips it; training is the same to
    the bit (the pass after the updates reads the model and draws nothing)."""
    from helpers.trainer import training_rows

    runs = {}
    for scope in ("all", "subset", "none"):
        cfg = tiny_config(tiny_model_dir, "run.steps=2", "data.batch_size=4", f"run.step_kl={scope}")
        Trainer(cfg, run_dir=tmp_path / scope).train()
        runs[scope] = (final_params(tmp_path / scope), training_rows(tmp_path / scope))
    params, rows = runs["all"]
    for scope in ("subset", "none"):
        other_params, other_rows = runs[scope]
        assert all(torch.equal(params[name], other_params[name]) for name in params), scope
        drop = {"actor/step_kl"}
        assert [{k: v for k, v in r.items() if k not in drop} for r in other_rows] == [
            {k: v for k, v in r.items() if k not in drop} for r in rows
        ]
    steps = rows[1:]  # step 0 is the validation before training
    assert all(row["actor/step_kl"] > 0 for row in steps)
    assert all(row["actor/step_kl"] >= 0 for row in runs["subset"][1][1:])
    assert [row["actor/step_kl"] for row in runs["subset"][1][1:]] != [row["actor/step_kl"] for row in steps]
    assert all("actor/step_kl" not in row for row in runs["none"][1])


EXACT = ("rollout.old_logp=recompute", "optim.shared_prompts=false")
"""The exact log-prob paths: old log-probs recomputed, every row its own copy of the prompt."""


def _one_step_within_rounding(model_dir, tmp_path, setting):
    """One step on the exact paths and with ``setting`` (a fast path that changes float rounding only): the
    same responses, the update within rounding, the entropy within 1e-5; returns both runs' metric rows."""
    from helpers.trainer import training_rows

    default = _one_step(model_dir, tmp_path / "default", *EXACT)
    changed = _one_step(model_dir, tmp_path / "changed", *EXACT, setting)
    assert _max_diff(default, changed) < 1e-6  # measured 3.7e-9 for both settings
    (a,) = training_rows(tmp_path / "default")[1:]
    (b,) = training_rows(tmp_path / "changed")[1:]
    assert a["reward/mean"] == b["reward/mean"] and a["response_length/mean"] == b["response_length/mean"]
    assert math.isclose(a["actor/entropy"], b["actor/entropy"], abs_tol=1e-5)
    return a, b


def test_sampler_old_logprobs_train_as_recomputed_ones_up_to_rounding(tiny_model_dir, tmp_path):
    """rollout.old_logp=sampler takes the PPO ratio's old log-probs and the entropy from the sampler, which
    differ from a full forward's by float rounding only."""
    a, b = _one_step_within_rounding(tiny_model_dir, tmp_path, "rollout.old_logp=sampler")
    assert math.isclose(a["actor/ppo_kl"], b["actor/ppo_kl"], abs_tol=1e-5)


def test_shared_prompts_train_as_the_default_up_to_rounding(tiny_model_dir, tmp_path, monkeypatch):
    """optim.shared_prompts=true (updates, recompute and step-KL passes on cached prompts) trains as false does
    within rounding; a model whose attention takes no 4-D mask, or gradient checkpointing (which turns the
    cache off), is refused by name."""
    from ebpo.errors import ConfigError

    a, b = _one_step_within_rounding(tiny_model_dir, tmp_path, "optim.shared_prompts=true")
    assert math.isclose(a["actor/step_kl"], b["actor/step_kl"], rel_tol=1e-4)  # measured 3.7e-6
    monkeypatch.setattr(  # a model that loads with an attention taking no 4-D mask
        "ebpo.trainer.setup.in_kernel_gqa",
        lambda model: setattr(model.config, "_attn_implementation", "flash_attention_2"),
    )
    with pytest.raises(ConfigError, match=r"^optim\.shared_prompts=true .*'flash_attention_2'"):
        Trainer(tiny_config(tiny_model_dir, "optim.shared_prompts=true"), run_dir=tmp_path / "flash")
    with pytest.raises(ConfigError, match="optim.shared_prompts.*model.gradient_checkpointing"):
        tiny_config(tiny_model_dir, "optim.shared_prompts=true", "model.gradient_checkpointing=true")


def test_shared_prompts_by_default_where_the_model_allows_them(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """optim.shared_prompts left at null is on for the shipped attention (sdpa), and off, in one line, with an
    attention that takes no 4-D mask or with gradient checkpointing (no KV cache), where true is refused."""
    trainer = Trainer(tiny_config(tiny_model_dir), run_dir=tmp_path / "sdpa")
    assert trainer.logprob_options.shared_prompts is True
    trainer.run.release()

    trainer = Trainer(
        tiny_config(tiny_model_dir, "model.gradient_checkpointing=true"), run_dir=tmp_path / "ckpt"
    )
    assert trainer.logprob_options.shared_prompts is False
    assert "optim.shared_prompts: off with model.gradient_checkpointing=true" in capsys.readouterr().out
    trainer.run.release()

    monkeypatch.setattr(
        "ebpo.trainer.setup.in_kernel_gqa",
        lambda model: setattr(model.config, "_attn_implementation", "flash_attention_2"),
    )
    trainer = Trainer(tiny_config(tiny_model_dir), run_dir=tmp_path / "flash")
    assert trainer.logprob_options.shared_prompts is False
    assert "optim.shared_prompts: off with 'flash_attention_2' attention" in capsys.readouterr().out
    trainer.run.release()
