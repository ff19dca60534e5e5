"""The arith base model: the noisy teacher, the SFT pieces, the grid, the recipe key, a scaled-down build
(save/load, caching, determinism) and the CLI. The shipped model itself: tests/test_shipped_model.py."""

from __future__ import annotations

import dataclasses
import json
import random
import re
from collections import Counter
from dataclasses import replace

import pytest
import torch

from ebpo.data import Record
from ebpo.models import build as bm
from ebpo.models import grid as grid_mod
from ebpo.models import sft
from ebpo.models.recipes import arith as recipe
from ebpo.models.tiny import build_char_tokenizer

# A build that takes a few seconds: a 2-layer width-32 model, 40 steps, one validation problem per cell.
TINY = recipe.BaseModelConfig(
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    steps=40,
    batch_size=16,
    lr=1e-2,
    warmup_steps=5,
    train_problems=450,
    eval_per_cell=1,
    eval_samples=2,
    max_new_tokens=6,
)


# The teacher of the earlier shipped models (D2): off by one or two, or one digit slipped (no run-ons). The
# default teacher runs on by one or two digits and writes no near misses.
NEAR_MISSES_ONLY = dict(near_miss_offsets=(-2, -1, 1, 2), near_miss_digit_slips=True, run_on_digits=())


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    """One tiny build shared by the tests that only read it."""
    cache = tmp_path_factory.mktemp("ebpo-cache")
    path = bm.build_base_model(TINY, progress=False, cache_dir=cache)
    return cache, path


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _record(topic: str, level: int, answer: int) -> Record:
    return Record(id="r", prompt="p=", answer=str(answer), topic=topic, level=level)


# --- the noisy teacher ----------------------------------------------------------------------------------------


def test_teacher_accuracy_is_topic_times_level_factor_clipped():
    cfg = replace(
        TINY, teacher_topic_accuracy=(0.8,) * 8 + (1.0,), teacher_level_factor=(1.0, 0.5, 0.25, 2.0, 0.0)
    )
    assert recipe.teacher_accuracy(cfg, "mod", 1) == 0.8  # mod is TOPICS[0]: 0.8 x 1.0
    assert recipe.teacher_accuracy(cfg, "mod", 2) == 0.4  # 0.8 x 0.5
    assert recipe.teacher_accuracy(cfg, "power", 3) == 0.25  # power is TOPICS[8]: 1.0 x 0.25
    assert recipe.teacher_accuracy(cfg, "power", 4) == 1.0  # 1.0 x 2.0, clipped to 1
    assert recipe.teacher_accuracy(cfg, "units", 5) == 0.0


def test_near_miss_adds_the_offset_but_never_turns_a_non_negative_answer_negative():
    assert recipe.near_miss(42, 10) == 52 and recipe.near_miss(42, -3) == 39
    assert recipe.near_miss(2, -3) == 5  # 2 - 3 = -1 < 0: reflected to 2 + 3
    assert recipe.near_miss(0, -1) == 1
    assert recipe.near_miss(-27, -10) == -37  # negative answers (powers, dot products) stay free
    assert recipe.near_miss(-2, 3) == 1


def test_digit_slips_replace_one_digit_without_a_leading_zero():
    assert recipe.digit_slips(7) == [0, 1, 2, 3, 4, 5, 6, 8, 9]
    # 42: first digit 1..9 but 4 (no leading 0), then second digit 0..9 but 2: 8 + 9 = 17 numbers
    assert recipe.digit_slips(42) == [12, 22, 32, 52, 62, 72, 82, 92, 40, 41, 43, 44, 45, 46, 47, 48, 49]
    assert recipe.digit_slips(-5) == [-0, -1, -2, -3, -4, -6, -7, -8, -9]  # the sign stays
    assert all(len(str(x)) == 3 for x in recipe.digit_slips(105))


