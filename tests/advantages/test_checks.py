"""What every estimator accepts and returns (``ebpo.advantages.checks``): bad and degenerate input named by
position, every kind of group id, huge rewards, float64 inside and float32 out, options' eps."""

from __future__ import annotations

import copy
import math
import re
from collections import defaultdict

import numpy as np
import pytest
import torch

import ebpo
from ebpo.advantages import GroupStats, group_ids, group_moments
from helpers.advantages import INDEX, REWARDS, close, floats


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "jspo", "ebpo"])
def test_bad_and_degenerate_input(name):
    est = ebpo.get_estimator(name)
    with pytest.raises(ValueError, match="position 3"):
        est(torch.tensor([0.0, 1.0, 0.0, float("nan"), float("inf")]), [0, 0, 1, 1, 1])
    with pytest.raises(ValueError, match="position 0"):
        est([float("-inf")], [0])
    with pytest.raises(ValueError, match=r"index .*2.*rewards .*3"):
        est([0.0, 1.0, 1.0], [0, 1])
    with pytest.raises(ValueError, match=r"^rewards .*\(2, 2\)$"):
        est(torch.zeros(2, 2), [0, 1])
    with pytest.raises(TypeError, match="position 1"):
        est([0.0, 1.0], [0, [1]])
    state = copy.deepcopy(est.state_dict())
    empty = est(torch.zeros(0), [])
    assert empty.shape == (0,) and empty.dtype == torch.float32
    assert est.state_dict() == state  # an empty batch leaves the state alone
    cases = [
        ([0.3, 0.9, 0.5], ["x", "y", "z"]),  # groups of one
        ([1.0, 1.0, 0.0, 0.0], [0, 0, 1, 1]),  # all-equal groups
        ([0.5] * 6, [0, 0, 1, 1, 2, 2]),  # zero variance over the whole batch
        ([1.0], [0]),  # a single sample
    ]
    for rewards, index in cases:
        adv = est(rewards, index)
        assert adv.shape == (len(rewards),) and torch.isfinite(adv).all()
        assert all(math.isfinite(v) for v in est.metrics().values())
    fresh = ebpo.get_estimator(name)
    assert (fresh([0.5] * 6, [0, 0, 1, 1, 2, 2]) == 0).all()  # no signal anywhere: zeros
    assert fresh.metrics()["adv/zero_frac"] == 1.0


def test_group_ids_accepts_every_id_kind():
    expected_groups = [[0, 2], [1, 3], [4]]

    def partition(inverse):
        blocks = defaultdict(list)
        for i, g in enumerate(inverse.tolist()):
            blocks[g].append(i)
        return sorted(blocks.values())

    obj = np.empty(5, dtype=object)
    obj[:] = ["u1", 7, "u1", 7, ("t", 1)]
    for index in (
        torch.tensor([5, 9, 5, 9, -1]),
        np.array([5, 9, 5, 9, -1]),
        np.array(["b", "a", "b", "a", "c"]),
        obj,
        ["b", "a", "b", "a", "c"],
        [(1, 2), (3,), (1, 2), (3,), None],
    ):
        inverse, num = group_ids(index)
        assert inverse.dtype == torch.long and num == 3
        assert partition(inverse) == expected_groups


def test_output_follows_input_device_and_dtype():
    adv = ebpo.get_estimator("ebpo")(REWARDS.to(torch.float64), list(INDEX))
    assert adv.dtype == torch.float32 and adv.device == REWARDS.device
    # GroupStats is a NamedTuple of (M,) tensors
    stats = group_moments(REWARDS.double(), group_ids(INDEX)[0], 3)
    assert isinstance(stats, GroupStats)
    torch.testing.assert_close(stats.var_M, torch.tensor([1 / 3, 0.0, 0.25], dtype=torch.float64))


ALL_ESTIMATORS = [
    ("grpo", {}),
    ("dr_grpo", {}),
    ("rloo", {}),
    ("reinforce_pp_baseline", {}),
    ("jspo", {}),
    ("ebpo", {}),
    ("ebpo", {"normalize": "none"}),
    ("ebpo", {"normalize": "group"}),
    ("ebpo", {"normalize": "prior"}),
    ("ebpo", {"prior_scope": "cluster", "cluster_min_groups": 1, "prior_memory": 3.0}),
]


