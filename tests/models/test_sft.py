"""``ebpo.models.sft``: the SFT examples, batches and learning-rate schedule, and a run that a prefix repeats."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from ebpo.models import sft
from ebpo.models.recipes import arith as recipe
from ebpo.models.tiny import build_char_tokenizer
from helpers.base_model import TINY


def test_encode_sft_example_masks_the_prompt_and_ends_with_eos():
    tok = build_char_tokenizer()
    ids, labels = sft.encode_sft_example(tok, "2^3=", "8")
    # Five characters "2", "^", "3", "=", "8" plus EOS, no BOS; the loss sees "8" and EOS only.
    assert tok.convert_ids_to_tokens(ids) == ["2", "^", "3", "=", "8", "</s>"]
    assert labels == [-100, -100, -100, -100, ids[4], tok.eos_token_id]


def test_epoch_batches_cover_each_example_once_in_shuffled_order():
    batches = sft.epoch_batches(1000, batch_size=16, rng=random.Random(1))
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == list(range(1000))  # a permutation: one epoch
    assert [len(b) for b in batches] == [16] * 62 + [8]  # 1000 = 62 * 16 + 8
    assert flat != list(range(1000))  # shuffled
    assert batches == sft.epoch_batches(1000, batch_size=16, rng=random.Random(1))  # seeded


def test_lr_schedule_warms_up_then_decays_to_a_tenth():
    cfg = replace(TINY, lr=1.0, warmup_steps=4, steps=104)
    # warm-up: (step + 1) / 4; then 0.1 + 0.9 * (1 + cos(pi * progress)) / 2 with progress = (step - 4) / 100
    assert [sft.lr_at(s, cfg) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert sft.lr_at(54, cfg) == pytest.approx(0.55)  # progress 0.5: 0.1 + 0.9 * 0.5
    assert sft.lr_at(104, cfg) == pytest.approx(0.1)


def test_sft_lowers_the_answer_loss_and_a_prefix_equals_the_start_of_the_full_run():
    from ebpo.models.build import state_dict_sha256
    from ebpo.models.recipes.arith import new_model as _new_model

    cfg = replace(TINY, steps=60)
    model, tok = _new_model(cfg)
    losses = recipe.train_sft(model, tok, cfg, progress=False)
    assert len(losses) == 60 and all(map(torch.isfinite, torch.tensor(losses)))
    # Start: about ln(vocab = 100) = 4.6; the label alphabet is 11 digits + "-" + EOS, learnt within steps.
    assert losses[0] > 4.0
    assert sum(losses[-10:]) / 10 < 2.8
    # stop_after runs the first steps of the same schedule: the same losses, and deterministic weights
    prefix_model, _ = _new_model(cfg)
    assert recipe.train_sft(prefix_model, tok, cfg, progress=False, stop_after=7) == losses[:7]
    again, _ = _new_model(cfg)
    recipe.train_sft(again, tok, cfg, progress=False, stop_after=7)
    assert state_dict_sha256(again) == state_dict_sha256(prefix_model)
