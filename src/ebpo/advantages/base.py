"""The base class of every estimator: the call contract, the rollback on error, the metrics all share.

An estimator is called on one batch (``est(rewards_N, index_N, cluster=None)``, inputs as
:mod:`ebpo.advantages.checks` describes) and returns one float32 advantage per sample on the rewards' device.
A subclass implements ``_advantages(batch) -> (adv_N, extra_metrics)`` over a checked :class:`Batch`
(float64 rewards, group ids, the group statistics) and, if it keeps state across batches (EBPO's prior),
``observe`` / ``state_dict`` / ``load_state_dict``. A batch that raises leaves the state exactly as it was; an
empty batch returns an empty tensor and leaves the state alone.

Metrics (``est.metrics()``, the last call's batch), for every estimator:

- ``groups/num``: number of groups M in the batch.
- ``groups/all_fail`` / ``groups/all_pass``: fraction of groups whose rewards are all at the floor / all
  at the ceiling. Binary batches (every reward 0 or 1): all 0 / all 1. Shaped rewards: all equal to the
  batch minimum / maximum, counted only when the batch minimum < maximum (a batch holding one value
  everywhere says nothing about which end it is at, so both fractions are 0 there).
- ``adv/zero_frac``: fraction of samples with |A| < :data:`ZERO_ADV_TOL`; ``adv/abs_mean``: mean |A|.

Each estimator adds its own (``ebpo/...`` for EBPO, ``jspo/lambda`` for JSPO: their classes' docstrings).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from ebpo.advantages.checks import Batch, check_advantages, prepare
from ebpo.advantages.core import GroupStats, group_moments

__all__ = ["ZERO_ADV_TOL", "AdvantageEstimator"]

ZERO_ADV_TOL = 1e-8  # |A| below this counts as "no signal" in adv/zero_frac


def _common_metrics(
    batch: Batch, stats: GroupStats, abs_adv_N: torch.Tensor
) -> dict[str, torch.Tensor | float]:
    """groups/num, groups/all_fail, groups/all_pass, adv/zero_frac, adv/abs_mean (definitions: module doc),
    from the batch, its stats and the advantages' absolute values. A fraction is a count / the total, as
    the mean of 0/1 values gives it, to the bit."""
    rewards_N, num_groups = batch.rewards_N, batch.num_groups
    num_fail: torch.Tensor | float = 0.0
    num_pass: torch.Tensor | float = 0.0
    if bool(((rewards_N == 0) | (rewards_N == 1)).all()):
        # binary: a group's rewards are all 0 when its mean is 0, all 1 when its mean is exactly 1 (a sum of
        # 0s and 1s is exact, and k / G = 1 only for k = G)
        num_fail, num_pass = (stats.mean_M == 0).sum(), (stats.mean_M == 1).sum()
    else:
        floor, ceiling = float(rewards_N.min()), float(rewards_N.max())
        if floor < ceiling:  # one value everywhere says nothing about which end it is at
            inf = torch.full((num_groups,), math.inf, dtype=rewards_N.dtype, device=rewards_N.device)
            group_min_M = inf.scatter_reduce(0, batch.group_N, rewards_N, reduce="amin")
            group_max_M = (-inf).scatter_reduce(0, batch.group_N, rewards_N, reduce="amax")
            num_fail, num_pass = (group_max_M == floor).sum(), (group_min_M == ceiling).sum()
    return {
        "groups/num": float(num_groups),
        "groups/all_fail": float(num_fail) / num_groups,
        "groups/all_pass": float(num_pass) / num_groups,
        "adv/zero_frac": float((abs_adv_N < ZERO_ADV_TOL).sum()) / abs_adv_N.numel(),
        "adv/abs_mean": abs_adv_N.mean(),
    }


_EMPTY_METRICS = {
    "groups/num": 0.0,
    "groups/all_fail": 0.0,
    "groups/all_pass": 0.0,
    "adv/zero_frac": 0.0,
    "adv/abs_mean": 0.0,
}


class AdvantageEstimator:
    """Base class: validation, metrics, and the call contract. Subclasses implement :meth:`_advantages`
    and are found by name once registered (:func:`ebpo.advantages.register_estimator`).

    Stateless estimators inherit the no-op :meth:`observe` and the empty state dict.
    """

    name: str = ""
    options_type: ClassVar[type | None] = None
    """The dataclass that declares the estimator's options, when it has one (EBPO: :class:`ebpo.advantages.EBPOOptions`)."""

    def __init__(self) -> None:
        self._metrics: dict[str, float] = dict(_EMPTY_METRICS)

    def __call__(self, rewards: Any, index: Any, cluster: Any = None) -> torch.Tensor:
        """Advantages (float32, shape (N,)) of N sequence rewards grouped by ``index``.

        Raises ValueError (state unchanged) for bad input and for an advantage float32 cannot hold.
        """
        batch = prepare(rewards, index, cluster)
        if batch.rewards_N.numel() == 0:
            self._metrics = dict(_EMPTY_METRICS)
            return torch.zeros(0, dtype=torch.float32, device=batch.rewards_N.device)
        stats = group_moments(batch.rewards_N, batch.group_N, batch.num_groups)
        batch = batch._replace(stats=stats)
        saved = self.state_dict()  # a batch that raises must leave no trace in the state
        try:
            adv_N, extra = self._advantages(batch)
            abs_adv_N = adv_N.abs()
            check_advantages(self.name or type(self).__name__, adv_N, abs_adv_N, batch.rewards_N)
        except Exception:
            self.load_state_dict(saved)
            raise
        common = _common_metrics(batch, stats, abs_adv_N)
        self._metrics = {name: float(value) for name, value in {**common, **extra}.items()}
        return adv_N.to(torch.float32)

    def _advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        raise NotImplementedError

    def observe(self, rewards: Any, index: Any, cluster: Any = None) -> None:
        """Update state from a batch without computing advantages; stateless estimators only validate."""
        prepare(rewards, index, cluster)

    def metrics(self) -> dict[str, float]:
        """Statistics of the last ``__call__`` (names in the module docstring)."""
        return dict(self._metrics)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(
                f"estimator {self.name or type(self).__name__!r} is stateless but got state keys {sorted(state)}"
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