@pytest.mark.parametrize("name,options", ALL_ESTIMATORS, ids=lambda x: str(x))
@pytest.mark.parametrize("huge", [1e39, -1e39, 1e155, 1e300])
def test_huge_rewards_are_rejected_naming_the_sample_and_leave_state_alone(name, options, huge):
    # Unchecked, 1e39 overflows the float32 output to +-inf (dr_grpo, rloo, jspo, ebpo none) and 1e155
    # overflows the float64 variance (NaN everywhere, and EBPO's prior would stay NaN for good).
    est = ebpo.get_estimator(name, **options)
    history = ([1.0, 0.0, 0.0, 0.0, 1.0, 1.0], [0, 0, 0, 1, 1, 1], ["a"] * 3 + ["b"] * 3)
    est(history[0], history[1], cluster=history[2])
    before = copy.deepcopy(est.state_dict())
    for rewards in (
        torch.tensor([0.0, 1.0, huge, 0.0], dtype=torch.float64),
        np.array([0.0, 1.0, huge, 0.0]),
        [0.0, 1.0, huge, 0.0],  # a Python list must not go through float32 ("inf" in the message)
    ):
        with pytest.raises(
            ValueError,
            match=re.escape(f"position 2 is {huge:g}"),
        ):
            est(rewards, [0, 0, 1, 1], cluster=["a", "a", "b", "b"])
        with pytest.raises(ValueError, match="position 2"):
            est.observe(rewards, [0, 0, 1, 1], cluster=["a", "a", "b", "b"])
        assert est.state_dict() == before  # a rejected batch does not touch the prior
    # the estimator carries on as if the bad batches never came
    fresh = ebpo.get_estimator(name, **options)
    fresh(history[0], history[1], cluster=history[2])
    batch = ([0.0, 1.0, 1.0, 1.0], [0, 0, 1, 1], ["a", "a", "b", "b"])
    adv, expected = est(*batch[:2], cluster=batch[2]), fresh(*batch[:2], cluster=batch[2])
    assert torch.isfinite(adv).all() and torch.equal(adv, expected)


@pytest.mark.parametrize("name,options", ALL_ESTIMATORS, ids=lambda x: str(x))
def test_largest_allowed_rewards_give_finite_advantages_and_state(name, options):
    est = ebpo.get_estimator(name, **options)
    for rewards in ([1e30, -1e30, 0.0, 1e30], [-1e30, -1e30, 1e30, 1e30], [1e30, 0.0, 0.0, 0.0]):
        adv = est(rewards, [0, 0, 1, 1], cluster=["a", "a", "b", "b"])
        assert torch.isfinite(adv).all()
        assert all(math.isfinite(v) for v in est.metrics().values())
    flat = [v for v in floats(est.state_dict())]
    assert all(math.isfinite(v) for v in flat)


def test_python_list_rewards_keep_float64_precision():
    # through float32 (spacing 8 at 1e8) 100000001 would come in as 1e8 and both advantages would be 0.
    # In float64: group mean 100000000.5, advantages +-0.5 (Dr. GRPO: r - mean).
    close(ebpo.get_estimator("dr_grpo")([100000001.0, 100000000.0], [0, 0]), [0.5, -0.5])
    est = ebpo.get_estimator("ebpo", normalize="none")
    est([100000001.0, 100000000.0], [0, 0])
    assert est.prior_stats()["mu_glob"] == 100000000.5


@pytest.mark.parametrize("name", ["grpo", "jspo", "ebpo"])
def test_eps_must_be_positive(name):
    # eps = 0 would make an all-equal group 0 / 0 = NaN (GRPO's std, JSPO's lambda, EBPO's batch std).
    with pytest.raises(ValueError, match=rf"^{name}: eps .*0\.0"):
        ebpo.get_estimator(name, eps=0.0)


def test_output_that_float32_cannot_hold_is_rejected_and_state_restored():
    # normalize="prior" divides by sqrt(sigma2) + eps. Rewards 0.1 everywhere: sigma2 = 0 exactly, but the
    # group mean 0.3000..04 / 3 = 0.10000000000000002 leaves a = -1.4e-17; with eps = 1e-300 that is
    # -1.4e283, far beyond float32. The call must raise, naming the sample, and keep the prior unchanged.
    est = ebpo.get_estimator("ebpo", normalize="prior", eps=1e-300)
    before = copy.deepcopy(est.state_dict())
    with pytest.raises(ValueError, match=r"sample 0 is -1\.\d+e\+283"):
        est([0.1, 0.1, 0.1], [0, 0, 0])
    assert est.state_dict() == before
