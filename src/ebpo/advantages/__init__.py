"""Advantage estimators for outcome rewards: EBPO and its baselines, found through one registry.

Contract (docs/design.md, "Advantage estimators")::

    est = get_estimator("ebpo", prior_scope="global")      # unknown name -> ValueError listing valid ones
    adv_N = est(rewards_N, index_N, cluster=None)           # float32, one advantage per sequence
    est.observe(rewards_N, index_N, cluster=None)           # update state only (DAPO's dropped groups)
    est.state_dict(); est.load_state_dict(sd); est.metrics()

``rewards`` are N sequence rewards, ``index`` N group ids (any hashable; groups need not be contiguous and
may differ in size), ``cluster`` optional N cluster keys, constant within a group. Computation is float64
inside; the result is float32 on the rewards' device. Bad input raises ``ValueError`` naming the first bad
position, and leaves the estimator's state exactly as it was; nothing non-finite is ever returned or stored.

The package, one concern a module:

- :mod:`~ebpo.advantages.core`: the group maths, pure functions of tensors with their shapes and formulas
  (``grpo_advantage``, ``rloo_advantage``, ``jspo_advantage``, ``shrinkage_baseline``, ``ebpo_advantage``...);
- :mod:`~ebpo.advantages.checks`: what the estimators accept and return, and the group ids (``group_ids``);
  ``prepare(rewards, index, cluster)`` makes ``__call__``'s checks of a batch and returns the ``Batch``: a
  stateful estimator's ``observe`` calls it before folding the batch into its state;
- :mod:`~ebpo.advantages.base`: ``AdvantageEstimator``, the call contract and the metrics every estimator logs;
- :mod:`~ebpo.advantages.registry`: ``register_estimator`` / ``get_estimator`` / ``list_estimators``;
- :mod:`~ebpo.advantages.baselines`: ``grpo``, ``dr_grpo``, ``rloo``, ``reinforce_pp_baseline``, ``jspo``;
- :mod:`~ebpo.advantages.ebpo`: ``EBPOOptions``, EBPO's prior and ``EBPOEstimator``.
"""

from __future__ import annotations

from ebpo.advantages import baselines  # noqa: F401  (importing it registers the baselines)
from ebpo.advantages.base import ZERO_ADV_TOL, AdvantageEstimator  # noqa: F401  (ZERO_ADV_TOL: plumbing, below)
from ebpo.advantages.checks import Batch, OptionError, group_ids, prepare  # noqa: F401  (Batch, OptionError: below)
from ebpo.advantages.core import (
    GroupStats,
    batch_normalize,
    dr_grpo_advantage,
    ebpo_advantage,
    group_moments,
    grpo_advantage,
    jspo_advantage,
    reinforce_pp_baseline_advantage,
    rloo_advantage,
    shrinkage_baseline,
)
from ebpo.advantages.ebpo import EBPO_CHOICES, EBPOEstimator, EBPOOptions
from ebpo.advantages.registry import (
    check_options,  # noqa: F401  (plumbing, below)
    get_estimator,
    list_estimators,
    option_names,  # noqa: F401  (plumbing, below)
    register_estimator,
)

__all__ = [
    "EBPO_CHOICES",
    "AdvantageEstimator",
    "EBPOEstimator",
    "EBPOOptions",
    "GroupStats",
    "batch_normalize",
    "dr_grpo_advantage",
    "ebpo_advantage",
    "get_estimator",
    "group_ids",
    "group_moments",
    "grpo_advantage",
    "jspo_advantage",
    "list_estimators",
    "prepare",
    "register_estimator",
    "reinforce_pp_baseline_advantage",
    "rloo_advantage",
    "shrinkage_baseline",
]
# Importable from here but left out of __all__: for the code that reads estimator options from its own config
# (``ebpo train``, the verl and TRL adapters) check_options, option_names, OptionError and ZERO_ADV_TOL; for an
# AdvantageEstimator subclass, the Batch its ``_advantages`` receives.
