"""The base model shipped in ``ebpo/models/arith_base/``: is it what the current recipe builds?

What these tests prove, and what they do not (docs/base_model.md, "The shipped model and its guard"):

- the recorded recipe key equals the current recipe's key: the config, FORMAT_VERSION and what the
  generator and the teacher produce on a fixed sample are those the model was built from;
- the shipped weights are the ones the build recorded (their SHA-256), and load;
- the first PREFIX_STEPS SFT steps of the current code, rebuilt here on one thread, give the recorded
  hash bit for bit: the data, labels, batch order, initialisation, optimizer and schedule of the build
  are unchanged (on the torch version and CPU kernel set of the build, which build_info.json records;
  skipped elsewhere, naming both);
- ``build_base_model()`` returns the shipped directory without training;
- the shipped model has the latent skill it was built for, re-measured on fresh validation problems.

Not proven here: that steps PREFIX_STEPS..steps would reproduce the weights. Only the full rebuild does
that, ``ebpo base-model --check`` (about 20 minutes on one core).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ebpo.models import build as bm
from ebpo.models import kernels
from ebpo.models.recipes import arith as recipe


@pytest.fixture(scope="module")
def info():
    if not bm.is_built(recipe.SHIPPED_DIR):
        pytest.fail(
            f"no shipped base model in {recipe.SHIPPED_DIR}: rebuild it with `ebpo base-model --out` there"
        )
    return bm.load_build_info(recipe.SHIPPED_DIR)


def test_the_shipped_model_was_built_from_the_current_recipe(info):
    assert info["key"] == recipe.BaseModelConfig().key(), (
        "the recipe, FORMAT_VERSION, the arith generator or the teacher changed since the shipped model was "
        "built: rebuild it (`ebpo base-model --force --out src/ebpo/models/arith_base`) and commit the files"
    )
    current = dataclasses.asdict(recipe.BaseModelConfig())
    current |= {k: list(v) for k, v in current.items() if isinstance(v, tuple)}
    # fields added since the build (recipe.ADDED_FIELDS) are absent from its record; at their neutral value
    recorded = info["config"] | {
        k: list(v) for k, v in recipe.ADDED_FIELDS.items() if k not in info["config"]
    }
    assert recorded == current
    assert info["threads"] == 1


def test_the_shipped_weights_are_the_recorded_ones_and_load(info):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(recipe.SHIPPED_DIR)
    tokenizer = AutoTokenizer.from_pretrained(recipe.SHIPPED_DIR)
    assert bm.state_dict_sha256(model) == info["weights_sha256"]
    assert sum(p.numel() for p in model.parameters()) == info["num_parameters"]
    assert tokenizer.decode(tokenizer("max(3,9,4)=")["input_ids"]) == "max(3,9,4)="


@pytest.mark.golden
def test_the_first_sft_steps_rebuild_bit_for_bit(info):
    """Natively (no kernel pinned): holds on the torch, ATen capability and CPU the build recorded (MKL's
    kernels follow the CPU's vendor and model, not only its instruction set); elsewhere it skips, naming them."""
    reason = kernels.platform_difference(info)
    if reason:
        pytest.skip(reason)
    assert info["prefix_steps"] == bm.PREFIX_STEPS
    assert bm.train_prefix_sha256(recipe.BaseModelConfig()) == info["prefix_sha256"]


@pytest.mark.golden
def test_the_first_sft_steps_rebuild_bit_for_bit_in_portable_mode(info):
    """With ATen, oneDNN and MKL pinned and square roots computed portably (``ebpo.models.kernels``): one
    recorded hash on every x86-64 CPU with AVX2, Intel or AMD, with or without AVX-512 or AMX (for the torch
    release it was recorded with; skipped on another, naming both)."""
    reason = kernels.portable_difference(info)
    if reason:
        pytest.skip(reason)
    sha, capability = bm.portable_prefix_sha256(recipe.BaseModelConfig(), info["prefix_steps"])
    if sha is None:
        pytest.skip(capability)
    assert sha == info["portable_prefix_sha256"]


def test_build_base_model_returns_the_shipped_directory_without_training(monkeypatch, tmp_path):
    def no_training(*args, **kwargs):
        raise AssertionError("the shipped model was rebuilt")

    monkeypatch.setattr(recipe, "train_sft", no_training)
    monkeypatch.setenv("EBPO_CACHE", str(tmp_path))
    assert bm.build_base_model(progress=False) == recipe.SHIPPED_DIR
    assert bm.default_base_model_path() == recipe.SHIPPED_DIR
    assert not (tmp_path / "base_models").exists()  # nothing written to the cache


def test_the_shipped_model_has_latent_skill():
    """Fresh validation problems (seed 7, not the build's grid seed): the majority answer of 8 samples is
    right far more often than one sample, and some cells are mostly failed while others are mostly solved."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ebpo.models.grid import evaluate_grid, grid_means

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(recipe.SHIPPED_DIR).eval()
    tokenizer = AutoTokenizer.from_pretrained(recipe.SHIPPED_DIR)
    grid = evaluate_grid(model, tokenizer, split="validation", per_cell=8, samples=8, seed=7)
    means = grid_means(grid)
    # 360 problems: the standard error of each mean is about 0.02, of each gap about 0.017. Measured here
    # (seeded, so exactly this): pass@1 0.263, maj@8 0.444 (+0.182), greedy 0.533 (+0.271); on the build's
    # 1800-problem grid: 0.280, 0.479 (+0.199), 0.576 (+0.296). The bounds leave about 3 standard errors.
    assert means["maj@n"] - means["pass@1"] > 0.12, means
    assert means["greedy"] - means["pass@1"] > 0.2, means
    rates = [cell["pass@1"] for row in grid.values() for cell in row.values()]
    assert min(rates) <= 0.1 and max(rates) >= 0.8, sorted(rates)
