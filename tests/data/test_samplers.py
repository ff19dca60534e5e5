"""Samplers (docs/design.md §4): random, topic-coherent and curriculum streams; resume; torch wrapper."""

from __future__ import annotations

import random

import pytest
import torch

from ebpo.data.records import Record
from ebpo.data.samplers import (
    StreamSampler,
    cluster_key,
    difficulty_bucket,
    get_sampler,
    list_samplers,
)


def _topic_records(sizes: dict[str, int]) -> list[Record]:
    out = []
    for topic, n in sizes.items():
        out += [Record(id=f"{topic}-{i}", prompt="p", answer="a", topic=topic) for i in range(n)]
    return out


def _draw(sampler, n_batches: int) -> list[list[int]]:
    return [sampler.next_batch() for _ in range(n_batches)]


def test_registry_lists_names_and_rejects_unknown():
    assert list_samplers() == ["difficulty", "random", "topic"]
    with pytest.raises(ValueError, match="difficulty, random, topic"):
        get_sampler("curriculum", [1, 2, 3], 1)


@pytest.mark.parametrize("name", ["random", "topic", "difficulty"])
def test_same_seed_same_stream_and_resume_continues_identically(name):
    rng = random.Random(7)
    records = [
        Record(
            id=str(i), prompt="p", answer="a", topic=rng.choice("abcd"), difficulty=rng.randint(0, 16) / 16
        )
        for i in range(37)
    ]
    a = get_sampler(name, records, 5, seed=3)
    b = get_sampler(name, records, 5, seed=3)
    assert _draw(a, 20) == _draw(b, 20)  # 20 batches = 2+ epochs of 7 batches
    # checkpoint after 9 batches (mid second epoch), restore into a fresh sampler
    c = get_sampler(name, records, 5, seed=3)
    _draw(c, 9)
    state = c.state_dict()
    tail_c = _draw(c, 12)
    d = get_sampler(name, records, 5, seed=3)
    d.load_state_dict(state)
    assert _draw(d, 12) == tail_c


def test_load_state_dict_rejects_a_different_stream():
    a = get_sampler("random", list(range(10)), 2, seed=0)
    b = get_sampler("random", list(range(10)), 2, seed=1)
    with pytest.raises(ValueError, match="seed"):
        b.load_state_dict(a.state_dict())


def test_random_epoch_is_a_permutation_of_whole_batches_and_seeds_differ():
    s = get_sampler("random", list(range(23)), 5, seed=0)
    epoch0 = [i for b in _draw(s, 4) for i in b]
    # 23 // 5 = 4 batches: 20 distinct indices, the other 3 sit out this epoch
    assert len(epoch0) == 20 and len(set(epoch0)) == 20 and set(epoch0) <= set(range(23))
    epoch1 = [i for b in _draw(s, 4) for i in b]
    assert epoch1 != epoch0 and len(set(epoch1)) == 20
    other = get_sampler("random", list(range(23)), 5, seed=1)
    assert [i for b in _draw(other, 4) for i in b] != epoch0


def test_topic_batches_are_single_topic_and_consecutive_with_mixed_tail():
    # sizes a=7, b=5, c=2 with B=3: full batches a:2 (1 left), b:1 (2 left), c:0 (2 left)
    # pool = 1 + 2 + 2 = 5 -> one mixed batch (2 sit out). Epoch = 3 + 1 = 4 batches.
    records = _topic_records({"a": 7, "b": 5, "c": 2})
    topic = [r.topic for r in records]
    for seed in range(6):
        s = get_sampler("topic", records, 3, seed=seed)
        assert s.batches_per_epoch == 4
        batches = _draw(s, 4)
        flat = [i for b in batches for i in b]
        assert len(set(flat)) == 12
        topics = [{topic[i] for i in b} for b in batches]
        assert all(len(t) == 1 for t in topics[:3])
        pure = [next(iter(t)) for t in topics[:3]]
        assert pure.count("a") == 2 and pure.count("b") == 1
        # the two 'a' batches are consecutive (topic-coherent stream)
        first_a = pure.index("a")
        assert pure[first_a + 1] == "a"


def test_topic_order_and_inner_order_change_with_seed_and_epoch():
    records = _topic_records({"a": 6, "b": 6, "c": 6, "d": 6})
    s = get_sampler("topic", records, 3, seed=0)
    epochs = [[i for b in _draw(s, 8) for i in b] for _ in range(3)]
    assert len({tuple(e) for e in epochs}) == 3
    for e in epochs:
        assert sorted(e) == list(range(24))  # no leftovers: every prompt once per epoch
    topic_orders = set()
    for seed in range(8):
        order = get_sampler("topic", records, 3, seed=seed).epoch_order(0)
        topic_orders.add(tuple(dict.fromkeys(records[i].topic for i in order)))
    assert len(topic_orders) > 1


