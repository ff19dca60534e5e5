"""The call contract every estimator shares (``ebpo.advantages.base``): the group metrics by hand and
against a loop, and ``observe``."""

from __future__ import annotations

import random

import pytest
import torch

import ebpo
from helpers.advantages import INDEX, REWARDS, groups_of, mean, random_batch


def test_all_fail_all_pass_metrics_binary_and_shaped():
    est = ebpo.get_estimator("grpo")
    # binary: groups [0,0] fail, [1,1] pass, [0,1] neither
    est([0.0, 0.0, 1.0, 1.0, 0.0, 1.0], [0, 0, 1, 1, 2, 2])
    assert est.metrics()["groups/all_fail"] == pytest.approx(1 / 3)
    assert est.metrics()["groups/all_pass"] == pytest.approx(1 / 3)
    assert est.metrics()["groups/num"] == 3.0
    # binary batch that is all 0: every group fails, none pass
    est([0.0, 0.0, 0.0, 0.0], [0, 0, 1, 1])
    assert (est.metrics()["groups/all_fail"], est.metrics()["groups/all_pass"]) == (1.0, 0.0)
    # shaped (+1/-1): floor -1, ceiling +1 are the batch min and max
    est([-1.0, -1.0, 1.0, 1.0, -1.0, 0.5], [0, 0, 1, 1, 2, 2])
    assert est.metrics()["groups/all_fail"] == pytest.approx(1 / 3)
    assert est.metrics()["groups/all_pass"] == pytest.approx(1 / 3)
    # shaped, one value everywhere: no telling which end it is, so neither
    est([0.5, 0.5, 0.5, 0.5], [0, 0, 1, 1])
    assert (est.metrics()["groups/all_fail"], est.metrics()["groups/all_pass"]) == (0.0, 0.0)
    assert est.metrics()["adv/zero_frac"] == 1.0 and est.metrics()["adv/abs_mean"] == 0.0


@pytest.mark.parametrize("seed", range(8))
def test_group_metrics_match_loop_reference(seed):
    """groups/all_fail and groups/all_pass (binary rewards: read off the group means; shaped: group min and
    max against the batch's), adv/zero_frac and adv/abs_mean, against a loop over the groups."""
    rng = random.Random(seed)
    for name in ("grpo", "ebpo", "rloo"):
        est = ebpo.get_estimator(name)
        for _ in range(3):
            rewards, index, passed, _ = random_batch(rng, binary=rng.random() < 0.5)
            if rng.random() < 0.25:  # whole groups at the floor or the ceiling
                rewards = [float(r > 0.5) for r in rewards]
            adv = est(torch.tensor(rewards), passed).tolist()
            groups = groups_of(rewards, index).values()
            binary = all(r in (0.0, 1.0) for r in rewards)
            floor, ceiling = (0.0, 1.0) if binary else (min(rewards), max(rewards))
            informative = floor < ceiling
            fail = sum(informative and all(rewards[i] == floor for i in g) for g in groups) / len(groups)
            passes = sum(informative and all(rewards[i] == ceiling for i in g) for g in groups) / len(groups)
            metrics = est.metrics()
            assert (metrics["groups/all_fail"], metrics["groups/all_pass"]) == (fail, passes)
            assert metrics["groups/num"] == len(groups)
            assert metrics["adv/zero_frac"] == sum(abs(a) < 1e-8 for a in adv) / len(adv)
            assert metrics["adv/abs_mean"] == pytest.approx(mean([abs(a) for a in adv]), rel=1e-6)


def test_observe_feeds_prior_like_call_and_stateless_observe_is_a_noop():
    a, b = ebpo.get_estimator("ebpo"), ebpo.get_estimator("ebpo")
    a.observe(REWARDS, INDEX)
    b(REWARDS, INDEX)
    assert a.prior_stats() == b.prior_stats()
    grpo = ebpo.get_estimator("grpo")
    grpo.observe(REWARDS, INDEX)
    assert grpo.state_dict() == {}
    with pytest.raises(ValueError, match="position 1"):
        grpo.observe([0.0, float("nan")], [0, 0])
