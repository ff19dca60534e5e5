"""The group maths of every estimator: pure functions of tensors, no state, no input checks.

Each function takes N sequence rewards ``rewards_N`` (float64) and their group ids ``group_N`` (long, values
0..M-1, as :func:`ebpo.advantages.group_ids` makes them) and returns tensors; nothing is read from or written
to an estimator. Shapes: ``N`` samples, ``M`` groups (prompts). Groups need not be contiguous and may differ
in size; everything is vectorised with ``index_add`` / indexing (no Python loop over groups). The estimator
classes (:mod:`ebpo.advantages.baselines`, :mod:`ebpo.advantages.ebpo`) check the inputs, call these and keep
the state. Formulas: docs/design.md §1-§3 and the EBPO paper (Han et al. 2026, Section 3.2, Algorithm 1).
"""

from __future__ import annotations

import typing
from typing import Literal, NamedTuple

import torch

from ebpo.registry import check_choice

__all__ = [
    "GroupStats",
    "Normalize",
    "batch_normalize",
    "dr_grpo_advantage",
    "ebpo_advantage",
    "group_moments",
    "grpo_advantage",
    "jspo_advantage",
    "reinforce_pp_baseline_advantage",
    "rloo_advantage",
    "shrinkage_baseline",
]

Normalize = Literal["batch", "group", "prior", "none"]
"""How :func:`ebpo_advantage` normalises EBPO's raw advantages (the paper's ``batch`` first); the type of
``EBPOOptions.normalize``."""


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
    """Each group's size, mean and unbiased variance, in two passes.

    G_m = #{i in m}, r̄_m = sum_i r_mi / G_m, s_m^2 = sum_i (r_mi - r̄_m)^2 / (G_m - 1) (0 for G_m < 2).

    Args:
        rewards_N: (N,) rewards.
        group_N: (N,) long group ids in 0..M-1.
        num_groups: M.

    Returns:
        :class:`GroupStats` of three (M,) tensors: ``count_M``, ``mean_M``, ``var_M``.
    """
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
    """Whiten advantages over the whole batch (docs/design.md §1 step 5).

    A = (a - mean(a)) / (std(a) + eps), std unbiased over all N samples (0 when N < 2).

    Args:
        adv_N: (N,) raw advantages a.
        eps: added to the standard deviation.

    Returns:
        (N,) normalised advantages A (``adv_N`` itself when N = 0).
    """
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
    """GRPO's group-relative advantage (Shao et al. 2024; docs/design.md §3).

    A_i = (r_i - r̄_g) / (s_g + eps), s_g the unbiased group std; with ``norm_by_std=False`` Dr. GRPO's
    A_i = r_i - r̄_g. A group of one has r_i = r̄_g and s_g = 0, so its advantage is 0 (verl instead uses
    mean 0, std 1 there and returns r_i).

    Args:
        rewards_N: (N,) rewards.
        group_N: (N,) long group ids in 0..M-1.
        num_groups: M.
        norm_by_std: divide by the group's std (GRPO) or not (Dr. GRPO).
        eps: added to the group's std.
        stats: the batch's :func:`group_moments` when already computed (here and in the functions below).

    Returns:
        (N,) advantages.
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
    """Dr. GRPO's advantage (Liu et al. 2025; docs/design.md §3): A_i = r_i - r̄_g, no std normalisation.

    Args: as :func:`grpo_advantage`. Returns: (N,) advantages.
    """
    return grpo_advantage(rewards_N, group_N, num_groups, norm_by_std=False, stats=stats)


def rloo_advantage(
    rewards_N: torch.Tensor, group_N: torch.Tensor, num_groups: int, *, stats: GroupStats | None = None
) -> torch.Tensor:
    """RLOO's leave-one-out advantage (Ahmadian et al. 2024; docs/design.md §3).

    A_i = r_i - (sum_g - r_i) / (G - 1) = G / (G - 1) * (r_i - r̄_g). A group of one has no other sample to
    form a baseline from: its advantage is 0.

    Args: as :func:`grpo_advantage`. Returns: (N,) advantages.
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

    Args: as :func:`grpo_advantage`; ``whiten_eps`` is added to the variance inside the square root.

    Returns:
        (N,) advantages.
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
    """JSPO's James-Stein baseline (Zeng et al. 2025; docs/design.md §3).

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

    Args: as :func:`grpo_advantage`; ``eps`` keeps lambda's denominator positive.

    Returns:
        (A_N, lambda_M): (N,) advantages and (M,) each prompt's lambda.
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
    """EBPO's shrinkage baseline (paper eq. for V^EB; docs/design.md §1 step 3).

    S_m = (sigma2 / G_m) / (sigma2 / G_m + tau2), S_m = 0 when the denominator is 0;
    V_m = (1 - S_m) * r̄_m + S_m * mu_glob.

    Args:
        mean_M: (M,) group means r̄_m.
        count_M: (M,) group sizes G_m.
        mu_glob_M, sigma2_M, tau2_M: each group's prior (mean of all rewards, within-prompt variance,
            between-prompt variance); anything that broadcasts against (M,).

    Returns:
        (S_M, V_eb_M): (M,) shrinkage factors and (M,) baselines.
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
    """EBPO's advantage given the prior (docs/design.md §1 steps 3-5; paper Algorithm 1).

    a_mi = r_mi - V_m (raw advantage, V_m from :func:`shrinkage_baseline`), then per ``normalize``:
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

    Args:
        rewards_N: (N,) rewards.
        group_N: (N,) long group ids in 0..M-1.
        stats: the batch's :func:`group_moments`.
        mu_glob_M, sigma2_M, tau2_M: (M,) each group's prior.
        normalize: one of :data:`Normalize`; another value raises ``ValueError`` listing them.
        eps: added to the normalising standard deviation.

    Returns:
        (A_N, S_M, V_eb_M): (N,) advantages, (M,) shrinkage factors, (M,) baselines.
    """
    check_choice("EBPO normalize", normalize, typing.get_args(Normalize))
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
