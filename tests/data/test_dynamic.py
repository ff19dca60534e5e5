"""DAPO dynamic sampling: filtering, bounded rounds, shortfall policies, and what the prior observes."""

from __future__ import annotations

import random
import warnings

import pytest
import torch

from ebpo.data.dynamic import DynamicSamplingConfig, Group, collect_groups, is_informative
from ebpo.data.samplers import get_sampler


class RecordingEstimator:
    """Stands in for an EBPO estimator: records every observe() call."""

    def __init__(self):
        self.calls = []

    def observe(self, rewards, index, cluster=None):
        self.calls.append(
            (torch.as_tensor(rewards).tolist(), list(index), None if cluster is None else list(cluster))
        )


class ScriptedGenerator:
    """Round r returns the reward lists script[r] for the prompts it is given (uid = prompt/round)."""

    def __init__(self, script):
        self.script = script
        self.round = 0
        self.sampled = []

    def __call__(self, prompts):
        rewards = self.script[self.round]
        assert len(rewards) == len(prompts)
        groups = [
            Group(uid=f"{p}/{self.round}", rewards=r, cluster=f"c{p % 2}", data=p)
            for p, r in zip(prompts, rewards)
        ]
        self.round += 1
        self.sampled += groups
        return groups


def _prompts(batch=3):
    counter = iter(range(10_000))
    return lambda: [next(counter) for _ in range(batch)]


def test_is_informative():
    assert not is_informative([0, 0, 0, 0])
    assert not is_informative([1.0, 1.0])
    assert not is_informative([0.5])  # a group of one never has a spread
    assert is_informative([0, 1, 0, 0])
    assert is_informative(torch.tensor([-1.0, -0.9]))  # shaped rewards that differ at all are kept


def test_hand_worked_two_rounds():
    # round 0: prompts 0,1,2 -> [0,0] dropped, [1,0] kept, [1,1] dropped
    # round 1: prompts 3,4,5 -> [0,1] kept, [1,0] kept (surplus: batch is full at 2), [0,0] dropped
    gen = ScriptedGenerator([[[0, 0], [1, 0], [1, 1]], [[0, 1], [1, 0], [0, 0]]])
    est = RecordingEstimator()
    res = collect_groups(_prompts(), gen, DynamicSamplingConfig(batch_size=2, max_rounds=5), est)
    assert [g.uid for g in res.groups] == ["1/0", "3/1"]
    # observed once, in one call: dropped 0/0, 2/0, 5/1 then surplus 4/1
    assert len(est.calls) == 1
    rewards, index, cluster = est.calls[0]
    assert rewards == [0, 0, 1, 1, 0, 0, 1, 0]
    assert index == ["0/0", "0/0", "2/0", "2/0", "5/1", "5/1", "4/1", "4/1"]
    assert cluster == ["c0", "c0", "c0", "c0", "c1", "c1", "c0", "c0"]
    # 3 informative of 6 sampled
    assert res.metrics == {
        "dynamic/rounds": 2.0,
        "dynamic/kept_frac": 0.5,
        "dynamic/dropped": 3.0,
        "dynamic/filled": 0.0,
        "dynamic/shortfall": 0.0,
    }


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("policy", ["train", "fill"])
def test_every_sampled_group_is_returned_or_observed_exactly_once(seed, policy):
    rng = random.Random(seed)
    batch, group_size, rounds = rng.randint(1, 6), rng.randint(1, 4), rng.randint(1, 4)
    p_pass = rng.random()
    script = [
        [[float(rng.random() < p_pass) for _ in range(group_size)] for _ in range(batch)]
        for _ in range(rounds)
    ]
    gen = ScriptedGenerator(script)
    est = RecordingEstimator()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = collect_groups(_prompts(batch), gen, DynamicSamplingConfig(batch, rounds, policy), est)
    observed_uids = [u for call in est.calls for u in dict.fromkeys(call[1])]
    returned = [g.uid for g in res.groups]
    sampled = [g.uid for g in gen.sampled]
    assert sorted(returned + observed_uids, key=str) == sorted(sampled, key=str)
    assert not set(returned) & set(observed_uids)
    assert len(est.calls) <= 1
    assert len(returned) <= batch
    informative = [g for g in gen.sampled if is_informative(g.rewards)]
    if policy == "fill" or len(informative) >= batch:
        assert len(returned) == min(batch, len(sampled))
    # loop reference: the returned informative groups are the first ones in sampling order
    assert [g.uid for g in res.groups if is_informative(g.rewards)] == [g.uid for g in informative[:batch]]
    assert res.metrics["dynamic/dropped"] == len(sampled) - len(informative)
    assert res.metrics["dynamic/kept_frac"] == pytest.approx(len(informative) / len(sampled))


