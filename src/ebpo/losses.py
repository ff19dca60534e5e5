"""Policy losses, loss aggregation, KL estimators, entropy and DAPO's overlong penalty.

Pure tensor functions, no trainer or framework imports; ``ebpo train`` calls them (the verl and TRL adapters
replace only the advantages and keep their framework's own policy loss). Shapes: ``B`` sequences (responses),
``T`` response tokens, ``V`` vocabulary.

Policy losses are found through a registry (``get_policy_loss(name)``) and share one signature::

    loss, metrics = loss_fn(logp_BT, old_logp_BT, adv_BT, mask_BT, cfg)

- ``vanilla``: PPO clipped surrogate with asymmetric clip (DAPO's clip-higher) and optional dual clip
  (docs/design.md §3, "Policy loss (shared)"; Schulman et al. 2017; Ye et al. 2020 for the dual clip;
  Yu et al. 2025 for clip-higher).
- ``clip_cov`` and ``kl_cov``: the two covariance-based entropy controls of Cui et al. 2025,
  "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models" (docs/design.md §3,
  EntropyMech). How many tokens they select per call: ``PolicyLossOptions.cov_count``.

Metrics (floats): ``actor/pg_loss``, ``actor/pg_clipfrac`` (fraction of valid tokens where the PPO clip
is active), ``actor/pg_clipfrac_lower`` (fraction where the dual clip is active), ``actor/ppo_kl``
(masked mean of ``old_logp - logp``); ``clip_cov`` adds ``actor/clip_cov_frac`` and ``kl_cov`` adds
``actor/kl_cov_frac`` (fraction of valid tokens selected).
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch

from ebpo.registry import Registry, check_choice, unknown_choice

LOG_RATIO_CLAMP = 20.0
"""``logp - old_logp`` is clamped to [-20, 20] before ``exp`` so the ratio never overflows (as verl)."""

K3_CLAMP = 10.0
"""The k3 KL estimate is clamped to [-10, 10] (as verl's ``low_var_kl``)."""

AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
"""How token losses become one scalar (:func:`agg_loss`)."""
AGG_MODES: tuple[str, ...] = typing.get_args(AggMode)

KLEstimator = Literal["k1", "k2", "k3"]
"""The estimates of KL(pi || pi_ref) :func:`kl_penalty` computes (:data:`KL_ESTIMATORS`)."""

CovCount = Literal["verl", "stochastic"]
COV_COUNT_RULES: tuple[str, ...] = typing.get_args(CovCount)
"""How Clip-Cov / KL-Cov turn ``ratio * N`` into a token count (``PolicyLossOptions.cov_count``)."""


@dataclass
class PolicyLossOptions:
    """The policy losses' options a user sets, each declared once with its help (docs/design.md §3); the
    defaults are GRPO's / verl's. ``ebpo train`` reads them as ``algorithm.loss.<option>``;
    :class:`PolicyLossConfig` adds what the caller fills in."""

    clip_eps_low: float = field(
        default=0.2,
        metadata={
            "help": "PPO clip below: the ratio is clipped at 1 - clip_eps_low (Schulman et al. 2017); in [0, 1)."
        },
    )
    clip_eps_high: float = field(
        default=0.2,
        metadata={
            "help": "PPO clip above: the ratio is clipped at 1 + clip_eps_high; DAPO's clip-higher uses 0.28."
        },
    )
    dual_clip_c: float | None = field(
        default=3.0,
        metadata={
            "help": "Dual clip for negative advantages (Ye et al. 2020): the loss of a token with A < 0 is at most "
            "-A * c; > 1, or null to turn it off."
        },
    )
    clip_cov_ratio: float = field(
        default=2e-4,
        metadata={
            "help": "Clip-Cov (Cui et al. 2025): fraction of valid tokens whose gradient is dropped; in (0, 1]."
        },
    )
    clip_cov_lb: float = field(
        default=1.0,
        metadata={"help": "Clip-Cov: only tokens with covariance strictly above this are candidates."},
    )
    clip_cov_ub: float = field(
        default=5.0,
        metadata={"help": "Clip-Cov: only tokens with covariance strictly below this are candidates."},
    )
    kl_cov_ratio: float = field(
        default=2e-3,
        metadata={
            "help": "KL-Cov (Cui et al. 2025): fraction of valid tokens, those of largest covariance, that get the "
            "KL term; in (0, 1]."
        },
    )
    kl_cov_coef: float = field(
        default=1.0, metadata={"help": "KL-Cov: coefficient k of |logp - old_logp| on the selected tokens."}
    )
    cov_count: CovCount = field(
        default="verl",
        metadata={
            "help": "How many of the N valid tokens of one loss call Clip-Cov and KL-Cov select, x = ratio * N: "
            "verl (verl's and Cui et al.'s rule) max(1, floor(x)): at verl's sizes (1e4-1e6 tokens per call) "
            "about the ratio, with a few hundred tokens per call 1 / N, far above it (a 100-token call at ratio "
            "2e-4 selects 1 token: 1%, 50x the ratio); stochastic: floor(x) plus one more token with probability "
            "x - floor(x), so the expected count is exactly x (0 allowed) at any batch size."
        },
    )

    def __post_init__(self) -> None:
        if not (0.0 <= self.clip_eps_low < 1.0) or self.clip_eps_high < 0.0:
            raise ValueError(
                f"need 0 <= clip_eps_low < 1 and clip_eps_high >= 0, got clip_eps_low={self.clip_eps_low}, "
                f"clip_eps_high={self.clip_eps_high}"
            )
        if self.dual_clip_c is not None and self.dual_clip_c <= 1.0:
            raise ValueError(
                f"dual_clip_c must be > 1 (or None to turn the dual clip off), got {self.dual_clip_c}"
            )
        if not (0.0 < self.clip_cov_ratio <= 1.0) or not (0.0 < self.kl_cov_ratio <= 1.0):
            raise ValueError(
                f"clip_cov_ratio and kl_cov_ratio must lie in (0, 1], got {self.clip_cov_ratio}, {self.kl_cov_ratio}"
            )
        if self.clip_cov_lb >= self.clip_cov_ub:
            raise ValueError(f"need clip_cov_lb < clip_cov_ub, got {self.clip_cov_lb} >= {self.clip_cov_ub}")
        check_choice("cov_count rule", self.cov_count, COV_COUNT_RULES)


@dataclass
class PolicyLossConfig(PolicyLossOptions):
    """Everything a policy loss reads: :class:`PolicyLossOptions` and what the caller fills in (the trainer:
    from ``algorithm.loss_agg_mode``, ``rollout.max_new_tokens`` and the run's seeded generator)."""

    loss_agg_mode: AggMode = "token-mean"
    """How token losses become one scalar: one of ``AGG_MODES`` (see ``agg_loss``). GRPO:
    ``seq-mean-token-mean``; DAPO: ``token-mean``; Dr. GRPO: ``seq-mean-token-sum-norm``."""
    max_response_len: int | None = None
    """The constant that ``seq-mean-token-sum-norm`` (Dr. GRPO) divides by: the maximum response length.
    Required for that mode, unused by the others."""
    generator: torch.Generator | None = None
    """Random source for Clip-Cov's choice of tokens (a CPU ``torch.Generator``); ``None`` uses torch's
    global generator. Seed it for reproducible runs."""

    def __post_init__(self) -> None:
        check_choice("loss aggregation mode", self.loss_agg_mode, AGG_MODES)
        super().__post_init__()
        if self.loss_agg_mode == "seq-mean-token-sum-norm" and self.max_response_len is None:
            raise ValueError(
                "loss_agg_mode='seq-mean-token-sum-norm' (Dr. GRPO) divides by a constant: "
                "set max_response_len to the maximum response length"
            )
        if self.max_response_len is not None and self.max_response_len <= 0:
            raise ValueError(f"max_response_len must be positive, got {self.max_response_len}")


class PolicyLossFn(Protocol):
    def __call__(
        self,
        logp_BT: torch.Tensor,
        old_logp_BT: torch.Tensor,
        adv_BT: torch.Tensor,
        mask_BT: torch.Tensor,
        cfg: PolicyLossConfig,
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


_POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator adding a policy loss to the registry under ``name`` (a name registered twice raises)."""
    return _POLICY_LOSSES.register(name)


def get_policy_loss(name: str) -> PolicyLossFn:
    """The policy loss registered as ``name``; an unknown name raises ValueError listing the valid ones."""
    return _POLICY_LOSSES.get(name)


def list_policy_losses() -> list[str]:
    """Names of the registered policy losses, sorted."""
    return _POLICY_LOSSES.names()


# --------------------------------------------------------------------------------------------------
# helpers


def masked_mean(values_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is true; 0 when there are none."""
    valid_BT = mask_BT.bool()
    total = torch.where(valid_BT, values_BT, torch.zeros_like(values_BT)).sum()
    return total / valid_BT.sum().clamp(min=1)


def _check_inputs(
    logp_BT: torch.Tensor, old_logp_BT: torch.Tensor, adv: torch.Tensor, mask_BT: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate shapes; return the advantage broadcast to (B, T) and the boolean mask."""
    if logp_BT.dim() != 2:
        raise ValueError(f"logp must be (B, T), got shape {tuple(logp_BT.shape)}")
    if old_logp_BT.shape != logp_BT.shape or mask_BT.shape != logp_BT.shape:
        raise ValueError(
            f"logp {tuple(logp_BT.shape)}, old_logp {tuple(old_logp_BT.shape)} and mask "
            f"{tuple(mask_BT.shape)} must have the same (B, T) shape"
        )
    if adv.dim() == 1 and adv.shape[0] == logp_BT.shape[0]:
        adv_BT = adv[:, None].expand_as(logp_BT)  # a sequence advantage broadcast over its tokens
    elif adv.shape == logp_BT.shape:
        adv_BT = adv
    else:
        raise ValueError(
            f"adv must be (B,) or (B, T) with (B, T) = {tuple(logp_BT.shape)}, got {tuple(adv.shape)}"
        )
    return adv_BT.to(logp_BT.dtype), mask_BT.bool()


def _ratio(logp_BT: torch.Tensor, old_logp_BT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``log_ratio = clamp(logp - old_logp, -20, 20)`` and ``ratio = exp(log_ratio)``."""
    log_ratio_BT = torch.clamp(logp_BT - old_logp_BT, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return log_ratio_BT, torch.exp(log_ratio_BT)


def _ppo_clip_losses(
    adv_BT: torch.Tensor, ratio_BT: torch.Tensor, cfg: PolicyLossConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO loss ``max(-A r, -A clip(r, 1-eps_low, 1+eps_high))``, then the dual clip for A < 0.

    Returns the loss matrix and the boolean matrices "PPO clip active" and "dual clip active".
    """
    unclipped_BT = -adv_BT * ratio_BT
    clipped_BT = -adv_BT * torch.clamp(ratio_BT, 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high)
    ppo_loss_BT = torch.maximum(unclipped_BT, clipped_BT)
    is_clipped_BT = clipped_BT > unclipped_BT
    if cfg.dual_clip_c is None:
        return ppo_loss_BT, is_clipped_BT, torch.zeros_like(is_clipped_BT)
    dual_bound_BT = -adv_BT * cfg.dual_clip_c  # for A < 0 the loss never exceeds -A * c
    is_dual_clipped_BT = (adv_BT < 0) & (ppo_loss_BT > dual_bound_BT)
    loss_BT = torch.where(is_dual_clipped_BT, dual_bound_BT, ppo_loss_BT)
    return loss_BT, is_clipped_BT, is_dual_clipped_BT


def _centered_covariance(adv_BT: torch.Tensor, logp_BT: torch.Tensor, valid_BT: torch.Tensor) -> torch.Tensor:
    """Cui et al. 2025's per-token covariance ``Cov_t = (A_t - mean A)(logp_t - mean logp)``.

    Means run over the valid tokens of the batch; the result carries no gradient.
    """
    with torch.no_grad():
        adv_BT = adv_BT.detach()
        logp_BT = logp_BT.detach()
        return (adv_BT - masked_mean(adv_BT, valid_BT)) * (logp_BT - masked_mean(logp_BT, valid_BT))


def _finish(
    loss_BT: torch.Tensor,
    valid_BT: torch.Tensor,
    log_ratio_BT: torch.Tensor,
    is_clipped_BT: torch.Tensor,
    is_dual_clipped_BT: torch.Tensor,
    cfg: PolicyLossConfig,
) -> tuple[torch.Tensor, dict[str, float]]:
    loss = agg_loss(loss_BT, valid_BT, cfg.loss_agg_mode, max_len=cfg.max_response_len)
    metrics = {
        "actor/pg_loss": float(loss.detach()),
        "actor/pg_clipfrac": float(masked_mean(is_clipped_BT.float(), valid_BT)),
        "actor/pg_clipfrac_lower": float(masked_mean(is_dual_clipped_BT.float(), valid_BT)),
        "actor/ppo_kl": float(masked_mean(-log_ratio_BT.detach(), valid_BT)),  # mean(old_logp - logp)
    }
    return loss, metrics


# --------------------------------------------------------------------------------------------------
# policy losses


@register_policy_loss("vanilla")
def vanilla_policy_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    cfg: PolicyLossConfig,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate (docs/design.md §3, "Policy loss (shared)").

    ratio_t = exp(clamp(logp_t - old_logp_t, -20, 20))
    L_t = max(-A_t ratio_t, -A_t clip(ratio_t, 1 - eps_low, 1 + eps_high))
    dual clip (Ye et al. 2020), when ``cfg.dual_clip_c`` is set: L_t = min(L_t, -A_t c) for A_t < 0.
    The scalar loss is ``agg_loss(L, mask, cfg.loss_agg_mode)``.

    Args: ``logp_BT``, ``old_logp_BT``: (B, T) token log-probabilities under the current / sampling
    policy; ``adv_BT``: (B,) sequence advantages (broadcast over tokens) or (B, T); ``mask_BT``: (B, T),
    true on response tokens. Masked positions change neither the loss nor its gradient.
    """
    adv_BT, valid_BT = _check_inputs(logp_BT, old_logp_BT, adv_BT, mask_BT)
    log_ratio_BT, ratio_BT = _ratio(logp_BT, old_logp_BT)
    loss_BT, is_clipped_BT, is_dual_clipped_BT = _ppo_clip_losses(adv_BT, ratio_BT, cfg)
    return _finish(loss_BT, valid_BT, log_ratio_BT, is_clipped_BT, is_dual_clipped_BT, cfg)


def _cov_count(ratio: float, num_valid: int, cfg: PolicyLossConfig) -> int:
    """Tokens Clip-Cov / KL-Cov select from ``num_valid`` (``cfg.cov_count``): ``max(1, floor(x))`` (verl) or
    ``floor(x) + [u < x - floor(x)]`` with u uniform from ``cfg.generator`` (stochastic), x = ratio * N.
    The stochastic rule draws nothing when there is no valid token (and then selects none)."""
    expected = ratio * num_valid
    if cfg.cov_count == "verl":
        return max(1, math.floor(expected))
    if num_valid == 0:
        return 0
    whole = math.floor(expected)
    u = float(torch.rand((), generator=cfg.generator, dtype=torch.float64))
    return whole + int(u < expected - whole)


def _random_choice(candidates_N: torch.Tensor, k: int, generator: torch.Generator | None) -> torch.Tensor:
    """``min(k, len)`` entries of ``candidates_N`` drawn uniformly without replacement (seeded)."""
    perm_N = torch.randperm(candidates_N.numel(), generator=generator)
    return candidates_N[perm_N[:k].to(candidates_N.device)]


@register_policy_loss("clip_cov")
def clip_cov_policy_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    cfg: PolicyLossConfig,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov (Cui et al. 2025; docs/design.md §3, EntropyMech).

    Cov_t = (A_t - mean A)(logp_t - mean logp), means over the N valid tokens of the batch.
    Among the valid tokens with ``clip_cov_lb < Cov_t < clip_cov_ub`` whose PPO clip (or dual clip) is
    not already active, ``max(1, floor(clip_cov_ratio * N))`` (``cfg.cov_count="verl"``; ``"stochastic"``:
    ``clip_cov_ratio * N`` in expectation) are drawn uniformly at random (``cfg.generator``) and
    their loss is multiplied by 0, which drops their gradient (as the reference implementation).
    All other tokens get the PPO loss of ``vanilla`` (same clip and dual clip settings).
    """
    adv_BT, valid_BT = _check_inputs(logp_BT, old_logp_BT, adv_BT, mask_BT)
    log_ratio_BT, ratio_BT = _ratio(logp_BT, old_logp_BT)
    loss_BT, is_clipped_BT, is_dual_clipped_BT = _ppo_clip_losses(adv_BT, ratio_BT, cfg)

    cov_BT = _centered_covariance(adv_BT, logp_BT, valid_BT)
    is_candidate_BT = (  # not already clipped: neither the PPO clip nor the dual clip is active there
        valid_BT
        & ~is_clipped_BT
        & ~is_dual_clipped_BT
        & (cov_BT > cfg.clip_cov_lb)
        & (cov_BT < cfg.clip_cov_ub)
    )
    num_valid = int(valid_BT.sum())
    num_drop = _cov_count(cfg.clip_cov_ratio, num_valid, cfg)
    candidates_N = torch.nonzero(is_candidate_BT.reshape(-1)).squeeze(1)
    dropped_N = _random_choice(candidates_N, num_drop, cfg.generator)
    keep_BT = torch.ones(valid_BT.numel(), dtype=loss_BT.dtype, device=loss_BT.device)
    keep_BT[dropped_N] = 0.0
    keep_BT = keep_BT.view_as(loss_BT)

    loss, metrics = _finish(loss_BT * keep_BT, valid_BT, log_ratio_BT, is_clipped_BT, is_dual_clipped_BT, cfg)
    metrics["actor/clip_cov_frac"] = dropped_N.numel() / max(num_valid, 1)
    return loss, metrics


@register_policy_loss("kl_cov")
def kl_cov_policy_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    cfg: PolicyLossConfig,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov (Cui et al. 2025; docs/design.md §3, EntropyMech).

    Cov_t = (A_t - mean A)(logp_t - mean logp), means over the N valid tokens of the batch.
    The ``max(1, floor(kl_cov_ratio * N))`` (``cfg.cov_count="verl"``; ``"stochastic"``: ``kl_cov_ratio * N``
    in expectation) valid tokens of largest Cov_t get
    L_t = -A_t ratio_t + k |logp_t - old_logp_t| (k = ``kl_cov_coef``); every other token gets
    L_t = -A_t ratio_t. No clipping (``pg_clipfrac`` and ``pg_clipfrac_lower`` are 0). The ratio uses the
    same clamped log-ratio as ``vanilla``.
    """
    adv_BT, valid_BT = _check_inputs(logp_BT, old_logp_BT, adv_BT, mask_BT)
    log_ratio_BT, ratio_BT = _ratio(logp_BT, old_logp_BT)
    surrogate_BT = -adv_BT * ratio_BT
    penalised_BT = surrogate_BT + cfg.kl_cov_coef * (logp_BT - old_logp_BT).abs()

    cov_BT = _centered_covariance(adv_BT, logp_BT, valid_BT)
    num_valid = int(valid_BT.sum())
    is_selected_BT = torch.zeros_like(valid_BT)
    num_select = min(_cov_count(cfg.kl_cov_ratio, num_valid, cfg), num_valid)
    if num_select > 0:
        cov_valid_BT = cov_BT.masked_fill(~valid_BT, -math.inf)
        top_N = torch.topk(cov_valid_BT.reshape(-1), num_select).indices
        is_selected_BT.view(-1)[top_N] = True
    loss_BT = torch.where(is_selected_BT, penalised_BT, surrogate_BT)

    no_clip_BT = torch.zeros_like(valid_BT)
    loss, metrics = _finish(loss_BT, valid_BT, log_ratio_BT, no_clip_BT, no_clip_BT, cfg)
    metrics["actor/kl_cov_frac"] = float(is_selected_BT.sum()) / max(num_valid, 1)
    return loss, metrics


# --------------------------------------------------------------------------------------------------
# aggregation, KL, entropy, overlong penalty


def agg_loss(
    loss_mat_BT: torch.Tensor, mask_BT: torch.Tensor, mode: str, max_len: int | None = None
) -> torch.Tensor:
    """Reduce a (B, T) token-loss matrix to a scalar over the valid tokens (docs/design.md §3).

    With ``m`` the mask, ``n_b = sum_t m_bt`` and ``B'`` the number of sequences with n_b > 0:

    - ``token-mean`` (DAPO): sum_bt m L / sum_bt m.
    - ``seq-mean-token-sum``: (1/B') sum_b sum_t m L.
    - ``seq-mean-token-mean`` (GRPO): (1/B') sum_b (sum_t m L) / n_b.
    - ``seq-mean-token-sum-norm`` (Dr. GRPO, Liu et al. 2025): sum_bt m L / (max_len * B'), where
      ``max_len`` is a constant (the maximum response length), so the loss does not depend on the
      lengths of the sampled responses.

    Fully masked sequences are left out of B'. Masked positions (even inf or NaN there) do not reach the
    result. With no valid token at all the loss is 0.
    """
    if loss_mat_BT.shape != mask_BT.shape or loss_mat_BT.dim() != 2:
        raise ValueError(
            f"loss_mat and mask must both be (B, T), got {tuple(loss_mat_BT.shape)} and {tuple(mask_BT.shape)}"
        )
    valid_BT = mask_BT.bool()
    masked_BT = torch.where(valid_BT, loss_mat_BT, torch.zeros_like(loss_mat_BT))
    tokens_B = valid_BT.sum(dim=1)
    num_seqs = (tokens_B > 0).sum().clamp(min=1)
    if mode == "token-mean":
        return masked_BT.sum() / tokens_B.sum().clamp(min=1)
    if mode == "seq-mean-token-sum":
        return masked_BT.sum() / num_seqs
    if mode == "seq-mean-token-mean":
        return (masked_BT.sum(dim=1) / tokens_B.clamp(min=1)).sum() / num_seqs
    if mode == "seq-mean-token-sum-norm":
        if max_len is None or max_len <= 0:
            raise ValueError(
                "mode 'seq-mean-token-sum-norm' (Dr. GRPO) needs max_len, the constant maximum response length, "
                f"got {max_len!r}"
            )
        return masked_BT.sum() / (max_len * num_seqs)
    raise unknown_choice("loss aggregation mode", mode, AGG_MODES)


def _kl_k1(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor) -> torch.Tensor:
    return logp_BT - ref_logp_BT


def _kl_k2(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logp_BT - ref_logp_BT).square()


def _kl_k3(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor) -> torch.Tensor:
    log_ref_ratio_BT = torch.clamp(ref_logp_BT - logp_BT, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    k3_BT = torch.exp(log_ref_ratio_BT) - log_ref_ratio_BT - 1.0
    return torch.clamp(k3_BT, -K3_CLAMP, K3_CLAMP)


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": _kl_k1,
    "k2": _kl_k2,
    "k3": _kl_k3,
}
"""The functions of :data:`KLEstimator`'s names."""


def kl_penalty(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled tokens (Schulman 2020, "Approximating KL").

    With d = ref_logp - logp:
    k1 = -d = logp - ref_logp; k2 = 0.5 d^2; k3 = exp(d) - d - 1, with d clamped to [-20, 20] and the
    result to [-10, 10] as verl does (k3 >= 0, unbiased, low variance; the paper's choice with
    coefficient 0.001).
    """
    try:
        estimator = KL_ESTIMATORS[kind]
    except KeyError:
        raise unknown_choice("KL estimator", kind, KL_ESTIMATORS) from None
    if logp_BT.shape != ref_logp_BT.shape:
        raise ValueError(
            f"logp {tuple(logp_BT.shape)} and ref_logp {tuple(ref_logp_BT.shape)} differ in shape"
        )
    return estimator(logp_BT, ref_logp_BT)


def entropy_from_logits(logits_BTV: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax over the last dimension: H = logsumexp(z) - sum_v softmax(z)_v z_v.

    Equal to -sum_v p_v log p_v, computed without forming log p (stable for large logits). Logits of
    -inf (masked vocabulary entries) contribute 0. Returns shape ``logits.shape[:-1]``.
    """
    log_norm_BT = torch.logsumexp(logits_BTV, dim=-1)
    probs_BTV = torch.softmax(logits_BTV, dim=-1)
    finite_logits_BTV = torch.where(torch.isfinite(logits_BTV), logits_BTV, torch.zeros_like(logits_BTV))
    return log_norm_BT - (probs_BTV * finite_logits_BTV).sum(dim=-1)


def overlong_penalty(lengths_B: torch.Tensor, max_len: int, cache_len: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13; docs/design.md §3).

    With L_max = ``max_len``, L_c = ``cache_len`` and |y| the response length:
    R_len = 0 if |y| <= L_max - L_c; ((L_max - L_c) - |y|) / L_c if L_max - L_c < |y| <= L_max;
    -1 if |y| > L_max. Added to the task reward. Returns float32 of shape (B,).
    """
    if max_len <= 0 or not (0 <= cache_len <= max_len):
        raise ValueError(
            f"need max_len > 0 and 0 <= cache_len <= max_len, got max_len={max_len}, cache_len={cache_len}"
        )
    lengths_B = torch.as_tensor(lengths_B, dtype=torch.float32)
    soft_start = max_len - cache_len
    ramp_B = (soft_start - lengths_B) / max(cache_len, 1)
    penalty_B = torch.where(lengths_B <= soft_start, torch.zeros_like(lengths_B), ramp_B)
    return torch.where(lengths_B > max_len, torch.full_like(lengths_B, -1.0), penalty_B)
