"""Advantage estimators for outcome rewards: EBPO and its baselines, found through one registry.

Contract (docs/design.md, "Advantage estimators")::

    est = get_estimator("ebpo", prior_scope="global")      # unknown name -> ValueError listing valid ones
    adv_N = est(rewards_N, index_N, cluster=None)           # float32, one advantage per sequence
    est.observe(rewards_N, index_N, cluster=None)           # update state only (DAPO's dropped groups)
    est.state_dict(); est.load_state_dict(sd); est.metrics()

``rewards`` are N sequence rewards, ``index`` N group ids (any hashable; groups need not be contiguous and
may differ in size), ``cluster`` optional N cluster keys, constant within a group. Computation is float64
inside (Python lists and arrays are read straight into float64); the result is float32 on the rewards'
device. A reward that is NaN, inf or larger in magnitude than ``MAX_ABS_REWARD`` (1e30) raises
``ValueError`` naming the first bad position; so does an advantage that float32 cannot hold. A batch that
raises leaves the estimator's state exactly as it was; an empty batch returns an empty tensor and leaves
the state alone. Nothing non-finite is ever returned or stored.

The math lives in pure tensor functions (``grpo_advantage``, ``rloo_advantage``, ``jspo_advantage``,
``shrinkage_baseline``, ``ebpo_advantage``...) over per-sample group ids, vectorised with ``index_add`` /
``scatter_reduce`` (no Python loop over groups); the registered classes hold state and metrics.
Formulas: docs/design.md §1-§3 and the EBPO paper (Section 3.2, Algorithm 1).

Metrics (``est.metrics()``, the last call's batch), for every estimator:

- ``groups/num``: number of groups M in the batch.
- ``groups/all_fail`` / ``groups/all_pass``: fraction of groups whose rewards are all at the floor / all
  at the ceiling. Binary batches (every reward 0 or 1): all 0 / all 1. Shaped rewards: all equal to the
  batch minimum / maximum, counted only when the batch minimum < maximum (a batch holding one value
  everywhere says nothing about which end it is at, so both fractions are 0 there).
- ``adv/zero_frac``: fraction of samples with |A| < 1e-8; ``adv/abs_mean``: mean |A|.

and for ``ebpo`` (means over the batch's groups of each group's prior): ``ebpo/mu_glob``, ``ebpo/sigma2``,
``ebpo/tau2``, ``ebpo/shrinkage`` (mean S), ``ebpo/baseline_mean`` (mean V_eb), ``ebpo/cluster_prior_frac``
(fraction of groups that used their cluster's own prior); for ``jspo``: ``jspo/lambda`` (mean lambda).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
import typing
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NamedTuple

import numpy as np
import torch

from ebpo.registry import Registry, check_choice
from ebpo.welford import EWWelford, Welford

__all__ = [
    "EBPO_CHOICES",
    "AdvantageEstimator",
    "Batch",
    "EBPOEstimator",
    "EBPOOptions",
    "OptionError",
    "GroupStats",
    "batch_normalize",
    "check_options",
    "dr_grpo_advantage",
    "ebpo_advantage",
    "get_estimator",
    "group_ids",
    "group_moments",
    "grpo_advantage",
    "jspo_advantage",
    "list_estimators",
    "option_names",
    "register_estimator",
    "reinforce_pp_baseline_advantage",
    "rloo_advantage",
    "shrinkage_baseline",
]

ZERO_ADV_TOL = 1e-8  # |A| below this counts as "no signal" in adv/zero_frac

MAX_ABS_REWARD = 1e30
"""Largest |reward| accepted. Far above any reward in practice, and small enough that every intermediate
value stays finite: an unnormalised advantage is at most 2e30 (float32 holds 3.4e38) and a running M2 grows
like n * (2e30)^2, finite for any n below 1e247. Rewards beyond it are rejected, never rescaled: rescaling
one batch would put it on another scale than the prior's history."""

FLOAT32_MAX = float(torch.finfo(torch.float32).max)

# ----------------------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------------------

_ESTIMATORS: Registry[type[AdvantageEstimator]] = Registry("advantage estimator")


def register_estimator(name: str) -> Callable[[type[AdvantageEstimator]], type[AdvantageEstimator]]:
    """Class decorator: make ``get_estimator(name, **options)`` build ``cls(**options)``."""

    def decorator(cls: type[AdvantageEstimator]) -> type[AdvantageEstimator]:
        _ESTIMATORS.register(name, cls)
        cls.name = name
        return cls

    return decorator


def list_estimators() -> list[str]:
    """Names accepted by :func:`get_estimator`, sorted."""
    return _ESTIMATORS.names()


def get_estimator(name: str, **options: Any) -> AdvantageEstimator:
    """Build the estimator registered as ``name`` with keyword ``options``.

    Raises ValueError for an unknown name (listing the valid ones) and TypeError for options the
    estimator does not take (naming them and listing the ones it does).
    """
    valid = option_names(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise TypeError(
            f"advantage estimator {name!r} got unknown option(s) {unknown}; "
            f"valid options: {valid if valid else 'none'}"
        )
    return _ESTIMATORS.get(name)(**options)


def option_names(name: str) -> list[str]:
    """The keyword options estimator ``name`` takes: the fields of its ``options_type`` (EBPO:
    :class:`EBPOOptions`), else its constructor's keyword-only parameters."""
    cls = _ESTIMATORS.get(name)
    if cls.options_type is not None:
        return [f.name for f in dataclasses.fields(cls.options_type)]
    params = inspect.signature(cls.__init__).parameters
    return [p for p in params if p != "self" and params[p].kind is inspect.Parameter.KEYWORD_ONLY]


def check_options(
    name: str, options: Mapping[str, Any], *, where: str, also_valid: Sequence[str] = ()
) -> None:
    """Check a framework's options for estimator ``name`` before anything is built, naming the key at fault
    as ``<where>.<key>`` (``algorithm.estimator_options.normalize``, ``algorithm.ebpo.tau2``,
    ``EBPOConfig.prior_memory``): ``ValueError`` for a key that is not one of its options (listing them, and
    ``also_valid``, keys the framework reads itself) or a value it rejects."""
    valid = option_names(name)
    unknown = sorted(set(options) - set(valid) - set(also_valid))
    if unknown:
        listed = ", ".join(f"{where}.{key}" for key in [*valid, *also_valid]) or "none"
        raise OptionError(
            unknown[0], f"{where}.{unknown[0]} is rejected by {name!r}: not one of its options ({listed})"
        )
    try:
        get_estimator(name, **{key: value for key, value in options.items() if key in valid})
    except OptionError as err:
        raise OptionError(err.option, f"{where}.{err.option}: {err}") from None
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where} {dict(options)} rejected by {name!r}: {err}") from None