def test_shortfall_train_warns_and_fill_tops_up_in_order():
    # all rounds give 1 informative group of 3; batch 3, two rounds -> 2 informative
    script = [[[0, 0], [0, 1], [1, 1]], [[1, 1], [1, 0], [0, 0]]]
    with pytest.warns(RuntimeWarning, match="2 of 3 informative groups after 2 rounds"):
        res = collect_groups(_prompts(), ScriptedGenerator(script), DynamicSamplingConfig(3, 2, "train"))
    assert [g.uid for g in res.groups] == ["1/0", "4/1"]
    assert res.metrics["dynamic/shortfall"] == 1.0
    est = RecordingEstimator()
    res = collect_groups(_prompts(), ScriptedGenerator(script), DynamicSamplingConfig(3, 2, "fill"), est)
    # first dropped group (0/0) fills the batch; the other dropped ones are observed
    assert [g.uid for g in res.groups] == ["1/0", "4/1", "0/0"]
    assert list(dict.fromkeys(est.calls[0][1])) == ["2/0", "3/1", "5/1"]
    assert res.metrics["dynamic/filled"] == 1.0 and res.metrics["dynamic/shortfall"] == 0.0
    with pytest.raises(RuntimeError, match=r"\b2 of 3 .*\b2 rounds; .*max_rounds"):
        collect_groups(_prompts(), ScriptedGenerator(script), DynamicSamplingConfig(3, 2, "error"))


def test_no_cluster_passes_none_and_duplicate_uid_is_an_error():
    est = RecordingEstimator()
    groups = [Group(uid="a", rewards=[0, 0]), Group(uid="b", rewards=[1, 0])]
    collect_groups(lambda: [0], lambda _: groups, DynamicSamplingConfig(1, 1), est)
    assert est.calls == [([0.0, 0.0], ["a", "a"], None)]
    with pytest.raises(ValueError, match="uid 'a'"):
        collect_groups(lambda: [0], lambda _: [Group("a", [0, 0])], DynamicSamplingConfig(2, 3))


def test_bad_config_names_valid_choices():
    with pytest.raises(ValueError, match=r"\['error', 'fill', 'train'\]"):
        DynamicSamplingConfig(4, on_shortfall="pad")
    with pytest.raises(ValueError, match="max_rounds"):
        DynamicSamplingConfig(4, max_rounds=0)


def test_works_with_a_sampler_as_prompt_source():
    sampler = get_sampler("random", list(range(20)), 4, seed=0)
    calls = []

    def generate(prompts):  # prompt i passes iff i is even in 1 of 2 samples: odd prompts all fail
        calls.append(list(prompts))
        return [Group(uid=(p, len(calls)), rewards=[float(p % 2 == 0), 0.0]) for p in prompts]

    res = collect_groups(sampler.next_batch, generate, DynamicSamplingConfig(4, 10))
    assert all(g.uid[0] % 2 == 0 for g in res.groups) and len(res.groups) == 4
    ref = get_sampler("random", list(range(20)), 4, seed=0)
    assert calls == [ref.next_batch() for _ in calls]