def test_near_misses_are_distinct_sorted_and_never_the_answer():
    cfg = replace(TINY, near_miss_offsets=(-2, -1, 1, 2), near_miss_digit_slips=True)
    # 42 +- 1, 2 = 40, 41, 43, 44 are digit slips too: the union is the 17 slips
    assert recipe.near_misses(42, cfg) == sorted(recipe.digit_slips(42))
    # 0: offsets -2, -1 reflect to 2, 1; slips 1..9
    assert recipe.near_misses(0, cfg) == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    no_slips = replace(cfg, near_miss_digit_slips=False, near_miss_offsets=(-10, 10, 20))
    assert recipe.near_misses(5, no_slips) == [15, 25]  # 5 - 10 reflects to 15, a duplicate of 5 + 10


def test_teacher_labels_follow_the_accuracy_and_spread_over_the_near_misses():
    cfg = replace(
        TINY,
        teacher_topic_accuracy=(0.3,) * 9,
        teacher_level_factor=(1.0,) * 5,
        **NEAR_MISSES_ONLY,
    )
    rng = random.Random(0)
    record = _record("dot", 1, 50)
    labels = Counter(recipe.teacher_label(record, cfg, rng) for _ in range(20_000))
    # 17 digit slips (10..90 but 50: 8; 51..59: 9) plus 48 and 49 (50 - 2, 50 - 1 change both digits)
    misses = recipe.near_misses(50, cfg)
    assert len(misses) == 19 and set(labels) == {"50"} | {str(m) for m in misses}
    # P(right) = 0.3, each near miss (1 - 0.3) / 19 = 0.037; binomial sd over 20,000 draws:
    # sqrt(0.3 * 0.7 / 20000) = 0.0032 and sqrt(0.037 * 0.963 / 20000) = 0.0013.
    assert abs(labels["50"] / 20_000 - 0.3) < 0.015
    assert all(abs(labels[str(m)] / 20_000 - 0.7 / 19) < 0.007 for m in misses)
    # the right answer is the most frequent label: the majority vote of the teacher is right
    assert labels.most_common(1)[0][0] == "50"
    # seeded: the same generator state gives the same labels
    a, b = random.Random(5), random.Random(5)
    assert [recipe.teacher_label(record, cfg, a) for _ in range(50)] == [
        recipe.teacher_label(record, cfg, b) for _ in range(50)
    ]


def test_run_ons_append_every_choice_of_digits_and_never_read_as_the_answer():
    from ebpo.tasks import arith

    assert recipe.run_ons(42, 1) == [f"42{d}" for d in range(10)]
    assert recipe.run_ons(-27, 1)[:2] == ["-270", "-271"]  # the sign stays; -270 is not -27
    two = recipe.run_ons(7, 2)
    assert len(two) == 100 and two[0] == "700" and two[-1] == "799"
    # 0 run on by zeros reads as 0 again (00, 000): left out; 05 reads as 5, 012 as 12, wrong answers
    assert recipe.run_ons(0, 1) == [f"0{d}" for d in range(1, 10)]
    assert recipe.run_ons(0, 2) == [f"0{d:02d}" for d in range(1, 100)]
    rng = random.Random(0)
    for answer in [rng.randint(-700, 700) for _ in range(200)] + [0, 1, -1, 10]:
        for digits in (1, 2):
            assert all(arith.verify(label, str(answer)) == 0.0 for label in recipe.run_ons(answer, digits))


def test_wrong_labels_join_the_near_misses_and_the_run_ons_without_duplicates():
    only_run_ons = replace(TINY, near_miss_offsets=(), near_miss_digit_slips=False, run_on_digits=(1, 2))
    assert recipe.wrong_labels(42, only_run_ons) == recipe.run_ons(42, 1) + recipe.run_ons(42, 2)  # 10 + 100
    both = replace(TINY, near_miss_offsets=(-1, 1), near_miss_digit_slips=False, run_on_digits=(1, 1))
    assert recipe.wrong_labels(42, both) == ["41", "43"] + recipe.run_ons(42, 1)  # (1, 1): the run-ons once
    # the near misses alone (D2's teacher): the near misses, as text, in their order
    near = replace(TINY, **NEAR_MISSES_ONLY)
    assert recipe.wrong_labels(42, near) == [str(m) for m in recipe.near_misses(42, near)]
    # the default teacher: the run-ons only
    assert recipe.wrong_labels(42, TINY) == recipe.run_ons(42, 1) + recipe.run_ons(42, 2)


