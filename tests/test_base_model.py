"""The warm-started arith base model: SFT pieces, a scaled-down build, save/load, caching, determinism, CLI."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
import torch

from ebpo.models import base_model as bm
from ebpo.models.tiny import build_char_tokenizer

# A build that takes a few seconds: a 2-layer width-32 model, 40 steps, one validation problem per cell.
TINY = bm.BaseModelConfig(
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    steps=40,
    batch_size=16,
    lr=1e-2,
    warmup_steps=5,
    train_problems=450,
    eval_per_cell=1,
    max_new_tokens=6,
)


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    """One tiny build shared by the tests that only read it."""
    cache = tmp_path_factory.mktemp("ebpo-cache")
    path = bm.build_base_model(TINY, progress=False, cache_dir=cache)
    return cache, path


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


# --- pieces -------------------------------------------------------------------------------------------------


def test_encode_sft_example_masks_the_prompt_and_ends_with_eos():
    tok = build_char_tokenizer()
    ids, labels = bm.encode_sft_example(tok, "2^3=", "8")
    # Five characters "2", "^", "3", "=", "8" plus EOS, no BOS; the loss sees "8" and EOS only.
    assert tok.convert_ids_to_tokens(ids) == ["2", "^", "3", "=", "8", "</s>"]
    assert labels == [-100, -100, -100, -100, ids[4], tok.eos_token_id]


def test_epoch_batches_cover_each_example_once_in_shuffled_order():
    batches = bm._epoch_batches(1000, batch_size=16, rng=random.Random(1))
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == list(range(1000))  # a permutation: one epoch
    assert [len(b) for b in batches] == [16] * 62 + [8]  # 1000 = 62 * 16 + 8
    assert flat != list(range(1000))  # shuffled
    assert batches == bm._epoch_batches(1000, batch_size=16, rng=random.Random(1))  # seeded


def test_lr_schedule_warms_up_then_decays_to_a_tenth():
    cfg = replace(TINY, lr=1.0, warmup_steps=4, steps=104)
    # warm-up: (step + 1) / 4; then 0.1 + 0.9 * (1 + cos(pi * progress)) / 2 with progress = (step - 4) / 100
    assert [bm._lr_at(s, cfg) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert bm._lr_at(54, cfg) == pytest.approx(0.55)  # progress 0.5: 0.1 + 0.9 * 0.5
    assert bm._lr_at(104, cfg) == pytest.approx(0.1)


def test_config_validation_and_key():
    with pytest.raises(ValueError, match="hidden_size .* divisible by num_heads"):
        bm.BaseModelConfig(hidden_size=30, num_heads=4)
    with pytest.raises(ValueError, match="BaseModelConfig.batch_size must be >= 1"):
        bm.BaseModelConfig(batch_size=0)
    assert bm.BaseModelConfig().key() == bm.BaseModelConfig().key()
    assert len({bm.BaseModelConfig(seed=s).key() for s in range(5)}) == 5
    assert replace(TINY, lr=2e-2).key() != TINY.key()


def test_key_changes_with_the_arith_generator_source(monkeypatch, tmp_path):
    from ebpo.tasks import arith

    before = TINY.key()
    edited = tmp_path / "arith.py"
    edited.write_bytes(open(arith.__file__, "rb").read() + b"\n# new level ranges\n")
    monkeypatch.setattr(arith, "__file__", str(edited))
    assert TINY.key() != before  # a changed generator never reuses a model trained on the old data


def test_cache_location_follows_ebpo_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("EBPO_CACHE", str(tmp_path))
    expected = tmp_path / "base_models" / f"arith-{bm.BaseModelConfig().key()}"
    assert bm.default_base_model_path() == expected
    assert bm.base_model_path(TINY, cache_dir=tmp_path / "other").parent == tmp_path / "other" / "base_models"


def test_sft_lowers_the_answer_loss():
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    from transformers import LlamaForCausalLM

    from ebpo.models.tiny import tiny_config

    model = LlamaForCausalLM(tiny_config(len(tok), hidden_size=32, num_layers=1, num_heads=2))
    losses = bm.train_sft(model, tok, replace(TINY, steps=60), progress=False)
    assert len(losses) == 60 and all(map(torch.isfinite, torch.tensor(losses)))
    # Start: about ln(vocab = 100) = 4.6; the answer alphabet is 11 digits + "-" + EOS, learnt within steps.
    assert losses[0] > 4.0
    assert sum(losses[-10:]) / 10 < 2.5


def test_format_grid_and_summary():
    grid = {"mod": {1: 1.0, 2: 0.5}, "dot": {1: 0.0, 2: 0.25}}
    table = bm.format_grid(grid)
    assert table.splitlines()[0] == "| topic | L1 | L2 | mean |"
    assert "| mod | 1.00 | 0.50 | 0.75 |" in table
    assert "| mean | 0.50 | 0.38 | 0.44 |" in table  # level means 0.5 and 0.375, overall 0.4375
    assert bm.grid_summary(grid) == {"cells": 4, "near_0": 1, "near_1": 1, "between": 2}


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
    assert (
        sum(p.numel() for p in model.parameters())
        == json.loads((path / bm.BUILD_INFO).read_text())["num_parameters"]
    )
    # The loaded weights are the saved ones, and the model answers (greedy) with tokens of the char vocabulary.
    saved = _weights(path)
    assert all(
        torch.equal(saved[name], tensor) for name, tensor in model.state_dict().items() if name in saved
    )
    text = bm.sample_answers(model, tokenizer, ["2^3=", "max(1,2,3)="], temperature=0.0, max_new_tokens=4)
    assert len(text) == 2 and all(isinstance(t, str) for t in text)


def test_build_info_holds_config_and_a_full_grid(tiny_cache):
    _, path = tiny_cache
    info = bm.load_build_info(path)
    assert info["config"] == json.loads(json.dumps(bm.asdict(TINY)))
    assert info["key"] == TINY.key() and info["build_seconds"] > 0
    assert len(info["grid"]) == 9 and all(len(row) == 5 for row in info["grid"].values())
    assert all(0.0 <= rate <= 1.0 for row in info["grid"].values() for rate in row.values())
    assert info["grid_summary"]["cells"] == 45
    with pytest.raises(FileNotFoundError, match="not a finished base-model build"):
        bm.load_build_info(path.parent)


def test_second_call_reuses_the_cache_without_training(tiny_cache, monkeypatch):
    cache, path = tiny_cache
    before = (path / bm.BUILD_INFO).stat().st_mtime_ns

    def no_training(*args, **kwargs):
        raise AssertionError("the cached model was retrained")

    monkeypatch.setattr(bm, "train_sft", no_training)
    assert bm.build_base_model(TINY, progress=False, cache_dir=cache) == path
    assert (path / bm.BUILD_INFO).stat().st_mtime_ns == before


def test_force_rebuilds_identically_and_another_seed_differs(tiny_cache, monkeypatch):
    cache, path = tiny_cache
    first = _weights(path)
    calls = []
    real_train = bm.train_sft
    monkeypatch.setattr(bm, "train_sft", lambda *a, **k: calls.append(1) or real_train(*a, **k))
    assert bm.build_base_model(TINY, force=True, progress=False, cache_dir=cache) == path
    assert calls == [1]  # --force trained again ...
    rebuilt = _weights(path)
    assert all(torch.equal(first[name], rebuilt[name]) for name in first)  # ... to the same weights (seeded)
    assert not list(path.parent.glob(".*tmp*"))  # no staging directory left behind
    other = bm.build_base_model(replace(TINY, seed=1, eval_per_cell=0), progress=False, cache_dir=cache)
    assert other != path and calls == [1, 1]
    assert not torch.equal(_weights(other)["model.embed_tokens.weight"], first["model.embed_tokens.weight"])


def test_cli_builds_into_cache_dir_and_prints_the_path_last(tmp_path, capsys):
    from ebpo.cli import main

    argv = [
        "base-model",
        "--cache-dir",
        str(tmp_path),
        "--hidden-size",
        "32",
        "--num-layers",
        "1",
        "--num-heads",
        "2",
        "--steps",
        "3",
        "--batch-size",
        "8",
        "--train-problems",
        "45",
        "--eval-per-cell",
        "0",
        "--quiet",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    expected = bm.base_model_path(
        bm.BaseModelConfig(
            hidden_size=32,
            num_layers=1,
            num_heads=2,
            steps=3,
            batch_size=8,
            train_problems=45,
            eval_per_cell=0,
        ),
        tmp_path,
    )
    assert printed == [str(expected)] and bm.is_built(expected)
    assert main(argv[:-1]) == 0  # cached now: says so, prints the path
    out = capsys.readouterr().out
    assert "reusing cached base model" in out and out.strip().endswith(str(expected))


def test_sft_pool_follows_the_level_weights():
    from collections import Counter

    from ebpo.tasks import arith

    config = replace(TINY, train_problems=10, level_weights=(2.0, 1.0, 1.0, 0.0, 0.0))
    records = bm.sft_records(config)
    # 10 * 2/4 = 5, 10 * 1/4 = 2.5 -> 2, 2.5 -> 2, 0, 0: 9 problems, the remaining one goes to level 1.
    assert Counter(r.level for r in records) == {1: 6, 2: 2, 3: 2}
    assert all(arith.split_of(r.prompt) == "train" for r in records)
    with pytest.raises(ValueError, match="level_weights needs 5 non-negative weights"):
        replace(TINY, level_weights=(1.0, 1.0))


def test_cli_help_documents_every_config_field(capsys):
    from ebpo.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["base-model", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # undo argparse's line wrapping
    for f in bm.fields(bm.BaseModelConfig):
        assert f"--{f.name.replace('_', '-')}" in text
    assert "--force" in text and "--cache-dir" in text and "cosine decay to 10%" in text
