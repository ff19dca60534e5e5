"""The baselines (``ebpo.advantages.baselines``): values derived by hand on one batch, and each estimator
against its loop reference over random batches."""

from __future__ import annotations

import math
import random

import pytest
import torch

import ebpo
from helpers.advantages import INDEX, REWARDS, close, loop_grpo, loop_jspo, loop_rloo, loop_rpp, random_batch


def test_grpo_hand_values():
    # a: +-0.5 / sqrt(1/3) = +-0.866025; b: 0 / (0 + eps) = 0; c: 0.25 / 0.5 = 0.5 and -0.75 / 0.5 = -1.5
    e = 0.8660254
    close(ebpo.get_estimator("grpo")(REWARDS, INDEX), [e, -e, -e, e, 0, 0, 0, 0, 0.5, 0.5, 0.5, -1.5])
    # norm_by_std=False is Dr. GRPO: r - mean
    expected = [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, 0.25, 0.25, 0.25, -0.75]
    close(ebpo.get_estimator("grpo", norm_by_std=False)(REWARDS, INDEX), expected)
    close(ebpo.get_estimator("dr_grpo")(REWARDS, INDEX), expected)


def test_rloo_hand_values():
    # a, r=1: 1 - (0 + 0 + 1)/3 = 2/3; r=0: 0 - 2/3.  c, r=1: 1 - 2/3 = 1/3; r=0: 0 - 1 = -1.
    t = 2.0 / 3.0
    close(ebpo.get_estimator("rloo")(REWARDS, INDEX), [t, -t, -t, t, 0, 0, 0, 0, 1 / 3, 1 / 3, 1 / 3, -1.0])
    # a group of one has no leave-one-out baseline: 0. Group [0.9, 0.1]: 0.9 - 0.1 = 0.8 and 0.1 - 0.9
    close(ebpo.get_estimator("rloo")([0.3, 0.9, 0.1], [0, 1, 1]), [0.0, 0.8, -0.8])


def test_reinforce_pp_baseline_hand_values():
    # a = r - group mean = [.5,-.5,-.5,.5, 0,0,0,0, .25,.25,.25,-.75]; its mean is 0;
    # unbiased var = (4 * .25 + 3 * .0625 + .5625) / 11 = 1.75 / 11 -> std 0.3988620; A = a / std
    std = math.sqrt(1.75 / 11)
    raw = [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, 0.25, 0.25, 0.25, -0.75]
    close(ebpo.get_estimator("reinforce_pp_baseline")(REWARDS, INDEX), [x / std for x in raw])


def test_jspo_hand_values():
    # noise s_q^2 / G: a = 1/12, b = 0, c = 1/16.
    # prompt a: others b, c. v2 = (0 + 1/16)/2 = 0.03125; their means 0, 0.75 -> centre 0.375,
    #   s2 = 0.375^2 = 0.140625; lambda = 0.03125 / 0.171876 = 0.181817; outside mean = 3/8 = 0.375.
    #   r=1: LOO mean 1/3, baseline = 0.818183/3 + 0.181817*0.375 = 0.340909 -> A = 0.659091
    #   r=0: LOO mean 2/3, baseline = 0.545455 + 0.068181 = 0.613636 -> A = -0.613636
    # prompt b: others a, c. v2 = (1/12 + 1/16)/2 = 0.072917; means 0.5, 0.75 -> s2 = 0.125^2 = 0.015625;
    #   lambda = 0.072917 / 0.088543 = 0.823527; LOO mean 0, outside mean 5/8 -> baseline 0.514704
    # prompt c: others a, b. v2 = 1/24 = 0.041667; means 0.5, 0 -> s2 = 0.0625; lambda = 0.400000;
    #   outside mean 2/8 = 0.25. r=1: LOO 2/3 -> baseline 0.6*2/3 + 0.4*0.25 = 0.5 -> A = 0.5;
    #   r=0: LOO 1 -> baseline 0.6 + 0.1 = 0.7 -> A = -0.7
    lam_b = (7 / 96) / (7 / 96 + 1 / 64 + 1e-6)
    b = -lam_b * 0.625
    expected = [0.659091, -0.613636, -0.613636, 0.659091, b, b, b, b, 0.5, 0.5, 0.5, -0.7]
    est = ebpo.get_estimator("jspo")
    close(est(REWARDS, INDEX), expected, atol=2e-5)
    assert est.metrics()["jspo/lambda"] == pytest.approx((0.181817 + lam_b + 0.4) / 3, abs=1e-5)


STATELESS = {
    "grpo": loop_grpo,
    "dr_grpo": lambda r, i: loop_grpo(r, i, norm_by_std=False),
    "rloo": loop_rloo,
    "reinforce_pp_baseline": loop_rpp,
    "jspo": loop_jspo,
}


@pytest.mark.parametrize("name", sorted(STATELESS))
@pytest.mark.parametrize("seed", range(6))
def test_stateless_estimators_match_loop_reference(name, seed):
    rng = random.Random(seed)
    est = ebpo.get_estimator(name)
    for _ in range(3):
        rewards, index, passed, _ = random_batch(rng, binary=rng.random() < 0.5)
        adv = est(torch.tensor(rewards), passed)
        torch.testing.assert_close(
            adv.double(),
            torch.tensor(STATELESS[name](rewards, index), dtype=torch.float64),
            atol=2e-5,
            rtol=1e-5,
        )
        assert torch.isfinite(adv).all()