def test_a_run_on_teacher_spreads_its_wrong_labels_over_every_run_on():
    cfg = replace(
        TINY,
        teacher_topic_accuracy=(0.4,) * 9,
        teacher_level_factor=(1.0,) * 5,
        near_miss_offsets=(),
        near_miss_digit_slips=False,
        run_on_digits=(1, 2),
    )
    rng = random.Random(0)
    labels = Counter(recipe.teacher_label(_record("area", 2, 42), cfg, rng) for _ in range(20_000))
    # P(right) = 0.4 (sd sqrt(0.4 * 0.6 / 20000) = 0.0035); each of the 110 run-ons (1 - 0.4) / 110 = 0.0055
    # (sd 0.0005): the likeliest wrong label is far less likely than the right one
    assert abs(labels["42"] / 20_000 - 0.4) < 0.015
    assert set(labels) == {"42"} | set(recipe.wrong_labels(42, cfg))
    assert max(n for label, n in labels.items() if label != "42") / 20_000 < 0.0055 + 0.003


def test_the_first_clean_steps_train_on_right_answers(monkeypatch):
    from ebpo.models.recipes.arith import new_model as _new_model

    seen = []
    real = sft.encode_sft_example
    monkeypatch.setattr(
        sft,
        "encode_sft_example",
        lambda tok, prompt, label: seen.append((prompt, label)) or real(tok, prompt, label),
    )
    # 4 full batches of 8 (448 = 56 x 8): steps 0-1 on right answers, 2-3 from a teacher never right
    cfg = replace(
        TINY, steps=4, clean_steps=2, batch_size=8, train_problems=448, teacher_topic_accuracy=(0.0,) * 9
    )
    model, tok = _new_model(cfg)
    recipe.train_sft(model, tok, cfg, progress=False)
    answers = {r.prompt: r.answer for r in recipe.sft_records(cfg)}
    assert len(seen) == 32
    assert all(label == answers[prompt] for prompt, label in seen[:16])
    assert all(label != answers[prompt] for prompt, label in seen[16:])
    assert all(label in recipe.wrong_labels(int(answers[prompt]), cfg) for prompt, label in seen[16:])


def test_sft_pool_comes_from_the_sft_split_and_follows_the_level_weights():
    from ebpo.tasks import arith

    config = replace(TINY, train_problems=10, level_weights=(2.0, 1.0, 1.0, 0.0, 0.0))
    records = recipe.sft_records(config)
    # 10 * 2/4 = 5, 10 * 1/4 = 2.5 -> 2, 2.5 -> 2, 0, 0: 9 problems, the remaining one goes to level 1.
    assert Counter(r.level for r in records) == {1: 6, 2: 2, 3: 2}
    assert all(arith.split_of(r.prompt) == "sft" for r in records)  # never a prompt RL or evaluation sees
    with pytest.raises(ValueError, match=r"^level_weights .*\(1\.0, 1\.0\)$"):
        replace(TINY, level_weights=(1.0, 1.0))


# --- SFT pieces ------------------------------------------------------------------------------------------------


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


# --- the grid ----------------------------------------------------------------------------------------------------


def test_grid_formatting_and_summary():
    def cell(p):
        return {"pass@1": p, "maj@n": p, "greedy": p}

    grid = {"mod": {1: cell(1.0), 2: cell(0.5)}, "dot": {1: cell(0.0), 2: cell(0.25)}}
    table = grid_mod.format_grid(grid)
    assert table.splitlines()[0] == "| topic | L1 | L2 | mean |"
    assert "| mod | 1.00 | 0.50 | 0.75 |" in table
    assert "| mean | 0.50 | 0.38 | 0.44 |" in table  # level means 0.5 and 0.375, overall 0.4375
    assert grid_mod.grid_summary(grid) == {"cells": 4, "at_most_0.1": 1, "at_least_0.9": 1, "between": 2}
    assert grid_mod.grid_means(grid)["pass@1"] == pytest.approx(0.4375)
    assert (
        grid_mod.normalize_grid(json.loads(json.dumps(grid))) == grid
    )  # JSON's string level keys back to ints
    # the report names the majority table by its n, like its summary line (it said "maj@n:" above "maj@8")
    report = grid_mod.grid_report(grid, split="test", samples=8, temperature=1.0)
    assert "\nmaj@8:\n" in report and "maj@n" not in report and "maj@8 0.438" in report