# ----------------------------------------------------------------------------------------------------
# Input handling
# ----------------------------------------------------------------------------------------------------


def _to_hashable(key: Any) -> Hashable:
    """numpy scalars -> Python scalars so that np.str_('a'), 'a' and checkpoints agree."""
    if isinstance(key, np.generic):
        return key.item()
    return key


def group_ids(index: Any) -> tuple[torch.Tensor, int]:
    """Map N group ids to (inverse LongTensor[N] with values in 0..M-1, M).

    ``index`` may be a 1-D tensor or numpy array of ints / strings, a numpy object array, or any sequence
    of hashables. Integer and fixed-width string arrays are factorised with ``unique`` (group numbers in
    sorted order); anything else with a dict (numbers in order of first appearance). Object arrays are
    first cut into runs of equal neighbours (vectorised), so only one key per run goes through the dict:
    verl-style batches, where a group's samples sit together, cost O(M) Python work, not O(N). Only
    equality of ids matters to the estimators, never their order.
    """
    if isinstance(index, torch.Tensor):
        if index.ndim != 1:
            raise ValueError(f"index must be 1-D, got shape {tuple(index.shape)}")
        if not index.dtype.is_floating_point and not index.dtype.is_complex:
            uniques, inverse_N = torch.unique(index, return_inverse=True)
            return inverse_N.long(), int(uniques.numel())
        index = index.tolist()
    if isinstance(index, np.ndarray):
        if index.ndim != 1:
            raise ValueError(f"index must be 1-D, got shape {index.shape}")
        if index.dtype.kind in "biuUS":
            uniques, inverse = np.unique(index, return_inverse=True)
            return torch.from_numpy(inverse.reshape(-1).astype(np.int64)), int(uniques.size)
        runs = _runs(index)
        if runs is not None:
            starts, lengths = runs
            run_ids, num_groups = _factorize_hashables(index[starts].tolist())
            return torch.from_numpy(np.repeat(run_ids, lengths)), num_groups
        index = index.tolist()
    inverse, num_groups = _factorize_hashables(index)
    return torch.from_numpy(inverse), num_groups


