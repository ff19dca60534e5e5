"""``model.dtype=bfloat16`` as verl and TRL users expect: the forward passes compute in bfloat16 (autocast),
the weights and the optimizer's state stay float32, so an update smaller than bfloat16's spacing still moves
the weights; float32 runs are left exactly as they are."""

from __future__ import annotations

import pytest
import torch

from ebpo.trainer.setup import mixed_precision
from ebpo.trainer.trainer import Trainer
from helpers.trainer import tiny_config


def test_bfloat16_computes_in_bfloat16_and_keeps_the_small_update_in_float32_masters(
    tiny_model_dir, tmp_path
):
    # Adam's first update moves every weight with a gradient by lr = 1e-6 (m / sqrt(v) = sign(g)), its second
    # (the tiny config makes two per step) by at most about as much again. The tiny model's weights are drawn
    # with standard deviation 0.02; for |w| >= 2^-10 (all but about 4% of them) bfloat16's spacing is at least
    # 2^-10 * 2^-7 = 7.6e-6: a change of 2e-6 is below half of it, so bfloat16 weights round it away, while
    # float32 (spacing 2^-10 * 2^-23 there) keeps it.
    cfg = tiny_config(tiny_model_dir, "model.dtype=bfloat16", "optim.lr=1e-6", "run.steps=1")
    trainer = Trainer(cfg, run_dir=tmp_path / "run")
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    ids = torch.tensor([[1, 2, 3]])
    assert trainer.model(input_ids=ids).logits.dtype == torch.bfloat16  # the forward runs under autocast
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert {p.dtype for p in after.values()} == {torch.float32}
    for state in trainer.optimizer.state.values():
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32

    weight = "model.layers.0.mlp.down_proj.weight"
    moved_W = after[weight].detach() - before[weight]
    assert (moved_W != 0).float().mean() > 0.9  # the float32 masters moved
    assert moved_W.abs().max() < 2.5e-6  # by about 2 lr
    as_bfloat16_W = (before[weight].bfloat16() + moved_W.bfloat16()).float()
    lost = as_bfloat16_W == before[weight].bfloat16().float()  # the same update applied to bfloat16 weights
    assert lost.float().mean() > 0.9

    # the checkpoint holds the float32 weights, and a resume continues from them
    saved = Trainer(
        tiny_config(tiny_model_dir, "model.dtype=bfloat16", "optim.lr=1e-6", "run.steps=1"),
        resume=tmp_path / "run",
    )
    assert torch.equal(dict(saved.model.named_parameters())[weight], after[weight])


def test_float32_leaves_the_model_as_it_is(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    forward = model.forward
    mixed_precision(model, "float32")
    assert model.forward == forward  # no wrapper: float32 runs compute exactly as before
    mixed_precision(model, "bfloat16")
    assert model(input_ids=torch.tensor([[1, 2]])).logits.dtype == torch.bfloat16
    assert next(model.parameters()).dtype == torch.float32


def test_float16_is_refused_with_the_choices(tiny_model_dir):
    from ebpo.errors import ConfigError

    with pytest.raises(ConfigError, match=r"model.dtype.*'float16'.*bfloat16, float32"):
        tiny_config(tiny_model_dir, "model.dtype=float16")