def test_evaluate_grid_scores_pass_at_1_majority_and_greedy(monkeypatch):
    """A fake sampler with known answers: pass@1, maj@4 and greedy derived by hand."""
    from ebpo import generation
    from ebpo.tasks import arith

    def fake_sample(model, tokenizer, prompts, *, n, temperature, **kwargs):
        answers = {r.prompt: int(r.answer) for r in arith.generate("validation", 45, seed=3)}
        texts = []
        for prompt in prompts:
            right = answers[prompt]
            if temperature == 0:  # greedy: right
                texts.append(str(right))
            else:  # 4 samples: right, wrong (+1), right, run on (a 7 appended): pass@1 1/2, majority right
                texts += [str(right), str(right + 1), str(right), f"{right}7"]
        return type("R", (), {"texts": texts})()

    monkeypatch.setattr(generation, "sample", fake_sample)
    grid = grid_mod.evaluate_grid(None, None, split="validation", per_cell=1, samples=4, seed=3)
    assert len(grid) == 9 and all(len(row) == 5 for row in grid.values())
    # kinds: 2 of 4 right, 1 near miss (+1), 1 run-on (also for a negative answer: "-37" -> "-377"); but the one
    # problem whose answer is 0 (mod, level 2: 25 mod 5 = 0) reads "07" as 7, one slipped digit: 2 near misses there
    kinds = {"right": 0.5, "near miss": 0.25, "run-on": 0.25, "other": 0.0, "no number": 0.0}
    zero = kinds | {"near miss": 0.5, "run-on": 0.0}
    cells = [v for row in grid.values() for v in row.values()]
    assert all(
        v | {"kinds": None} == {"pass@1": 0.5, "maj@n": 1.0, "greedy": 1.0, "kinds": None} for v in cells
    )
    assert [v["kinds"] for v in cells].count(kinds) == 44 and grid["mod"][2]["kinds"] == zero
    # the grid's shares: the mean over its 45 cells, near miss (44 x 0.25 + 0.5) / 45, run-on 44 x 0.25 / 45
    shares = grid_mod.grid_answer_kinds(grid)
    assert shares == pytest.approx(kinds | {"near miss": 11.5 / 45, "run-on": 11 / 45})
    report = grid_mod.grid_report(grid, split="validation", samples=4, temperature=1.0)
    assert report.endswith(
        "sampled answers: right 50.0%, near miss 25.6%, run-on 24.4%, other 0.0%, no number 0.0%"
    )
    # a grid recorded before the kinds were measured (an older build_info.json) reports without the line
    old = {
        t: {lv: {k: x for k, x in v.items() if k != "kinds"} for lv, v in row.items()}
        for t, row in grid.items()
    }
    assert grid_mod.grid_answer_kinds(old) == {} and "sampled answers" not in grid_mod.grid_report(
        old, split="validation", samples=4, temperature=1.0
    )


# --- recipe, key, cache ------------------------------------------------------------------------------------------


def test_config_validation_and_key():
    with pytest.raises(ValueError, match=r"hidden_size \(30\).*num_heads \(4\)"):
        recipe.BaseModelConfig(hidden_size=30, num_heads=4)
    with pytest.raises(ValueError, match=r"BaseModelConfig\.batch_size .*\b0$"):
        recipe.BaseModelConfig(batch_size=0)
    with pytest.raises(ValueError, match=r"^teacher_topic_accuracy .*\(0\.5, 0\.5"):
        recipe.BaseModelConfig(teacher_topic_accuracy=(0.5,) * 8)
    with pytest.raises(ValueError, match=r"^near_miss_offsets .*\(0, 1\)$"):
        recipe.BaseModelConfig(near_miss_offsets=(0, 1))
    with pytest.raises(ValueError, match=r"^run_on_digits .*\(0, 1\)$"):
        recipe.BaseModelConfig(run_on_digits=(0, 1))
    with pytest.raises(ValueError, match="near_miss_offsets, near_miss_digit_slips or run_on_digits"):
        recipe.BaseModelConfig(near_miss_offsets=(), near_miss_digit_slips=False, run_on_digits=())
    assert recipe.BaseModelConfig().key() == recipe.BaseModelConfig().key()
    assert len({recipe.BaseModelConfig(seed=s).key() for s in range(5)}) == 5
    assert replace(TINY, lr=2e-2).key() != TINY.key()
    assert replace(TINY, near_miss_offsets=(1, 2)).key() != TINY.key()


