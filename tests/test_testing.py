"""``ebpo.testing.check_estimator``: every built-in estimator keeps every property (the suite's conformance
checks of the estimators live there, once), and each property fails, naming the batch, on an estimator broken
in just that way."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ebpo
from ebpo.advantages.checks import prepare
from ebpo.testing import PROPERTIES, EstimatorCheckFailed, check_estimator

ALL_ESTIMATORS = [
    ("grpo", {}),
    ("grpo", {"norm_by_std": False}),
    ("dr_grpo", {}),
    ("rloo", {}),
    ("reinforce_pp_baseline", {}),
    ("jspo", {}),
    ("ebpo", {}),
    ("ebpo", {"normalize": "none"}),
    ("ebpo", {"normalize": "group"}),
    ("ebpo", {"normalize": "prior"}),
    ("ebpo", {"sigma2": "pooled", "tau2": "latent", "tau2_floor": 1e-3}),
    ("ebpo", {"prior_scope": "cluster", "cluster_min_groups": 1, "prior_memory": 3.0}),
    ("ebpo", {"prior_scope": "cluster", "cluster_min_groups": 2, "prior_memory": 4.0, "tau2": "latent"}),
]


@pytest.mark.parametrize("name,options", ALL_ESTIMATORS, ids=lambda x: str(x))
def test_every_builtin_estimator_keeps_every_property(name, options):
    report = check_estimator(name, **options)
    assert report.passed == list(PROPERTIES) and not report.skipped


# ---------------------------------------------------------------------------------------------------------
# estimators broken in one way each


class MeanBaseline(ebpo.AdvantageEstimator):
    """r - group mean: a correct estimator the broken ones below start from."""

    def _advantages(self, batch):
        return batch.rewards_N - batch.stats.mean_M[batch.group_N], {}


class Float64Out(MeanBaseline):
    def __call__(self, rewards, index, cluster=None):
        return super().__call__(rewards, index, cluster).double()  # output: not float32


class NaNMetric(MeanBaseline):
    def metrics(self):
        return {**super().metrics(), "mine/ratio": float("nan")}  # output: a metric that is not finite


class NoEps(ebpo.AdvantageEstimator):
    def _advantages(self, batch):  # divides by the batch's std without eps: 0 / 0 where all rewards are equal
        centred_N = batch.rewards_N - batch.stats.mean_M[batch.group_N]
        return centred_N / batch.rewards_N.std(), {}


class FixedBaseline(ebpo.AdvantageEstimator):
    def _advantages(self, batch):  # r - 0.25: a push where every reward is the same
        return batch.rewards_N - 0.25, {}


class FirstAsBaseline(ebpo.AdvantageEstimator):
    def _advantages(self, batch):  # the baseline is the group's first sample: it depends on the order
        position_N = torch.arange(batch.rewards_N.numel(), device=batch.rewards_N.device)
        first_M = torch.full((batch.num_groups,), batch.rewards_N.numel(), device=batch.rewards_N.device)
        first_M = first_M.scatter_reduce(0, batch.group_N, position_N, reduce="amin")
        return batch.rewards_N - batch.rewards_N[first_M][batch.group_N], {}


class NaNAsZero(MeanBaseline):
    def __call__(self, rewards, index, cluster=None):  # silently zeroes a NaN or infinite reward
        return super().__call__(
            torch.nan_to_num(torch.as_tensor(rewards, dtype=torch.float64), 0, 0, 0), index, cluster
        )


class Truncates(MeanBaseline):
    def __call__(self, rewards, index, cluster=None):  # cuts the rewards to the ids given
        return super().__call__(list(rewards)[: len(index)], index, None)


class RunningMean(ebpo.AdvantageEstimator):
    """r - the running mean of every reward: correct, stateful."""

    def __init__(self):
        super().__init__()
        self.state = {"count": 0, "mean": 0.0}

    def _fold(self, rewards_N):
        n = rewards_N.numel()
        if n:
            self.state["count"] += n
            self.state["mean"] += (float(rewards_N.sum()) - n * self.state["mean"]) / self.state["count"]

    def observe(self, rewards, index, cluster=None):
        self._fold(prepare(rewards, index, cluster).rewards_N)

    def _advantages(self, batch):
        self._fold(batch.rewards_N)
        return batch.rewards_N - self.state["mean"], {}

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = {"count": int(state["count"]), "mean": float(state["mean"])}


class SharedState(RunningMean):
    def state_dict(self):
        return self.state  # the live dict: the base class's copy before a batch is no copy at all


class NumpyState(RunningMean):
    def state_dict(self):
        return {"count": self.state["count"], "mean": np.float64(self.state["mean"])}  # torch.load refuses it


class HiddenState(RunningMean):
    def __init__(self):
        super().__init__()
        self.observed = 0  # observe() counts the batches it is given, which scales the advantages, unsaved

    def observe(self, rewards, index, cluster=None):
        super().observe(rewards, index, cluster)
        self.observed += 1

    def _advantages(self, batch):
        adv_N, metrics = super()._advantages(batch)
        return adv_N * (1 + self.observed), metrics


class ListsTwice(MeanBaseline):
    def __call__(self, rewards, index, cluster=None):  # an answer that depends on how rewards are passed
        return super().__call__(rewards, index, cluster) * (2 if isinstance(rewards, list) else 1)


BROKEN = {
    "output": [
        (Float64Out, {"output", "degenerate_batches", "group_ids", "dtype_device"}),
        (NaNMetric, {"output", "degenerate_batches"}),
    ],
    "degenerate_batches": [(NoEps, {"degenerate_batches", "no_signal_is_zero"})],
    "no_signal_is_zero": [(FixedBaseline, {"no_signal_is_zero"})],
    "group_ids": [(FirstAsBaseline, {"group_ids"})],
    "non_finite_refused": [(NaNAsZero, {"non_finite_refused"})],
    "bad_input_refused": [(Truncates, {"bad_input_refused"})],
    "raising_batch_keeps_state": [(SharedState, {"raising_batch_keeps_state"})],
    "state_dict_round_trip": [(NumpyState, {"state_dict_round_trip"})],
    "resume": [(HiddenState, {"resume"})],
    "dtype_device": [(ListsTwice, {"dtype_device"})],
}


def test_every_property_has_a_broken_estimator():
    assert list(BROKEN) == list(PROPERTIES)


@pytest.mark.parametrize("prop", list(BROKEN))
def test_each_property_fails_on_an_estimator_broken_that_way(prop):
    for cls, failing in BROKEN[prop]:
        report = check_estimator(cls, raise_on_failure=False)
        assert set(report.failed) == failing, (cls.__name__, str(report))
        (failure,) = [f for f in report.failures if f.property == prop]
        assert str(failure).startswith(f"FAILED {prop}")
    with pytest.raises(EstimatorCheckFailed, match=rf"(?m)^FAILED {prop}\b"):
        check_estimator(BROKEN[prop][0][0])


def test_the_correct_estimators_the_broken_ones_start_from_pass():
    assert check_estimator(MeanBaseline).ok and check_estimator(RunningMean).ok