def _runs(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(start, length) of each run of equal neighbours in an object array; None if keys do not compare."""
    num = keys.size
    if num == 0:
        return None
    try:
        change = np.empty(num, dtype=bool)
        change[0] = True
        change[1:] = np.asarray(keys[1:] != keys[:-1], dtype=bool)
    except (TypeError, ValueError):
        return None
    starts = np.flatnonzero(change)
    lengths = np.diff(np.append(starts, num))
    return starts, lengths


def _factorize_hashables(keys: Any) -> tuple[np.ndarray, int]:
    """Number distinct keys in order of first appearance: (int64 array of ids, count)."""
    mapping: dict[Hashable, int] = {}
    try:
        if isinstance(keys, list) and len(set(keys)) == len(keys):  # all distinct (verl's runs): 0, 1, ...
            return np.arange(len(keys), dtype=np.int64), len(keys)
        inverse = [mapping.setdefault(key, len(mapping)) for key in keys]
    except TypeError:
        for position, key in enumerate(keys):
            if not isinstance(key, Hashable):
                raise TypeError(
                    f"group id at position {position} is {type(key).__name__} {key!r}, which is not hashable"
                ) from None
        raise
    return np.array(inverse, dtype=np.int64), len(mapping)


class Batch(NamedTuple):
    """A validated batch: float64 rewards, group ids 0..M-1, and optional per-sample cluster keys; in an
    estimator's ``_advantages``, also the batch's :class:`GroupStats` (computed once per call, shared by the
    estimator and the metrics)."""

    rewards_N: torch.Tensor  # (N,) float64
    group_N: torch.Tensor  # (N,) long, values in 0..num_groups-1
    num_groups: int
    cluster: list[Hashable] | None  # N keys, or None
    stats: GroupStats | None = None


def _prepare(rewards: Any, index: Any, cluster: Any) -> Batch:
    """Validate the contract's inputs (see module docstring) and compute group ids."""
    if isinstance(rewards, torch.Tensor):
        rewards_t = rewards
    else:  # torch.as_tensor of a list would make float32: 1e39 -> inf, 100000001.0 -> 1e8
        rewards_t = torch.as_tensor(rewards, dtype=torch.float64)
    if rewards_t.ndim != 1:
        raise ValueError(
            f"rewards must be a 1-D tensor of N sequence rewards, got shape {tuple(rewards_t.shape)}"
        )
    if rewards_t.dtype == torch.float64 and not rewards_t.requires_grad:
        rewards_N = rewards_t  # only read, never written to
    else:
        rewards_N = rewards_t.detach().to(torch.float64)
    num = rewards_N.numel()
    # one reduction: the largest |reward| is NaN when any reward is, so the comparison fails for NaN too
    if num and not float(rewards_N.abs().max()) <= MAX_ABS_REWARD:
        bad_N = ~(rewards_N.abs() <= MAX_ABS_REWARD)  # true for NaN, +-inf and huge values
        position = int(bad_N.nonzero()[0, 0])
        raise ValueError(
            f"reward at position {position} is {rewards_N[position].item():g}: rewards must be finite with "
            f"|reward| <= {MAX_ABS_REWARD:g} (check the reward function for this sample; rescale rewards "
            "that are meant to be this large)"
        )
    if len(index) != num:
        raise ValueError(f"index has {len(index)} entries but rewards has {num}; they must match")
    if cluster is not None and len(cluster) != num:
        raise ValueError(f"cluster has {len(cluster)} entries but rewards has {num}; they must match")
    if num == 0:
        return Batch(rewards_N, torch.zeros(0, dtype=torch.long, device=rewards_N.device), 0, None)
    group_N, num_groups = group_ids(index)
    keys = None
    if cluster is not None:
        source = cluster.tolist() if isinstance(cluster, np.ndarray | torch.Tensor) else list(cluster)
        keys = [_to_hashable(key) for key in source]
    return Batch(rewards_N, group_N.to(rewards_N.device), num_groups, keys)


# ----------------------------------------------------------------------------------------------------
# Pure math over group ids
# ----------------------------------------------------------------------------------------------------


class GroupStats(NamedTuple):
    """Per-group statistics; each tensor has shape (M,)."""

    count_M: torch.Tensor  # G_m, float64
    mean_M: torch.Tensor  # r̄_m
    var_M: torch.Tensor  # unbiased sample variance s_m^2 (0 when G_m < 2)


def _group_sum(values_N: torch.Tensor, group_N: torch.Tensor, num_groups: int) -> torch.Tensor:
    return torch.zeros(num_groups, dtype=values_N.dtype, device=values_N.device).index_add_(
        0, group_N, values_N
    )


def group_moments(rewards_N: torch.Tensor, group_N: torch.Tensor, num_groups: int) -> GroupStats:
    """G_m, r̄_m = sum_i r_mi / G_m and s_m^2 = sum_i (r_mi - r̄_m)^2 / (G_m - 1) (0 for G_m < 2); two-pass."""
    count_M = _group_sum(torch.ones_like(rewards_N), group_N, num_groups)
    mean_M = _group_sum(rewards_N, group_N, num_groups) / count_M.clamp_min(1.0)
    centered_N = rewards_N - mean_M[group_N]
    sq_sum_M = _group_sum(centered_N * centered_N, group_N, num_groups)
    var_M = torch.where(count_M > 1, sq_sum_M / (count_M - 1).clamp_min(1.0), torch.zeros_like(sq_sum_M))
    return GroupStats(count_M, mean_M, var_M)


def _batch_moments(adv_N: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(a - mean(a), var(a)) over N >= 1 samples, var unbiased (0 when N < 2): what batch whitening needs."""
    num = adv_N.numel()
    centered_N = adv_N - adv_N.mean()
    var = (centered_N * centered_N).sum() / (num - 1) if num > 1 else adv_N.new_zeros(())
    return centered_N, var


def batch_normalize(adv_N: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """A = (a - mean(a)) / (std(a) + eps), std unbiased over all N samples (0 when N < 2); docs/design.md §1 step 5."""
    if adv_N.numel() == 0:
        return adv_N
    centered_N, var = _batch_moments(adv_N)
    return centered_N / (torch.sqrt(var) + eps)


def grpo_advantage(
    rewards_N: torch.Tensor,
    group_N: torch.Tensor,
    num_groups: int,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    stats: GroupStats | None = None,
) -> torch.Tensor:
    """GRPO (Shao et al. 2024; docs/design.md §3): A_i = (r_i - r̄_g) / (s_g + eps), s_g the unbiased group std.

    With ``norm_by_std=False`` this is Dr. GRPO's A_i = r_i - r̄_g. A group of one has r_i = r̄_g and
    s_g = 0, so its advantage is 0 (verl instead uses mean 0, std 1 there and returns r_i). ``stats``: the
    batch's :func:`group_moments`, when already computed (here and in the functions below).
    """
    stats = stats if stats is not None else group_moments(rewards_N, group_N, num_groups)
    adv_N = rewards_N - stats.mean_M[group_N]
    if norm_by_std:
        std_M = torch.sqrt(stats.var_M)
        adv_N = adv_N / (std_M[group_N] + eps)
    return adv_N


def dr_grpo_advantage(
    rewards_N: torch.Tensor, group_N: torch.Tensor, num_groups: int, *, stats: GroupStats | None = None
) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025; docs/design.md §3): A_i = r_i - r̄_g, no std normalisation."""
    return grpo_advantage(rewards_N, group_N, num_groups, norm_by_std=False, stats=stats)


def rloo_advantage(
    rewards_N: torch.Tensor, group_N: torch.Tensor, num_groups: int, *, stats: GroupStats | None = None
) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024; docs/design.md §3): A_i = r_i - (sum_g - r_i) / (G - 1) = G / (G - 1) * (r_i - r̄_g).

    A group of one has no other sample to form a baseline from: its advantage is 0.
    """
    stats = stats if stats is not None else group_moments(rewards_N, group_N, num_groups)
    count_N = stats.count_M[group_N]
    loo_scale_N = torch.where(count_N > 1, count_N / (count_N - 1).clamp_min(1.0), torch.zeros_like(count_N))
    return loo_scale_N * (rewards_N - stats.mean_M[group_N])


def reinforce_pp_baseline_advantage(
    rewards_N: torch.Tensor,
    group_N: torch.Tensor,
    num_groups: int,
    *,
    whiten_eps: float = 1e-8,
    stats: GroupStats | None = None,
) -> torch.Tensor:
    """REINFORCE++-baseline (Hu 2025; verl's ``reinforce_plus_plus_baseline``).

    a_i = r_i - r̄_g, then whitened over the whole batch: A = (a - mean(a)) / sqrt(var(a) + whiten_eps),
    var unbiased (0 when N < 2). Two deliberate differences from verl: verl whitens over tokens (each
    sequence weighted by its length; equal to ours when all responses have one length) and gives a group
    of one the baseline 0; here a group of one gets a = 0 before whitening.
    """
    stats = stats if stats is not None else group_moments(rewards_N, group_N, num_groups)
    adv_N = rewards_N - stats.mean_M[group_N]
    if adv_N.numel() == 0:
        return adv_N
    centered_N, var = _batch_moments(adv_N)
    return centered_N * torch.rsqrt(var + whiten_eps)  # eps inside the square root (verl's)


def jspo_advantage(
    rewards_N: torch.Tensor,
    group_N: torch.Tensor,
    num_groups: int,
    *,
    eps: float = 1e-6,
    stats: GroupStats | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """JSPO's James-Stein baseline (Zeng et al. 2025; docs/design.md §3), returning (A_N, lambda_M).

    For prompt p, using only the other prompts q != p (M - 1 of them):
      v2_p = mean_{q != p} s_q^2 / G_q,
      s2_p = mean_{q != p} (r̄_q - mean_{q' != p} r̄_q')^2   (spread of the other prompts' means, divided by
             M - 1 as in the official code),
      lambda_p = v2_p / (v2_p + s2_p + eps),
      baseline_i = (1 - lambda_p) * (sum_p - r_i) / (G_p - 1) + lambda_p * (mean of all rewards outside p),
      A_i = r_i - baseline_i (no std normalisation).
    Edge cases: with a single prompt (M = 1) there are no other prompts, lambda = 0 and JSPO is RLOO; a group
    of one has no leave-one-out mean, so its baseline is the outside mean alone (lambda taken as 1), and 0
    advantage when it is also the only prompt.
    """
    stats = stats if stats is not None else group_moments(rewards_N, group_N, num_groups)
    count_M, mean_M = stats.count_M, stats.mean_M
    sum_M = mean_M * count_M
    num = rewards_N.numel()
    others = num_groups - 1
    if others > 0:
        noise_M = stats.var_M / count_M  # s_q^2 / G_q
        v2_M = (noise_M.sum() - noise_M) / others
        other_mean_M = (mean_M.sum() - mean_M) / others
        other_sq_M = ((mean_M * mean_M).sum() - mean_M * mean_M) / others
        s2_M = (other_sq_M - other_mean_M * other_mean_M).clamp_min(0.0)
        js_lambda_M = v2_M / (v2_M + s2_M + eps)
        outside_mean_M = (sum_M.sum() - sum_M) / (num - count_M)
    else:
        js_lambda_M = torch.zeros_like(mean_M)
        outside_mean_M = mean_M.clone()
    count_N = count_M[group_N]
    loo_mean_N = (sum_M[group_N] - rewards_N) / (count_N - 1).clamp_min(1.0)
    js_lambda_N = js_lambda_M[group_N]
    single_N = count_N < 2
    if others > 0:
        js_lambda_N = torch.where(single_N, torch.ones_like(js_lambda_N), js_lambda_N)
    loo_mean_N = torch.where(single_N, rewards_N, loo_mean_N)  # only used when others == 0 (weight 1 - 0)
    baseline_N = (1.0 - js_lambda_N) * loo_mean_N + js_lambda_N * outside_mean_M[group_N]
    return rewards_N - baseline_N, js_lambda_M


def shrinkage_baseline(
    mean_M: torch.Tensor,
    count_M: torch.Tensor,
    mu_glob_M: torch.Tensor,
    sigma2_M: torch.Tensor,
    tau2_M: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """EBPO's shrinkage baseline (paper eq. for V^EB; docs/design.md §1 step 3), returning (S_M, V_eb_M).

    S_m = (sigma2 / G_m) / (sigma2 / G_m + tau2), S_m = 0 when the denominator is 0;
    V_m = (1 - S_m) * r̄_m + S_m * mu_glob. Prior arguments broadcast against (M,).
    """
    noise_M = sigma2_M / count_M  # sigma2 / G_m
    denom_M = noise_M + tau2_M
    positive_M = denom_M > 0
    shrinkage = torch.where(positive_M, noise_M / torch.where(positive_M, denom_M, 1.0), 0.0)
    V_eb = (1.0 - shrinkage) * mean_M + shrinkage * mu_glob_M
    return shrinkage, V_eb


def ebpo_advantage(
    rewards_N: torch.Tensor,
    group_N: torch.Tensor,
    stats: GroupStats,
    mu_glob_M: torch.Tensor,
    sigma2_M: torch.Tensor,
    tau2_M: torch.Tensor,
    *,
    normalize: str = "batch",
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """EBPO advantage given the prior (docs/design.md §1 steps 3-5; paper Algorithm 1), returning (A_N, S_M, V_eb_M).

    a_mi = r_mi - V_m (raw advantage), then per ``normalize``:
      - ``batch`` (paper): A = (a - mean(a)) / (std(a) + eps) over all N samples. With equal group sizes
        and one prior, a - mean(a) = r - (1 - S) r̄_m - S r̄_batch: mu_glob cancels and the prior acts
        only through S (docs/theory.md, identity 1);
      - ``group``: A = a / (sqrt((1 - S_m) s_m^2 + S_m sigma2) + eps), each group scaled by its shrunk
        standard deviation (GRPO's per-group scale when S = 0; an all-fail group keeps a finite scale).
        No group mean is subtracted: that would cancel the shrinkage and give back GRPO;
      - ``prior`` (ours, opt-in): A = a / (sqrt(sigma2_m) + eps), the raw advantage in units of the
        prior's own spread. Nothing is estimated from the batch, so the baseline V_m, mu_glob included,
        reaches the training advantage unchanged: an all-fail group gets -S_m mu_m / (sqrt(sigma2_m) + eps)
        even when every group of the step fails (docs/theory.md, identity 5);
      - ``none``: A = a.
    """
    check_choice("EBPO normalize", normalize, EBPO_CHOICES["normalize"])
    shrinkage, V_eb = shrinkage_baseline(stats.mean_M, stats.count_M, mu_glob_M, sigma2_M, tau2_M)
    adv_N = rewards_N - V_eb[group_N]  # raw advantage a = r - V^EB
    if normalize == "batch":
        adv_N = batch_normalize(adv_N, eps)
    elif normalize == "group":
        shrunk_var_M = (1.0 - shrinkage) * stats.var_M + shrinkage * sigma2_M
        adv_N = adv_N / (torch.sqrt(shrunk_var_M.clamp_min(0.0))[group_N] + eps)
    elif normalize == "prior":
        adv_N = adv_N / (torch.sqrt(sigma2_M.clamp_min(0.0))[group_N] + eps)
    return adv_N, shrinkage, V_eb


# ----------------------------------------------------------------------------------------------------
# Metrics shared by every estimator
# ----------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------
# Estimator classes
# ----------------------------------------------------------------------------------------------------


def _check_advantages(
    name: str, adv_N: torch.Tensor, abs_adv_N: torch.Tensor, rewards_N: torch.Tensor
) -> None:
    """ValueError naming the first sample whose advantage is not finite or beyond float32's range
    (``abs_adv_N``: the advantages' absolute values)."""
    if not float(abs_adv_N.max()) <= FLOAT32_MAX:  # the max is NaN when any advantage is
        bad_N = ~(abs_adv_N <= FLOAT32_MAX)  # true for NaN, +-inf and values float32 turns into inf
        position = int(bad_N.nonzero()[0, 0])
        largest = int(rewards_N.abs().argmax())
        raise ValueError(
            f"{name}: advantage of sample {position} is {adv_N[position].item():g}, which float32 cannot hold "
            f"(largest |reward| {rewards_N[largest].item():g} at position {largest}); rescale the rewards or "
            "use a larger eps"
        )


def _check_eps(name: str, eps: Any) -> float:
    if not _is_real(eps) or not (math.isfinite(eps) and eps > 0):
        raise OptionError(
            "eps",
            f"{name}: eps must be > 0 and finite, got {eps!r} (it keeps 0 / 0 out of groups whose rewards "
            "are all equal)",
        )
    return float(eps)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class AdvantageEstimator:
    """Base class: validation, metrics, and the call contract. Subclasses implement :meth:`_advantages`.

    Stateless estimators inherit the no-op :meth:`observe` and the empty state dict.
    """

    name: str = ""
    options_type: ClassVar[type | None] = None
    """The dataclass that declares the estimator's options, when it has one (EBPO: :class:`EBPOOptions`)."""

    def __init__(self) -> None:
        self._metrics: dict[str, float] = dict(_EMPTY_METRICS)

    def __call__(self, rewards: Any, index: Any, cluster: Any = None) -> torch.Tensor:
        """Advantages (float32, shape (N,)) of N sequence rewards grouped by ``index``.

        Raises ValueError (state unchanged) for bad input and for an advantage float32 cannot hold.
        """
        batch = _prepare(rewards, index, cluster)
        if batch.rewards_N.numel() == 0:
            self._metrics = dict(_EMPTY_METRICS)
            return torch.zeros(0, dtype=torch.float32, device=batch.rewards_N.device)
        stats = group_moments(batch.rewards_N, batch.group_N, batch.num_groups)
        batch = batch._replace(stats=stats)
        saved = self.state_dict()  # a batch that raises must leave no trace in the state
        try:
            adv_N, extra = self._advantages(batch)
            abs_adv_N = adv_N.abs()
            _check_advantages(self.name, adv_N, abs_adv_N, batch.rewards_N)
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
        _prepare(rewards, index, cluster)

    def metrics(self) -> dict[str, float]:
        """Statistics of the last ``__call__`` (names in the module docstring)."""
        return dict(self._metrics)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"estimator {self.name!r} is stateless but got state keys {sorted(state)}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


@register_estimator("grpo")
class GRPOEstimator(AdvantageEstimator):
    """GRPO: A_i = (r_i - r̄_g) / (s_g + eps) (see :func:`grpo_advantage`)."""

    def __init__(self, *, norm_by_std: bool = True, eps: float = 1e-6) -> None:
        super().__init__()
        self.norm_by_std = bool(norm_by_std)
        self.eps = _check_eps("grpo", eps)

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
        self.eps = _check_eps("jspo", eps)

    def _advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        adv_N, js_lambda_M = jspo_advantage(
            batch.rewards_N, batch.group_N, batch.num_groups, eps=self.eps, stats=batch.stats
        )
        return adv_N, {"jspo/lambda": js_lambda_M.mean()}


class _Prior:
    """One EBPO prior: W_glob (rewards), W_means (group means), W_within (group variances, for
    ``sigma2="pooled"``) and W_inv_size (1/G_m, for ``tau2="latent"``), all with one memory policy.

    ``pooled`` / ``latent``: whether W_within / W_inv_size are kept up to date. Only those options read
    them; otherwise they stay as they are (in the state all the same, so that checkpoints have one format).
    """

    def __init__(self, half_life: float | None, *, pooled: bool = True, latent: bool = True) -> None:
        def make() -> Welford | EWWelford:
            return Welford() if half_life is None else EWWelford(half_life)

        self.W_glob = make()
        self.W_means = make()
        self.W_within = make()
        self.W_inv_size = make()
        self.pooled, self.latent = pooled, latent

    def accumulators(self) -> dict[str, Welford | EWWelford]:
        return {
            "W_glob": self.W_glob,
            "W_means": self.W_means,
            "W_within": self.W_within,
            "W_inv_size": self.W_inv_size,
        }

    def update(self, rewards_N: torch.Tensor, stats: GroupStats) -> None:
        """Algorithm 1, lines 4-6: every reward into W_glob, every group mean into W_means."""
        self.W_glob.update(rewards_N)
        self.W_means.update(stats.mean_M)
        if self.pooled:
            self.W_within.update(stats.var_M[stats.count_M > 1])
        if self.latent:
            self.W_inv_size.update(1.0 / stats.count_M)

    def step(self) -> None:
        for acc in self.accumulators().values():
            if isinstance(acc, EWWelford):
                acc.step()

    @property
    def num_groups(self) -> float:
        return self.W_means.count

    def state_dict(self) -> dict[str, Any]:
        return {name: acc.state_dict() for name, acc in self.accumulators().items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, acc in self.accumulators().items():
            acc.load_state_dict(state[name])


def _load_prior(
    half_life: float | None, state: dict[str, Any], key: str, where: str, *, pooled: bool, latent: bool
) -> _Prior:
    """A fresh :class:`_Prior` holding ``state[key]``; ValueError naming ``where`` if it is missing or bad."""
    if key not in state:
        raise ValueError(f"EBPO checkpoint has no {where!r} entry (keys: {sorted(state)})")
    prior = _Prior(half_life, pooled=pooled, latent=latent)
    accumulators = prior.accumulators()
    missing = sorted(set(accumulators) - set(state[key]))
    if missing:
        raise ValueError(f"EBPO checkpoint {where} lacks {missing}: it was not written by this estimator")
    for name, acc in accumulators.items():
        try:
            acc.load_state_dict(state[key][name])
        except ValueError as err:
            raise ValueError(f"EBPO checkpoint {where}.{name}: {err}") from None
    return prior


class OptionError(ValueError):
    """An estimator option that cannot be used; ``option`` names it (frameworks prefix their own key)."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


@dataclass
class EBPOOptions:
    """EBPO's options, each declared once with its help (paper Section 3.2, Algorithm 1; docs/design.md §1-§2).
    The defaults are the paper's.

    Read by the estimator (``get_estimator("ebpo", **options)`` or ``EBPOEstimator(EBPOOptions(...))``),
    ``ebpo train`` (``algorithm.estimator_options.<option>``), TRL (``EBPOConfig`` extends this class: these
    are its fields and flags) and verl (``+algorithm.ebpo.<option>``); each checks them here at start, with
    the key at fault named (:func:`check_options`). Not frozen, because TRL's ``GRPOConfig`` is not.
    """

    prior_scope: Literal["global", "cluster"] = field(
        default="global",
        metadata={
            "help": "EBPO prior: `global` (paper: one Welford prior over all rewards) or `cluster` (one prior per "
            "cluster key, the topic or difficulty bucket; a group uses its cluster's prior once that prior "
            "holds `cluster_min_groups` groups, the global one before that; the global prior sees every group)."
        },
    )
    cluster_min_groups: int = field(
        default=16,
        metadata={
            "help": "With `prior_scope=cluster`: groups a cluster must have seen before its own prior replaces "
            "the global one; below it the variance of its group means (tau2) is too noisy to trust. With a "
            "half-life it counts the decayed weight of the cluster's group means."
        },
    )
    prior_memory: str = field(
        default="all",
        metadata={
            "help": "EBPO prior memory: `all` (paper: every reward ever seen) or a half-life (e.g. `50`) for "
            "exponentially weighted moments that follow the improving policy. The half-life counts estimator "
            "steps, one per batch of fresh rewards: a step of `ebpo train` and of verl, a generation block in "
            "TRL (`steps_per_generation * num_iterations / gradient_accumulation_steps` optimizer steps, not "
            "TRL's global_step). A number is accepted as well as its text."
        },
    )
    tau2: Literal["raw", "latent"] = field(
        default="raw",
        metadata={
            "help": "Between-prompt variance: `raw` (paper: Var of group means) or `latent` "
            "(max(Var(means) - sigma2 E[1/G], tau2_floor), the textbook Empirical Bayes estimate)."
        },
    )
    tau2_floor: float = field(
        default=1e-4,
        metadata={"help": "Floor of the latent tau2, so that S < 1 unless sigma2 dwarfs it; >= 0."},
    )
    sigma2: Literal["total", "pooled"] = field(
        default="total",
        metadata={
            "help": "Within-prompt variance: `total` (paper: variance of all rewards) or `pooled` (running mean "
            "of per-group sample variances)."
        },
    )
    normalize: Literal["batch", "group", "prior", "none"] = field(
        default="batch",
        metadata={
            "help": "Normalisation of EBPO's raw advantages a = r - V: `batch` (paper: (a - mean)/(std + eps) "
            "over the step's batch; with equal group sizes and one prior mu_glob cancels and the prior acts "
            "only through S), `group` (each group by its shrunk std), `prior` (a/(sqrt(sigma2) + eps), which "
            "keeps the prior mean mu_glob in the training advantage; docs/theory.md) or `none`."
        },
    )
    eps: float = field(
        default=1e-6,
        metadata={"help": "Added to the normalising standard deviation of EBPO's advantages; > 0."},
    )

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """:class:`OptionError` naming the first option that cannot be used."""
        for option, choices in EBPO_CHOICES.items():
            try:
                check_choice(f"EBPO {option}", getattr(self, option), choices)
            except ValueError as err:
                raise OptionError(option, str(err)) from None
        count = self.cluster_min_groups
        if not isinstance(count, numbers.Integral) or isinstance(count, bool) or count < 1:
            raise OptionError(
                "cluster_min_groups", f"cluster_min_groups must be an integer >= 1, got {count!r}"
            )
        _half_life(self.prior_memory)
        if not _is_real(self.tau2_floor) or not (math.isfinite(self.tau2_floor) and self.tau2_floor >= 0):
            raise OptionError("tau2_floor", f"tau2_floor must be >= 0 and finite, got {self.tau2_floor!r}")
        _check_eps("ebpo", self.eps)

    @property
    def half_life(self) -> float | None:
        """``prior_memory`` as a half-life in steps; None for ``"all"``."""
        return _half_life(self.prior_memory)


def _half_life(prior_memory: Any) -> float | None:
    """None for ``"all"``, else ``prior_memory`` as a half-life in steps; OptionError unless finite and > 0."""
    if prior_memory == "all":
        return None
    try:
        half_life = float(prior_memory)
    except (TypeError, ValueError):
        half_life = math.nan
    if not (math.isfinite(half_life) and half_life > 0):
        raise OptionError(
            "prior_memory",
            f"prior_memory must be 'all' or a half-life in steps > 0 (e.g. 50), got {prior_memory!r}",
        )
    return half_life


EBPO_CHOICES: dict[str, tuple[str, ...]] = {
    name: typing.get_args(hint)
    for name, hint in typing.get_type_hints(EBPOOptions).items()
    if typing.get_origin(hint) is Literal
}
"""The values each of EBPO's choice options accepts, the paper's default first: the ``Literal`` types of
:class:`EBPOOptions`. The options and :func:`ebpo_advantage` check against this table alone."""


@register_estimator("ebpo")
class EBPOEstimator(AdvantageEstimator):
    """EBPO (paper Section 3.2, Algorithm 1; docs/design.md §1-§2): GRPO's group mean shrunk toward a running prior.

    Per call: (1) the batch's rewards and group means enter the prior (current batch included before the
    prior is read); (2) mu_glob = mean(W_glob), sigma2, tau2 are read; (3) S_m and V_m per group
    (:func:`shrinkage_baseline`); (4) a = r - V_m; (5) normalisation (:func:`ebpo_advantage`). With
    ``prior_memory`` a half-life, the accumulators are aged by one step at the end of each call.

    Options: :class:`EBPOOptions` (``EBPOEstimator(options)``, or its fields by keyword; a bad one raises
    :class:`OptionError`, a ``ValueError``). Call :meth:`observe` for a step's dropped groups before that
    step's ``__call__``.
    """

    options_type = EBPOOptions

    def __init__(self, options: EBPOOptions | None = None, **overrides: Any) -> None:
        super().__init__()
        if options is None:
            options = EBPOOptions(**overrides)
        elif overrides:
            options = dataclasses.replace(options, **overrides)
        self.options = options
        self.half_life: float | None = options.half_life
        self.prior_scope = options.prior_scope
        self.cluster_min_groups = int(options.cluster_min_groups)
        self.prior_memory = options.prior_memory
        self.tau2_mode = options.tau2
        self.tau2_floor = float(options.tau2_floor)
        self.sigma2_mode = options.sigma2
        self.normalize = options.normalize
        self.eps = float(options.eps)
        self.prior = self._new_prior()
        self.cluster_priors: dict[Hashable, _Prior] = {}

    # -- prior bookkeeping -------------------------------------------------------------------------

    def _new_prior(self) -> _Prior:
        """An empty prior that keeps current what these options read."""
        return _Prior(self.half_life, **self._prior_reads())

    def _prior_reads(self) -> dict[str, bool]:
        return {"pooled": self.sigma2_mode == "pooled", "latent": self.tau2_mode == "latent"}

    def _read(self, prior: _Prior) -> tuple[float, float, float]:
        """Algorithm 1, lines 8-10: (mu_glob, sigma2, tau2) of one prior.

        sigma2: ``total`` (paper) the variance of every reward seen, within + between prompts; ``pooled``
        (docs/design.md §2) the running mean of per-group sample variances (groups with G >= 2), the hierarchical
        model's within-group variance. tau2: ``raw`` (paper, Remark on between-group variance) the variance
        of group means; ``latent`` (docs/design.md §2) max(Var(means) - sigma2 * E[1/G], tau2_floor), E[1/G] over the
        same groups as Var(means).
        """
        mu_glob = prior.W_glob.mean
        sigma2 = prior.W_glob.var if self.sigma2_mode == "total" else prior.W_within.mean
        tau2 = prior.W_means.var
        if self.tau2_mode == "latent":
            tau2 = max(tau2 - sigma2 * prior.W_inv_size.mean, self.tau2_floor)
        return mu_glob, sigma2, tau2

    def _group_clusters(self, batch: Batch) -> tuple[list[Hashable], torch.Tensor]:
        """(cluster keys K, cluster id of each group (M,)); errors if a group spans two clusters."""
        if batch.cluster is None:
            raise ValueError(
                "prior_scope='cluster' needs cluster= keys (topic or difficulty bucket) per sample"
            )
        cluster_N, num_clusters = group_ids(batch.cluster)
        cluster_N = cluster_N.to(batch.group_N.device)
        big = torch.full((batch.num_groups,), num_clusters, dtype=torch.long, device=cluster_N.device)
        low_M = big.scatter_reduce(0, batch.group_N, cluster_N, reduce="amin")
        high_M = torch.full_like(big, -1).scatter_reduce(0, batch.group_N, cluster_N, reduce="amax")
        if bool((low_M != high_M).any()):
            group = int((low_M != high_M).nonzero()[0, 0])
            position = int((batch.group_N == group).nonzero()[0, 0])
            raise ValueError(
                f"cluster keys must be constant within a group; the group of sample {position} has more than one"
            )
        first_N = torch.zeros(num_clusters, dtype=torch.long, device=cluster_N.device)
        order_N = torch.arange(cluster_N.numel(), device=cluster_N.device)
        first_N = first_N.scatter_reduce(0, cluster_N, order_N, reduce="amin", include_self=False)
        keys = [batch.cluster[i] for i in first_N.tolist()]
        return keys, low_M

    def _update(self, batch: Batch, stats: GroupStats) -> tuple[list[Hashable], torch.Tensor] | None:
        """Fold a batch into the global prior and, for cluster scope, its clusters' priors."""
        self.prior.update(batch.rewards_N, stats)
        if self.prior_scope != "cluster":
            return None
        keys, cluster_M = self._group_clusters(batch)
        cluster_N = cluster_M[batch.group_N]
        for k, key in enumerate(keys):  # loop over the few clusters present, each update vectorised
            prior = self.cluster_priors.get(key) or self.cluster_priors.setdefault(key, self._new_prior())
            in_cluster_M = cluster_M == k
            prior.update(
                batch.rewards_N[cluster_N == k],
                GroupStats(
                    stats.count_M[in_cluster_M], stats.mean_M[in_cluster_M], stats.var_M[in_cluster_M]
                ),
            )
        return keys, cluster_M

    def _step(self) -> None:
        self.prior.step()
        for prior in self.cluster_priors.values():
            prior.step()

    # -- contract ----------------------------------------------------------------------------------

    def observe(self, rewards: Any, index: Any, cluster: Any = None) -> None:
        """Fold a batch into the prior without computing advantages (no ageing: see class doc)."""
        batch = _prepare(rewards, index, cluster)
        if batch.rewards_N.numel() == 0:
            return
        saved = self.state_dict()
        try:
            self._update(batch, group_moments(batch.rewards_N, batch.group_N, batch.num_groups))
        except Exception:
            self.load_state_dict(saved)
            raise

    def _advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        stats = batch.stats
        if stats is None:
            stats = group_moments(batch.rewards_N, batch.group_N, batch.num_groups)
        clusters = self._update(batch, stats)
        mu_glob, sigma2, tau2 = self._read(self.prior)
        like = batch.rewards_N
        # each group's (mu_glob, sigma2, tau2): the global prior's, then a cluster's where it has one
        prior_3M = like.new_tensor([mu_glob, sigma2, tau2])[:, None].repeat(1, batch.num_groups)
        mu_glob_M, sigma2_M, tau2_M = prior_3M
        cluster_prior_frac: torch.Tensor | float = 0.0  # one global prior: no group used a cluster's
        if clusters is not None:
            cluster_prior_M = torch.zeros(batch.num_groups, dtype=torch.bool, device=like.device)
            keys, cluster_M = clusters
            for k, key in enumerate(keys):
                prior = self.cluster_priors[key]
                if prior.num_groups < self.cluster_min_groups:
                    continue  # too few groups: this cluster keeps the global prior
                in_cluster_M = cluster_M == k
                cluster_mu, cluster_sigma2, cluster_tau2 = self._read(prior)
                mu_glob_M[in_cluster_M] = cluster_mu
                sigma2_M[in_cluster_M] = cluster_sigma2
                tau2_M[in_cluster_M] = cluster_tau2
                cluster_prior_M |= in_cluster_M
            cluster_prior_frac = cluster_prior_M.double().mean()
        adv_N, shrinkage, V_eb = ebpo_advantage(
            batch.rewards_N,
            batch.group_N,
            stats,
            mu_glob_M,
            sigma2_M,
            tau2_M,
            normalize=self.normalize,
            eps=self.eps,
        )
        self._step()
        # the means over the groups, one row each (a row's mean is the 1-D mean of that row, to the bit)
        means = torch.cat([prior_3M, shrinkage[None], V_eb[None]]).mean(dim=1).tolist()
        names = ("ebpo/mu_glob", "ebpo/sigma2", "ebpo/tau2", "ebpo/shrinkage", "ebpo/baseline_mean")
        extra: dict[str, torch.Tensor | float] = dict(zip(names, means, strict=True))
        extra["ebpo/cluster_prior_frac"] = cluster_prior_frac
        return adv_N, extra

    def prior_stats(self, cluster: Hashable | None = None) -> dict[str, float]:
        """Current (mu_glob, sigma2, tau2, num_groups) of the global prior or of one cluster's prior."""
        prior = self.prior if cluster is None else self.cluster_priors[_to_hashable(cluster)]
        mu_glob, sigma2, tau2 = self._read(prior)
        return {"mu_glob": mu_glob, "sigma2": sigma2, "tau2": tau2, "num_groups": prior.num_groups}

    def state_dict(self) -> dict[str, Any]:
        return {
            "options": self._options(),
            "prior": self.prior.state_dict(),
            "cluster_priors": [[key, prior.state_dict()] for key, prior in self.cluster_priors.items()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved_memory = state.get("options", {}).get("prior_memory")
        if saved_memory != self._options()["prior_memory"]:
            raise ValueError(
                f"EBPO checkpoint has prior_memory={saved_memory!r} but this estimator has "
                f"{self._options()['prior_memory']!r}; build the estimator with the checkpoint's prior_memory"
            )
        prior = _load_prior(self.half_life, state, "prior", "prior", **self._prior_reads())
        cluster_priors = {}
        for key, prior_state in state.get("cluster_priors", []):
            cluster_priors[key] = _load_prior(
                self.half_life, {"p": prior_state}, "p", f"cluster_priors[{key!r}]", **self._prior_reads()
            )
        self.prior, self.cluster_priors = prior, cluster_priors  # only a fully valid state is taken

    def _options(self) -> dict[str, Any]:
        return {
            "prior_scope": self.prior_scope,
            "cluster_min_groups": self.cluster_min_groups,
            "prior_memory": "all" if self.half_life is None else self.half_life,
            "tau2": self.tau2_mode,
            "tau2_floor": self.tau2_floor,
            "sigma2": self.sigma2_mode,
            "normalize": self.normalize,
            "eps": self.eps,
        }

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self._options().items())
        return f"EBPOEstimator({options})"