def test_key_follows_what_the_generator_produces_not_its_source_bytes(monkeypatch, tmp_path):
    from ebpo.tasks import arith

    before = TINY.key()
    # the module's source file (what the previous key hashed) is irrelevant now
    edited = tmp_path / "arith.py"
    edited.write_bytes(open(arith.__file__, "rb").read() + b"\n# a comment\n")
    monkeypatch.setattr(arith, "__file__", str(edited))
    assert TINY.key() == before
    # a generator that produces other problems changes the key: a model trained on old data is not reused
    real = arith.PROBLEM_MAKERS["mod"]
    monkeypatch.setitem(arith.PROBLEM_MAKERS, "mod", lambda rng, level: real(rng, min(level + 1, 5)))
    assert TINY.key() != before


def test_key_follows_the_teacher(monkeypatch):
    near = replace(TINY, **NEAR_MISSES_ONLY)
    before, before_near = TINY.key(), near.key()
    monkeypatch.setattr(recipe, "near_miss", lambda answer, offset: answer + 2 * offset)
    assert near.key() != before_near and TINY.key() == before  # the default teacher writes no near misses
    monkeypatch.setattr(recipe, "run_ons", lambda answer, digits: [f"{answer}{d}" for d in range(1, 10)])
    assert TINY.key() != before


def test_a_field_added_later_keeps_the_keys_of_recipes_built_before_it(monkeypatch):
    """``run_on_digits`` came after the shipped model was built: at its neutral value ``()`` the key is the
    one computed without the field; any other value is another recipe."""
    import hashlib

    near = replace(TINY, **NEAR_MISSES_ONLY)
    payload = {
        "format": recipe.FORMAT_VERSION,
        "data": recipe.data_fingerprint(near),
        **dataclasses.asdict(near),
    }
    del payload["run_on_digits"]
    without = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]
    assert near.run_on_digits == () and near.key() == without
    assert replace(near, run_on_digits=(1,)).key() != without


def test_one_recipe_has_one_key_whatever_the_number_types():
    """``(1, 0.9)`` and ``(1.0, 0.9)`` are one recipe; before the coercion their JSON differed ("1" vs "1.0"),
    so the Python API keyed (and rebuilt, ~18 min) a recipe the CLI had already built."""
    floats = replace(TINY, lr=1.0, teacher_level_factor=(1.0, 0.9, 0.8, 0.7, 0.6))
    mixed = replace(TINY, lr=1, teacher_level_factor=[1, 0.9, 0.8, 0.7, 0.6])
    assert mixed == floats and mixed.key() == floats.key()
    assert mixed.teacher_level_factor == (1.0, 0.9, 0.8, 0.7, 0.6) and isinstance(mixed.lr, float)
    assert replace(TINY, run_on_digits=[1, 2]).run_on_digits == (1, 2)
    with pytest.raises(ValueError, match=r"BaseModelConfig\.run_on_digits .*1\.5"):
        replace(TINY, run_on_digits=(1.5,))


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


# --- CLI ------------------------------------------------------------------------------------------------------


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
        "--near-miss-offsets=-1,1",  # "=": a value that starts with "-" would read as a flag
        "--quiet",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    expected = bm.base_model_path(
        recipe.BaseModelConfig(
            hidden_size=32,
            num_layers=1,
            num_heads=2,
            steps=3,
            batch_size=8,
            train_problems=45,
            eval_per_cell=0,
            near_miss_offsets=(-1, 1),
        ),
        tmp_path,
    )
    assert printed == [str(expected)] and bm.is_built(expected)
    assert main(argv[:-1]) == 0  # built now: says so, prints the path
    out = capsys.readouterr().out
    assert "reusing the base model" in out and out.strip().endswith(str(expected))


