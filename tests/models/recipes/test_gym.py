"""The gym base model's recipe (``ebpo.models.recipes.gym``) through the recipe registry (``ebpo.models.recipes``)
and the build (``ebpo.models.build``): the teacher, the key, a tiny build (Qwen3, BPE tokenizer with the answer
tags, ChatML, two EOS ids), its cache and prefix determinism, and ``ebpo base-model --recipe gym``."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import replace

import pytest

pytest.importorskip("reasoning_gym", reason="the gym base model needs the ebpo[gym] extra")

from ebpo.data import Record  # noqa: E402
from ebpo.models import build as bm  # noqa: E402
from ebpo.models.recipes import gym as gr  # noqa: E402

# A build that takes seconds: 1 layer of width 16, 20 steps (10 clean), 10 SFT problems per cell.
TINY = gr.GymBaseModelConfig(
    vocab_size=300,
    tokenizer_problems=240,
    hidden_size=16,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    steps=20,
    clean_steps=10,
    batch_size=8,
    lr=1e-2,
    warmup_steps=2,
    train_problems=240,
    eval_per_cell=1,
    eval_samples=2,
    max_new_tokens=8,
)


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory):
    cache = tmp_path_factory.mktemp("ebpo-cache")
    return cache, bm.build_base_model(TINY, progress=False, cache_dir=cache)


def _record(dataset: str, level: int, answer: str) -> Record:
    entry = json.dumps({"dataset": dataset, "answer": answer, "metadata": {}})
    return Record(id="r", prompt="p", answer=entry, topic=dataset, level=level)


def test_run_ons_by_hand():
    one = replace(TINY, run_on_chars=(1,))
    assert gr.wrong_labels("42", one) == [f"42{d}" for d in range(10)]
    assert gr.wrong_labels("-7", one)[:2] == ["-70", "-71"]  # the sign stays
    assert gr.wrong_labels("0", one) == [f"0{d}" for d in range(1, 10)]  # "00" reads 0: not a wrong label
    assert gr.wrong_labels("nus", one) == [f"nus{c}" for c in "abcdefghijklmnopqrstuvwxyz"]  # a word: letters
    assert len(gr.wrong_labels("42", TINY)) == 10 + 100 and len(gr.wrong_labels("ab", TINY)) == 26 + 26 * 26
    assert gr.response_text("42") == "<answer>42</answer>"


def test_teacher_writes_the_answer_with_its_accuracy():
    cfg = replace(TINY, teacher_accuracy=(0.5,) + (1.0,) * 7, teacher_level_factor=(1.0, 0.5, 0.0))
    assert gr.teacher_accuracy(cfg, "chain_sum", 2) == 0.25 and gr.teacher_accuracy(cfg, "gcd", 3) == 0.0
    rng = random.Random(0)
    labels = Counter(gr.teacher_label(_record("chain_sum", 2, "42"), cfg, rng) for _ in range(20_000))
    assert labels["42"] / 20_000 == pytest.approx(0.25, abs=0.015)  # 4 standard errors
    assert set(labels) - {"42"} <= set(gr.wrong_labels("42", cfg))
    # the 110 run-ons share the rest uniformly: each 0.75 / 110 = 0.0068
    assert max(n for label, n in labels.items() if label != "42") / 20_000 < 0.0068 + 0.004
    assert gr.teacher_label(_record("gcd", 1, "6"), cfg, rng) == "6"


def test_config_validation_and_key():
    with pytest.raises(ValueError, match=r"teacher_accuracy needs 8 probabilities"):
        gr.GymBaseModelConfig(teacher_accuracy=(0.5,) * 7)
    with pytest.raises(ValueError, match=r"num_heads by num_kv_heads"):
        gr.GymBaseModelConfig(num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match=r"vocab_size must be >= 259"):
        gr.GymBaseModelConfig(vocab_size=100)
    assert TINY.key() == replace(TINY).key() and replace(TINY, lr=2e-2).key() != TINY.key()
    assert replace(TINY, lr=1).key() == replace(TINY, lr=1.0).key()  # one recipe, one key


def test_key_follows_the_generators_and_the_teacher(monkeypatch):
    before = TINY.key()
    monkeypatch.setattr(gr, "wrong_labels", lambda answer, config: [answer + "x"])
    assert TINY.key() != before  # the teacher's labels are in the fingerprint
    monkeypatch.undo()
    monkeypatch.setitem(
        gr.MIXTURE, "gcd", {"levels": {1: {"max_value": 21}, 2: {"max_value": 50}, 3: {"max_value": 100}}}
    )
    assert TINY.key() != before  # so are the generators' problems


def test_a_tiny_build_is_a_qwen3_chat_model(tiny_build):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ebpo.data.prompts import PromptFormat

    cache, path = tiny_build
    assert path == cache / "base_models" / f"gym-{TINY.key()}"
    info = bm.load_build_info(path)
    assert info["recipe"] == "gym" and info["key"] == TINY.key() and len(info["loss_every_100_steps"]) == 1
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert model.config.model_type == "qwen3" and model.config.num_key_value_heads == 1
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template
    im_end, endoftext = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert model.generation_config.eos_token_id == [im_end, endoftext]
    answer = tokenizer("<answer>42</answer>", add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(answer) == [
        "<answer>",
        "4",
        "2",
        "</answer>",
    ]  # tags: one token each
    assert tokenizer.decode(answer) == "<answer>42</answer>"
    # the prompt the model learnt from is the one every command renders (the chat template)
    record = gr.sft_records(TINY)[0]
    rendered = PromptFormat.resolve(tokenizer, "auto").texts([record])[0]
    assert rendered == f"<|im_start|>user\n{record.prompt}<|im_end|>\n<|im_start|>assistant\n"
    assert set(info["grid_validation"]) == set(gr.DATASETS)
    assert all(set(row) == {1, 2, 3} for row in bm_grid(info).values())


def bm_grid(info):
    from ebpo.models.grid import normalize_grid

    return normalize_grid(info["grid_validation"])


def test_the_build_is_cached_and_its_prefix_is_deterministic(tiny_build):
    cache, path = tiny_build
    written = (path / "model.safetensors").stat().st_mtime_ns
    assert bm.build_base_model(TINY, progress=False, cache_dir=cache) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == written  # reused, not rebuilt
    assert bm.train_prefix_sha256(TINY, 5) == bm.train_prefix_sha256(TINY, 5)
    assert bm.load_build_info(path)["prefix_sha256"] == bm.train_prefix_sha256(TINY, bm.PREFIX_STEPS)


def test_sft_examples_are_the_templated_prompt_then_the_tagged_label(monkeypatch):
    from ebpo.data.prompts import PromptFormat
    from ebpo.models import sft

    seen = []
    real = sft.run_sft

    def spy(model, config, *, examples, **kwargs):
        def recorded(step, batch):
            out = examples(step, batch)
            seen.append((step, batch, out))
            return out

        return real(model, config, examples=recorded, **kwargs)

    monkeypatch.setattr(sft, "run_sft", spy)
    cfg = replace(TINY, steps=4, clean_steps=2, teacher_accuracy=(0.0,) * 8)  # noisy steps: never right
    model, tokenizer = gr.new_model(cfg)
    gr.train(model, tokenizer, cfg, progress=False)
    records = gr.sft_records(cfg)
    prompts = PromptFormat(tokenizer, chat=True).ids(records)
    eos = tokenizer.eos_token_id
    assert [step for step, _, _ in seen] == [0, 1, 2, 3]
    for step, batch, examples in seen:
        for i, (ids, labels) in zip(batch, examples):
            n = len(prompts[i])
            assert ids[:n] == prompts[i] and labels[:n] == [-100] * n and labels[n:] == ids[n:]
            assert ids[-1] == eos
            label = tokenizer.decode(ids[n:-1])
            gold = gr.gold_answer(records[i])
            if step < 2:
                assert label == gr.response_text(gold)
            else:
                assert label in {gr.response_text(w) for w in gr.wrong_labels(gold, cfg)}


def test_cli_builds_and_reports_the_gym_recipe(tmp_path, capsys):
    from ebpo.cli import main

    flags = ["--recipe", "gym", "--cache-dir", str(tmp_path), "--quiet", "--vocab-size", "300"]
    flags += ["--tokenizer-problems", "240", "--hidden-size", "16", "--num-layers", "1", "--num-heads", "2"]
    flags += ["--num-kv-heads", "1", "--steps", "3", "--clean-steps", "2", "--batch-size", "8"]
    flags += ["--train-problems", "240", "--eval-per-cell", "0"]
    assert main(["base-model", *flags]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed.startswith(str(tmp_path / "base_models" / "gym-"))
    assert main(["base-model", "--recipe", "gm"]) == 2
    assert (
        "ebpo base-model: error: unknown base-model recipe 'gm'; valid choices: arith, gym"
        in capsys.readouterr().err
    )
    assert main(["base-model", "--recipe", "gym", "--teacher-accuracy", "0.5", "--quiet"]) == 2
    assert "teacher_accuracy needs 8 probabilities" in capsys.readouterr().err
