"""The baselines EBPO is compared with, each a registered estimator over the pure functions of
:mod:`ebpo.advantages.core`: ``grpo``, ``dr_grpo``, ``rloo``, ``reinforce_pp_baseline``, ``jspo``.

None keeps state across batches. Options: ``grpo`` takes ``norm_by_std`` and ``eps``, ``jspo`` takes ``eps``,
the others none. ``jspo`` adds the metric ``jspo/lambda`` (the mean of its per-prompt lambda).
"""

from __future__ import annotations

import torch

from ebpo.advantages.base import AdvantageEstimator
from ebpo.advantages.checks import Batch, check_eps
from ebpo.advantages.core import (
    dr_grpo_advantage,
    grpo_advantage,
    jspo_advantage,
    reinforce_pp_baseline_advantage,
    rloo_advantage,
)
from ebpo.advantages.registry import register_estimator

__all__ = [
    "DrGRPOEstimator",
    "GRPOEstimator",
    "JSPOEstimator",
    "RLOOEstimator",
    "ReinforcePPBaselineEstimator",
]


@register_estimator("grpo")
class GRPOEstimator(AdvantageEstimator):
    """GRPO: A_i = (r_i - r̄_g) / (s_g + eps) (see :func:`grpo_advantage`)."""

    def __init__(self, *, norm_by_std: bool = True, eps: float = 1e-6) -> None:
        super().__init__()
        self.norm_by_std = bool(norm_by_std)
        self.eps = check_eps("grpo", eps)

    def _advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        adv_N = grpo_advantage(
            batch.rewards_N,
            batch.group_N,
            batch.num_groups,
            norm_by_std=self.norm_by_std,
            eps=self.eps,
            stats=batch.stats,
        )
        return adv_N, {}


@register_estimator("dr_grpo")
class DrGRPOEstimator(AdvantageEstimator):
    """Dr. GRPO: A_i = r_i - r̄_g (see :func:`dr_grpo_advantage`)."""

    def _advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        return dr_grpo_advantage(batch.rewards_N, batch.group_N, batch.num_groups, stats=batch.stats), {}


@register_estimator("rloo")
class RLOOEstimator(AdvantageEstimator):
    """RLOO: A_i = r_i - mean of the other G - 1 rewards (see :func:`rloo_advantage`)."""

    def _advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        return rloo_advantage(batch.rewards_N, batch.group_N, batch.num_groups, stats=batch.stats), {}


@register_estimator("reinforce_pp_baseline")
class ReinforcePPBaselineEstimator(AdvantageEstimator):
    """REINFORCE++-baseline: group-mean baseline, then batch whitening (see
    :func:`reinforce_pp_baseline_advantage`)."""

    def _advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        adv_N = reinforce_pp_baseline_advantage(
            batch.rewards_N, batch.group_N, batch.num_groups, stats=batch.stats
        )
        return adv_N, {}


@register_estimator("jspo")
class JSPOEstimator(AdvantageEstimator):
    """JSPO's James-Stein baseline over the other prompts of the batch (see :func:`jspo_advantage`)."""

    def __init__(self, *, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = check_eps("jspo", eps)

    def _advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        adv_N, js_lambda_M = jspo_advantage(
            batch.rewards_N, batch.group_N, batch.num_groups, eps=self.eps, stats=batch.stats
        )
        return adv_N, {"jspo/lambda": js_lambda_M.mean()}