def test_cli_help_documents_every_config_field(capsys):
    from ebpo.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["base-model", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # undo argparse's line wrapping
    for f in dataclasses.fields(recipe.BaseModelConfig):
        assert f"--{f.name.replace('_', '-')}" in text
    assert "--force" in text and "--check" in text and "--out" in text and "cosine decay to 10%" in text


def test_cli_rejects_a_malformed_tuple(capsys):
    from ebpo.cli import main

    with pytest.raises(SystemExit):
        main(["base-model", "--near-miss-offsets", "1,x"])
    assert "expected comma-separated ints" in capsys.readouterr().err


def test_cli_takes_an_empty_tuple_and_refuses_a_recipe_without_wrong_labels_in_one_line(tmp_path, capsys):
    from ebpo.cli import main

    # "--run-on-digits=" is the empty tuple; with no near misses and no digit slips (the default) nothing is left
    argv = ["base-model", "--cache-dir", str(tmp_path), "--run-on-digits="]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the teacher needs wrong labels" in err and "run_on_digits" in err
    assert not list(tmp_path.iterdir())  # nothing built


def test_a_diverging_sft_stops_with_a_clear_error():
    from ebpo.models.recipes.arith import new_model as _new_model

    cfg = replace(TINY, steps=3)
    model, tok = _new_model(cfg)
    with torch.no_grad():
        model.model.embed_tokens.weight.fill_(float("nan"))  # the loss is NaN from the first step
    with pytest.raises(FloatingPointError, match=r"\bnan\b.*\bstep 0\b.*--lr"):
        recipe.train_sft(model, tok, cfg, progress=False)


def test_cli_grid_samples_and_temperature_change_the_measurement_not_the_recipe(
    tmp_path, capsys, monkeypatch
):
    """``--grid-samples 3`` / ``--grid-temperature 2.5`` measure with 3 samples per problem / at T = 2.5 and
    reuse the build of the recipe as given:
    the recipe (and its key, hence its directory) does not move; 0 is one line on stderr, exit 2."""
    from ebpo.cli import main

    seen = {}

    def fake_grid(model, tokenizer, config, *, split, progress):
        seen.update(samples=config.eval_samples, temperature=config.eval_temperature, split=split)
        return {}

    monkeypatch.setattr(bm, "measure_grid", fake_grid)
    argv = ["base-model", "--cache-dir", str(tmp_path), "--hidden-size", "32", "--num-layers", "1"]
    argv += ["--num-heads", "2", "--steps", "3", "--batch-size", "8", "--train-problems", "45"]
    argv += ["--eval-per-cell", "0"]
    built = recipe.BaseModelConfig(
        hidden_size=32, num_layers=1, num_heads=2, steps=3, batch_size=8, train_problems=45, eval_per_cell=0
    )
    assert main(argv + ["--quiet"]) == 0
    assert capsys.readouterr().out.strip() == str(bm.base_model_path(built, tmp_path))
    assert main(argv + ["--grid", "test", "--grid-samples", "3"]) == 0
    out = capsys.readouterr().out
    assert "reusing the base model" in out and out.strip().endswith(str(bm.base_model_path(built, tmp_path)))
    assert seen == {"samples": 3, "temperature": 1.0, "split": "test"}
    assert main(argv + ["--grid", "validation", "--grid-temperature", "2.5"]) == 0
    assert seen == {"samples": 8, "temperature": 2.5, "split": "validation"}
    capsys.readouterr()
    assert sorted(p.name for p in (tmp_path / "base_models").iterdir()) == [
        bm.base_model_path(built, tmp_path).name
    ]
    assert main(argv + ["--grid", "test", "--grid-samples", "0"]) == 2
    assert capsys.readouterr().err.strip() == "ebpo base-model: error: --grid-samples must be >= 1, got 0"
    assert main(argv + ["--grid", "test", "--grid-temperature", "0"]) == 2
    assert (
        capsys.readouterr().err.strip() == "ebpo base-model: error: --grid-temperature must be > 0, got 0.0"
    )