def test_topic_leftover_drop_keeps_every_batch_pure():
    records = _topic_records({"a": 7, "b": 5, "c": 2})
    s = get_sampler("topic", records, 3, seed=0, leftover="drop")
    assert s.batches_per_epoch == 3  # a:2 + b:1, c never fills a batch
    for batch in _draw(s, 9):
        assert len({records[i].topic for i in batch}) == 1
    with pytest.raises(ValueError, match=r"\bleftover .*'pad'$"):
        get_sampler("topic", records, 3, leftover="pad")


def test_topic_sampler_names_the_unlabelled_record():
    records = _topic_records({"a": 3})
    records[1].topic = None
    with pytest.raises(ValueError, match=r"record 1 \(id 'a-1'\)"):
        get_sampler("topic", records, 2)


def test_difficulty_curriculum_easy_to_hard_then_repeat_or_shuffle():
    rates = [0.25, 1.0, 0.0, 0.5, 0.25, 0.875, 0.5]
    # descending pass rate, ties in record order: 1(1.0) 5(.875) 3(.5) 6(.5) 0(.25) 4(.25) | 2(0.0) left out
    expected = [[1, 5], [3, 6], [0, 4]]
    s = get_sampler("difficulty", rates, 2, seed=0)
    assert _draw(s, 6) == expected + expected  # after_epoch="repeat"
    sh = get_sampler(
        "difficulty",
        [Record(id=str(i), prompt="", answer="", difficulty=r) for i, r in enumerate(rates)],
        2,
        after_epoch="shuffle",
    )
    assert _draw(sh, 3) == expected
    later = [i for b in _draw(sh, 9) for i in b]
    assert later[:6] != [1, 5, 3, 6, 0, 4] or later[6:12] != [1, 5, 3, 6, 0, 4]


def test_difficulty_rejects_missing_or_out_of_range():
    with pytest.raises(ValueError, match=r"record 2 .*run `ebpo annotate difficulty`"):
        get_sampler("difficulty", [0.1, 0.2, None], 1)
    with pytest.raises(ValueError, match="record 0"):
        get_sampler("difficulty", [1.5, 0.2], 1)


def test_batch_size_larger_than_data_is_a_clear_error():
    with pytest.raises(ValueError, match=r"batch_size 3 .*\(2\)"):
        get_sampler("random", [1, 2], 3)


def test_stream_sampler_matches_trl_repeat_layout_and_epochs():
    s = get_sampler("random", list(range(7)), 3, seed=0)
    batches = [s.epoch_order(0)[0:3], s.epoch_order(0)[3:6]]
    wrapper = StreamSampler(s, mini_repeat_count=2, repeat_count=2)
    assert isinstance(wrapper, torch.utils.data.Sampler)
    assert len(wrapper) == 2 * 3 * 2 * 2  # batches * B * G * R
    got = list(wrapper)
    # TRL RepeatSampler layout: for batch: repeat R times: each index G times in a row
    want = [i for b in batches for _ in range(2) for i in b for _ in range(2)]
    assert got == want
    second = list(wrapper)  # next epoch
    assert len(second) == len(wrapper) and second != got
    assert s.epoch == 1


def test_stream_sampler_resume_mid_epoch_yields_the_rest():
    s = get_sampler("topic", _topic_records({"a": 6, "b": 6}), 2, seed=4)
    full = list(StreamSampler(get_sampler("topic", _topic_records({"a": 6, "b": 6}), 2, seed=4)))
    s.next_batch()
    s.next_batch()
    resumed = get_sampler("topic", _topic_records({"a": 6, "b": 6}), 2, seed=4)
    resumed.load_state_dict(s.state_dict())
    assert list(StreamSampler(resumed)) == full[4:]


def test_stream_sampler_drives_a_dataloader():
    data = torch.arange(10) * 10
    s = get_sampler("random", list(range(10)), 4, seed=0)
    loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=StreamSampler(s))
    got = [b.tolist() for b in loader]
    ref = get_sampler("random", list(range(10)), 4, seed=0)
    assert got == [[10 * i for i in ref.next_batch()] for _ in range(2)]


def test_cluster_key_and_difficulty_bucket():
    # K = 4: 0.0 -> [0, .25); 0.25 -> [.25, .5); 0.74 -> [.5, .75); 1.0 -> last bucket, closed
    assert difficulty_bucket(0.0) == "pass_rate[0.00,0.25)"
    assert difficulty_bucket(0.25) == "pass_rate[0.25,0.50)"
    assert difficulty_bucket(0.74) == "pass_rate[0.50,0.75)"
    assert difficulty_bucket(1.0) == "pass_rate[0.75,1.00]"
    assert difficulty_bucket(0.5, num_buckets=2) == "pass_rate[0.50,1.00]"
    r = Record(id="x", prompt="", answer="", topic="Geometry & Trigonometry", difficulty=0.1)
    assert cluster_key(r) == "Geometry & Trigonometry"
    assert cluster_key(r, by="difficulty") == "pass_rate[0.00,0.25)"
    assert cluster_key({"topic": "t"}) == "t"
    with pytest.raises(ValueError, match=r"\bby .*'level'$"):
        cluster_key(r, by="level")
