"""S1's recipe (``ebpo.models.recipes.arith``): the noisy teacher, the SFT data and training, the config's
checks and its key. The shipped model itself: tests/models/test_shipped.py."""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from dataclasses import replace

import pytest
import torch

from ebpo.data import Record
from ebpo.models import sft
from ebpo.models.recipes import arith as recipe
from helpers.base_model import TINY

# The teacher of the earlier shipped models (D2): off by one or two, or one digit slipped (no run-ons). The
# default teacher runs on by one or two digits and writes no near misses.
NEAR_MISSES_ONLY = dict(near_miss_offsets=(-2, -1, 1, 2), near_miss_digit_slips=True, run_on_digits=())


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


# --- the recipe's config and key ------------------------------------------------------------------------


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


def test_a_diverging_sft_stops_with_a_clear_error():
    from ebpo.models.recipes.arith import new_model as _new_model

    cfg = replace(TINY, steps=3)
    model, tok = _new_model(cfg)
    with torch.no_grad():
        model.model.embed_tokens.weight.fill_(float("nan"))  # the loss is NaN from the first step
    with pytest.raises(FloatingPointError, match=r"\bnan\b.*\bstep 0\b.*--lr"):
        recipe.train_sft(model, tok, cfg, progress=False)
