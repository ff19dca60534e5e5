"""What every estimator accepts and returns (``ebpo.advantages.checks``): bad input named by position, every
kind of group id, huge rewards, float64 inside, options' eps. That each estimator keeps this contract (and
the rest of it: degenerate batches, state, resume, dtype and device) is ``ebpo.testing.check_estimator``'s,
run on every built-in estimator in tests/test_testing.py."""

from __future__ import annotations

import copy
import re
from collections import defaultdict

import numpy as np
import pytest
import torch

import ebpo
from ebpo.advantages import GroupStats, group_ids, group_moments
from ebpo.advantages.checks import prepare
from helpers.advantages import INDEX, REWARDS, close


def test_bad_input_is_refused_naming_the_position():
    # what every estimator refuses (ebpo.testing.check_estimator holds each to it), worded once, here
    with pytest.raises(ValueError, match=r"^reward at position 3 is nan: rewards must be finite"):
        prepare(torch.tensor([0.0, 1.0, 0.0, float("nan"), float("inf")]), [0, 0, 1, 1, 1], None)
    with pytest.raises(ValueError, match="position 0 is -inf"):
        prepare([float("-inf")], [0], None)
    with pytest.raises(ValueError, match=r"^index has 2 entries but rewards has 3; they must match$"):
        prepare([0.0, 1.0, 1.0], [0, 1], None)
    with pytest.raises(ValueError, match=r"^cluster has 1 entries but rewards has 2"):
        prepare([0.0, 1.0], [0, 0], ["a"])
    with pytest.raises(ValueError, match=r"^rewards .*\(2, 2\)$"):
        prepare(torch.zeros(2, 2), [0, 1], None)
    with pytest.raises(TypeError, match="position 1"):
        prepare([0.0, 1.0], [0, [1]], None)
    empty = prepare(torch.zeros(0), [], None)
    assert empty.rewards_N.shape == (0,) and empty.num_groups == 0


@pytest.mark.parametrize("huge", [1e39, -1e39, 1e155, 1e300])
def test_huge_rewards_are_refused_naming_the_sample_however_they_come(huge):
    # Unchecked, 1e39 overflows a float32 output to +-inf and 1e155 a float64 variance (NaN everywhere, and
    # EBPO's prior would stay NaN for good); a Python list must not go through float32 ("inf" in the message)
    for rewards in (
        torch.tensor([0.0, 1.0, huge, 0.0], dtype=torch.float64),
        np.array([0.0, 1.0, huge, 0.0]),
        [0.0, 1.0, huge, 0.0],
    ):
        with pytest.raises(ValueError, match=re.escape(f"position 2 is {huge:g}")):
            prepare(rewards, [0, 0, 1, 1], None)


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


def test_group_moments_are_a_named_tuple_of_per_group_tensors():
    stats = group_moments(REWARDS.double(), group_ids(INDEX)[0], 3)
    assert isinstance(stats, GroupStats)
    torch.testing.assert_close(stats.var_M, torch.tensor([1 / 3, 0.0, 0.25], dtype=torch.float64))


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
