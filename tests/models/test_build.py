"""``ebpo.models.build``: the cache location, the weights' hash, and a scaled-down build (save/load, caching,
determinism). The shipped models: tests/models/test_shipped.py."""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import replace

import pytest
import torch

from ebpo.models import build as bm
from ebpo.models import grid as grid_mod
from ebpo.models.recipes import arith as recipe
from ebpo.models.tiny import build_char_tokenizer
from helpers.base_model import TINY


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    """One tiny build shared by the tests that only read it."""
    cache = tmp_path_factory.mktemp("ebpo-cache")
    path = bm.build_base_model(TINY, progress=False, cache_dir=cache)
    return cache, path


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_cache_location_follows_ebpo_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("EBPO_CACHE", str(tmp_path))
    expected = tmp_path / "base_models" / f"arith-{TINY.key()}"
    assert bm.base_model_path(TINY) == expected
    assert bm.base_model_path(TINY, cache_dir=tmp_path / "other").parent == tmp_path / "other" / "base_models"


def test_state_dict_hash_sees_a_one_bit_change():
    model = torch.nn.Linear(3, 2)
    before = bm.state_dict_sha256(model)
    with torch.no_grad():
        model.weight.view(-1)[0] = torch.nextafter(model.weight.view(-1)[0], torch.tensor(10.0))
    assert bm.state_dict_sha256(model) != before


# --- the build ------------------------------------------------------------------------------------------------


def test_build_saves_a_loadable_model_and_tokenizer(tiny_cache):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache, path = tiny_cache
    assert path == bm.base_model_path(TINY, cache_dir=cache) and bm.is_built(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    reference = build_char_tokenizer()
    prompt = "(-3)^3="
    assert tokenizer(prompt, add_special_tokens=False)["input_ids"] == reference(prompt)["input_ids"]
    assert tokenizer.decode(tokenizer(prompt)["input_ids"]) == prompt
    assert tokenizer.eos_token_id == model.generation_config.eos_token_id == reference.eos_token_id
    info = bm.load_build_info(path)
    assert sum(p.numel() for p in model.parameters()) == info["num_parameters"]
    # the loaded weights are the saved ones, and their hash is the recorded one
    assert bm.state_dict_sha256(model) == info["weights_sha256"]


def test_build_info_holds_recipe_hashes_and_a_full_grid(tiny_cache):
    _, path = tiny_cache
    info = bm.load_build_info(path)
    assert info["config"] == json.loads(json.dumps(dataclasses.asdict(TINY)))
    assert info["key"] == TINY.key() and info["threads"] == 1 and info["train_seconds"] > 0
    assert info["prefix_steps"] == bm.PREFIX_STEPS and info["prefix_sha256"] == bm.train_prefix_sha256(TINY)
    grid = grid_mod.normalize_grid(info["grid_validation"])
    assert len(grid) == 9 and all(len(row) == 5 for row in grid.values())
    assert all(
        0.0 <= cell[m] <= 1.0 for row in grid.values() for cell in row.values() for m in grid_mod.GRID_METRICS
    )
    assert all(
        sum(cell["kinds"].values()) == pytest.approx(1.0) for row in grid.values() for cell in row.values()
    )
    with pytest.raises(FileNotFoundError, match=rf"{re.escape(str(path.parent / bm.BUILD_INFO))} "):
        bm.load_build_info(path.parent)


def test_second_call_reuses_the_cache_without_training(tiny_cache, monkeypatch):
    cache, path = tiny_cache
    before = (path / bm.BUILD_INFO).stat().st_mtime_ns

    def no_training(*args, **kwargs):
        raise AssertionError("the cached model was retrained")

    monkeypatch.setattr(recipe, "train_sft", no_training)
    assert bm.build_base_model(TINY, progress=False, cache_dir=cache) == path
    assert (path / bm.BUILD_INFO).stat().st_mtime_ns == before


def test_force_rebuilds_identically_and_another_seed_differs(tiny_cache, monkeypatch):
    cache, path = tiny_cache
    first = _weights(path)
    calls = []
    real_train = recipe.train_sft
    monkeypatch.setattr(recipe, "train_sft", lambda *a, **k: calls.append(1) or real_train(*a, **k))
    assert bm.build_base_model(TINY, force=True, progress=False, cache_dir=cache) == path
    assert calls == [1, 1]  # --force trained again (the recorded prefix, then the full run) ...
    rebuilt = _weights(path)
    assert all(torch.equal(first[name], rebuilt[name]) for name in first)  # ... to the same weights (seeded)
    assert not list(path.parent.glob(".*tmp*"))  # no staging directory left behind
    other = bm.build_base_model(replace(TINY, seed=1, eval_per_cell=0), progress=False, cache_dir=cache)
    assert other != path and len(calls) == 4
    assert not torch.equal(_weights(other)["model.embed_tokens.weight"], first["model.embed_tokens.weight"])


def test_the_build_runs_on_one_thread_and_restores_the_count(tmp_path, monkeypatch):
    seen = []
    real_train = recipe.train_sft
    monkeypatch.setattr(
        recipe, "train_sft", lambda *a, **k: seen.append(torch.get_num_threads()) or real_train(*a, **k)
    )
    torch.set_num_threads(2)
    try:
        bm.build_base_model(replace(TINY, steps=3, eval_per_cell=0), progress=False, cache_dir=tmp_path)
        assert seen == [1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)


def test_out_dir_builds_there(tmp_path):
    cfg = replace(TINY, steps=3, eval_per_cell=0)
    path = bm.build_base_model(cfg, progress=False, out_dir=tmp_path / "model")
    assert path == tmp_path / "model" and bm.load_build_info(path)["key"] == cfg.key()
