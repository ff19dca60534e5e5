"""S2, the gym base model shipped in ``ebpo/models/gym_base/``: is it what the current recipe builds?

The same guard as S1's (tests/test_shipped_model.py, docs/base_model.md): the recorded key is the current recipe's
(config, FORMAT_VERSION, what reasoning-gym's generators and the teacher produce on a fixed sample); the weights
are the recorded ones; the first PREFIX_STEPS SFT steps rebuild bit for bit on the build's torch and CPU kernels
(tokenizer training included); ``build_base_model`` returns the shipped directory without training; it loads as a
Qwen3 chat model; and it has the latent skill it was built for, on fresh validation problems. Only ``ebpo
base-model --recipe gym --check`` proves the remaining steps.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip(
    "reasoning_gym", reason="S2's recipe key reads reasoning-gym's generators (the ebpo[gym] extra)"
)

from ebpo.models import build as bm  # noqa: E402
from ebpo.models import kernels  # noqa: E402
from ebpo.models.recipes import gym as gr  # noqa: E402

SHIPPED = gr.SHIPPED_DIR


@pytest.fixture(scope="module")
def info():
    if not bm.is_built(SHIPPED):
        pytest.fail(
            f"no shipped gym base model in {SHIPPED}: rebuild it with `ebpo base-model --recipe gym --out`"
        )
    return bm.load_build_info(SHIPPED)


def test_the_shipped_s2_was_built_from_the_current_recipe(info):
    assert info["key"] == gr.GymBaseModelConfig().key(), (
        "the gym recipe, its FORMAT_VERSION, reasoning-gym's generators or the teacher changed since S2 was built: "
        "rebuild it (`ebpo base-model --recipe gym --force --out src/ebpo/models/gym_base`) and commit the files"
    )
    current = dataclasses.asdict(gr.GymBaseModelConfig())
    assert info["config"] == current | {k: list(v) for k, v in current.items() if isinstance(v, tuple)}
    assert info["recipe"] == "gym" and info["threads"] == 1


def test_the_shipped_weights_load_as_a_qwen3_chat_model(info):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(SHIPPED)
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED)
    assert bm.state_dict_sha256(model) == info["weights_sha256"]
    assert (
        model.config.model_type == "qwen3"
        and sum(p.numel() for p in model.parameters()) == info["num_parameters"]
    )
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template
    assert model.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids(
        ["<|im_end|>", "<|endoftext|>"]
    )


@pytest.mark.golden
def test_the_first_sft_steps_rebuild_bit_for_bit(info):
    """Natively (no kernel pinned): holds on the torch, ATen capability and CPU the build recorded (MKL's
    kernels follow the CPU's vendor and model, not only its instruction set); elsewhere it skips, naming them."""
    reason = kernels.platform_difference(info)
    if reason:
        pytest.skip(reason)
    assert info["prefix_steps"] == bm.PREFIX_STEPS
    assert bm.train_prefix_sha256(gr.GymBaseModelConfig()) == info["prefix_sha256"]


@pytest.mark.golden
def test_the_first_sft_steps_rebuild_bit_for_bit_in_portable_mode(info):
    """With ATen, oneDNN and MKL pinned and square roots computed portably (``ebpo.models.kernels``): one
    recorded hash on every x86-64 CPU with AVX2, Intel or AMD, with or without AVX-512 or AMX (for the torch
    release it was recorded with; skipped on another, naming both)."""
    reason = kernels.portable_difference(info)
    if reason:
        pytest.skip(reason)
    sha, capability = bm.portable_prefix_sha256(gr.GymBaseModelConfig(), info["prefix_steps"])
    if sha is None:
        pytest.skip(capability)
    assert sha == info["portable_prefix_sha256"]


def test_build_base_model_returns_the_shipped_directory_without_training(monkeypatch, tmp_path):
    monkeypatch.setenv("EBPO_CACHE", str(tmp_path))
    assert bm.build_base_model(gr.GymBaseModelConfig(), progress=False) == SHIPPED
    assert not (tmp_path / "base_models").exists()  # nothing written to the cache


def test_the_shipped_s2_has_latent_skill():
    """Fresh validation problems (seed 7, not the build's grid seed 0): the majority answer of 8 samples is right
    far more often than one sample, and its cells range from mostly failed to mostly solved."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ebpo.models.grid import grid_means

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(SHIPPED).eval()
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED)
    grid = gr.evaluate_grid(model, tokenizer, split="validation", per_cell=8, samples=8, seed=7)
    means = grid_means(grid)
    # 192 problems: standard errors about 0.02 for each mean and each gap. Measured here (seeded, so exactly
    # this): pass@1 0.238, maj@8 0.453 (+0.215), greedy 0.500 (+0.262), cells from 0.02 to 0.50; on the build's
    # 720-problem grid 0.239, 0.444, 0.500. The bounds leave about 4 standard errors.
    assert 0.15 < means["pass@1"] < 0.35, means
    assert means["maj@n"] - means["pass@1"] > 0.12, means
    assert means["greedy"] - means["pass@1"] > 0.15, means
    rates = [cell["pass@1"] for row in grid.values() for cell in row.values()]
    assert min(rates) <= 0.1 and max(rates) >= 0.4, sorted(rates)
