"""What ``ebpo diagnose`` measures, as pure functions over tensors and arrays (no model, no sampling).

Shapes: ``M`` prompts of one batch, ``G`` responses per prompt (``N = M * G``), ``R`` batches, ``K`` the
dimension of a projected gradient, ``D`` the model's parameter count.

Definitions (docs/diagnose.md states them for readers; each function's docstring gives its formula):

- **Baseline** of a response: b = r - a, with a the estimator's *raw* advantage (before any normalisation):
  what the advantage subtracts from the reward (:data:`RAW_ADVANTAGE`). The **centred baseline** adds the
  batch-wide mean the estimator's normalisation subtracts (EBPO's ``normalize="batch"``,
  REINFORCE++-baseline): it is what the training advantage compares the reward with.
- **Baseline error**: mean over the batch's responses of (b - p̂)², minus the reference's own noise, where
  p̂ is the prompt's mean reward over G_ref separate samples and s²/G_ref (s² the unbiased variance of those
  samples; p̂(1 - p̂)/(G_ref - 1) for 0/1 rewards) the unbiased estimate of Var(p̂): since p̂ is
  independent of b, E[(b - p̂)²] = E[(b - p)²] + Var(p̂), so the difference is an unbiased estimate of the
  baseline's mean squared error against the true success rate p.
- **Projection**: every gradient is sketched to K dimensions by a seeded CountSketch (:class:`GradientSketch`).
- **Gradient quality** against each batch's reference gradient (which ``study`` measures): the cosine, the
  relative squared error after one least-squares scale, the variance ratio across batches (all three from
  :class:`GradientProducts`), the norm.
- **Intervals**: t-intervals for per-batch means, delete-one jackknife intervals for the ratio statistics.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from ebpo.stats import t_quantile  # noqa: F401  (ebpo.diagnostics.measures.t_quantile: the intervals' quantile)

ZERO_ADVANTAGE = 1e-6
"""|A| below this counts as no advantage (advantages come back as float32)."""


# --------------------------------------------------------------------------------------------------
# the baseline each estimator compares a reward with


class RawAdvantage(NamedTuple):
    """How to read an estimator's raw advantage a = r - b and the centring its normalisation applies.

    ``twin``: (name, options) of an estimator whose output *is* the raw advantage of this one on the same
    batch (it holds the same state when fed the same batches), or None when the estimator's own output is
    un-normalised. ``centres``: the training advantage is (a - mean(a)) / scale over the whole batch, so the
    response is compared with b + mean(a)."""

    twin: tuple[str, dict[str, Any]] | None
    centres: bool


def _grpo(options: Mapping[str, Any]) -> RawAdvantage:
    # A = (r - r̄) / (s + eps): the raw advantage is r - r̄ (grpo with norm_by_std=False)
    if options.get("norm_by_std", True):
        return RawAdvantage(("grpo", {**options, "norm_by_std": False}), False)
    return RawAdvantage(None, False)


def _reinforce_pp_baseline(options: Mapping[str, Any]) -> RawAdvantage:
    # a = r - r̄, then whitened over the batch: (a - mean a) / sqrt(var a + eps)
    return RawAdvantage(("grpo", {"norm_by_std": False}), True)


def _ebpo(options: Mapping[str, Any]) -> RawAdvantage:
    # a = r - V_m; normalize: batch (a - mean a) / (std a + eps), group / prior: a / scale, none: a
    from ebpo.advantages import EBPOOptions

    normalize = EBPOOptions(**options).normalize
    if normalize == "none":
        return RawAdvantage(None, False)
    return RawAdvantage(("ebpo", {**options, "normalize": "none"}), normalize == "batch")


RAW_ADVANTAGE: dict[str, Callable[[Mapping[str, Any]], RawAdvantage]] = {
    "grpo": _grpo,
    "reinforce_pp_baseline": _reinforce_pp_baseline,
    "ebpo": _ebpo,
}
"""Estimators whose output is not their raw advantage, by name. Every other estimator (``dr_grpo``: r - r̄;
``rloo``: r - the leave-one-out mean; ``jspo``: r - its James-Stein baseline; any estimator registered
later) is read as un-normalised: b = r - A."""


def raw_advantage(name: str, options: Mapping[str, Any]) -> RawAdvantage:
    """How to read estimator ``name``'s raw advantage (:data:`RAW_ADVANTAGE`)."""
    read = RAW_ADVANTAGE.get(name)
    return read(options) if read is not None else RawAdvantage(None, False)


def baselines(
    rewards_N: torch.Tensor, raw_adv_N: torch.Tensor, centres: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(baseline_N, centred_N)``: b = r - a, and b + mean(a) where the estimator centres over the batch
    (else b again)."""
    baseline_N = rewards_N - raw_adv_N
    return baseline_N, (baseline_N + raw_adv_N.mean() if centres else baseline_N)


def baseline_error(
    baseline_N: torch.Tensor, ref_mean_N: torch.Tensor, ref_var_of_mean_N: torch.Tensor
) -> float:
    """Mean over responses of (b - p̂)² - Var̂(p̂): an unbiased estimate of E[(b - p)²] when p̂ is
    independent of b and ``ref_var_of_mean_N`` is an unbiased estimate of Var(p̂) (module docstring)."""
    return float(((baseline_N - ref_mean_N) ** 2).mean() - ref_var_of_mean_N.mean())


def reference_rate(rewards_MR: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(p̂_M, var_M)``: each prompt's mean reward over its G_ref reference samples and the unbiased
    estimate s² / G_ref of that mean's variance (s² with G_ref - 1 in the denominator)."""
    count = rewards_MR.shape[1]
    return rewards_MR.mean(dim=1), rewards_MR.var(dim=1, unbiased=True) / count


class PoolStats(NamedTuple):
    """The batch's prompts as the reference samples see them: mean success rate, within-prompt variance
    sigma2 = mean s², between-prompt variance tau2 = Var(p̂) - mean Var̂(p̂) (the sampling noise of p̂ removed;
    may come out slightly negative by chance), so that the Bayes-optimal shrinkage at group size G is
    S* = (sigma2/G) / (sigma2/G + tau2) (Theorem 2)."""

    mean: float
    sigma2: float
    tau2: float


def pool_stats(rewards_MR: torch.Tensor) -> PoolStats:
    """:class:`PoolStats` of one batch's reference rewards (M, G_ref)."""
    p_M, var_of_mean_M = reference_rate(rewards_MR)
    sigma2 = float((var_of_mean_M * rewards_MR.shape[1]).mean())
    tau2 = float(p_M.var(unbiased=True) - var_of_mean_M.mean()) if p_M.numel() > 1 else float("nan")
    return PoolStats(float(p_M.mean()), sigma2, tau2)


def optimal_shrinkage(sigma2: float, tau2: float, group_size: int) -> tuple[float, float, float]:
    """``(S*, MSE of the group mean, MSE of the Bayes-optimal shrunk baseline)`` at group size G: sigma2/G and
    (1 - S*) sigma2/G (Theorem 2), tau2 floored at 0."""
    noise = sigma2 / group_size
    tau2 = max(tau2, 0.0)
    shrinkage = noise / (noise + tau2) if noise + tau2 > 0 else 0.0
    return shrinkage, noise, (1 - shrinkage) * noise


class AdvantageCounts(NamedTuple):
    """Fractions of a batch that carry no gradient: responses with |A| below :data:`ZERO_ADVANTAGE`; groups
    all of whose responses are so; groups whose advantages are all equal (zero or not: a group-constant
    advantage has zero expected gradient under constant sequence weights, docs/theory.md §2)."""

    zero_responses: float
    zero_groups: float
    constant_groups: float


def advantage_counts(adv_MG: torch.Tensor) -> AdvantageCounts:
    """:class:`AdvantageCounts` of advantages shaped (M, G)."""
    zero_MG = adv_MG.abs() < ZERO_ADVANTAGE
    spread_M = adv_MG.max(dim=1).values - adv_MG.min(dim=1).values
    return AdvantageCounts(
        float(zero_MG.double().mean()),
        float(zero_MG.all(dim=1).double().mean()),
        float((spread_M < ZERO_ADVANTAGE).double().mean()),
    )


# --------------------------------------------------------------------------------------------------
# the projection


class GradientSketch:
    """A seeded CountSketch of a model's gradient to ``dim`` numbers (Charikar, Chen and Farach-Colton 2002;
    a sparse Johnson-Lindenstrauss transform): coordinate j of the flattened gradient is added, with a
    random sign s_j, to bucket h(j) of ``dim``. It is linear, E<Sx, Sy> = <x, y> over the draw of (h, s),
    and Var<Sx, Sy> = (sum_{i != j} x_i² y_j² + x_i y_i x_j y_j) / dim <= (|x|² |y|² + <x, y>²) / dim, so a
    cosine read from sketches is off by at most about sqrt((1 + cos²) / dim) (one standard deviation;
    0.016 at the default dim 8192). The same (h, s) serves every gradient of a run, so differences between
    estimators on one batch are sketched alike. ``dim=0``: no projection (the flattened gradient itself, D
    numbers, exact).

    (h, s) of parameter i come from a generator seeded with ``seed`` and i on the parameter's device; they
    are kept while the model has at most :attr:`CACHE_LIMIT` parameters (5 bytes each) and drawn again per
    call above that, so memory stays O(dim) beside the gradient itself."""

    CACHE_LIMIT = 50_000_000

    def __init__(self, numels: Sequence[int], dim: int, seed: int) -> None:
        if dim < 0:
            raise ValueError(f"projection dim must be >= 0 (0: no projection), got {dim}")
        self.numels, self.dim, self.seed = list(numels), dim, seed
        self.total = sum(self.numels)
        self._cache: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def out_dim(self) -> int:
        """Numbers per sketched gradient: ``dim``, or D without projection."""
        return self.dim if self.dim > 0 else self.total

    def _hash(self, i: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (i, str(device))
        if key in self._cache:
            return self._cache[key]
        generator = torch.Generator(device=device).manual_seed(self.seed * 1_000_003 + i)
        bucket = torch.randint(0, self.dim, (self.numels[i],), generator=generator, device=device)
        sign = torch.randint(0, 2, (self.numels[i],), generator=generator, device=device) * 2 - 1
        if self.total <= self.CACHE_LIMIT:
            self._cache[key] = (bucket, sign)
        return bucket, sign

    def __call__(self, grads: Sequence[torch.Tensor | None]) -> torch.Tensor:
        """The sketch (float64, on the CPU) of the gradient given per parameter (None: zero)."""
        if len(grads) != len(self.numels):
            raise ValueError(f"expected {len(self.numels)} parameter gradients, got {len(grads)}")
        if self.dim == 0:
            parts = [
                torch.zeros(n, dtype=torch.float64) if g is None else g.detach().reshape(-1).double().cpu()
                for g, n in zip(grads, self.numels)
            ]
            return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)
        out = None
        for i, grad in enumerate(grads):
            if grad is None:
                continue
            flat = grad.detach().reshape(-1).double()
            if out is None:
                out = torch.zeros(self.dim, dtype=torch.float64, device=flat.device)
            bucket, sign = self._hash(i, flat.device)
            out.index_add_(0, bucket, flat * sign)
        return torch.zeros(self.dim, dtype=torch.float64) if out is None else out.cpu()


# --------------------------------------------------------------------------------------------------
# gradient quality over R batches


class GradientProducts(NamedTuple):
    """The inner products every gradient statistic is computed from, for one estimator at one G over R
    batches: ``dot_R`` = <g_r, ref_r>, ``norm2_R`` = |g_r|², ``gram_RR`` = <g_r, g_s>. With the reference's
    ``ref2_R`` = |ref_r|² and noise ``noise_R``, a statistic of any resample of the batches is a function of
    these numbers (the jackknife never touches the K-dimensional vectors)."""

    dot_R: np.ndarray
    norm2_R: np.ndarray
    gram_RR: np.ndarray

    @staticmethod
    def of(grad_RK: torch.Tensor, ref_RK: torch.Tensor) -> GradientProducts:
        return GradientProducts(
            (grad_RK * ref_RK).sum(dim=1).numpy(),
            (grad_RK * grad_RK).sum(dim=1).numpy(),
            (grad_RK @ grad_RK.T).numpy(),
        )


def cosines(dot_R: np.ndarray, norm2_R: np.ndarray, ref2_R: np.ndarray) -> np.ndarray:
    """Per batch, cos(g_r, ref_r) = <g_r, ref_r> / (|g_r| |ref_r|); 0 where either vector is zero (no direction
    to align)."""
    norm_R = np.sqrt(norm2_R * ref2_R)
    return np.where(norm_R > 0, dot_R / np.where(norm_R > 0, norm_R, 1.0), 0.0)


def relative_squared_error(
    dot_R: np.ndarray, norm2_R: np.ndarray, ref2_R: np.ndarray, noise_R: np.ndarray
) -> float:
    """The gradient's squared error against the true gradient, relative to the true gradient's squared norm,
    after one least-squares scale c over the R batches (the constant step-size rescaling that fits the
    reference best; each estimator's raw scale differs by its normalisation):

        c = sum_r <g_r, ref_r> / sum_r |g_r|²,
        error = sum_r (|c g_r - ref_r|² - n_r) / sum_r (|ref_r|² - n_r),

    where n_r estimates the reference's own noise tr Cov(ref_r) (:func:`reference_noise`): ref_r is
    independent of g_r, so E|c g - ref|² = E|c g - ∇J|² + tr Cov(ref), and E(|ref|² - n) = |∇J|².
    |c g - ref|² = c² |g|² - 2 c <g, ref> + |ref|². 0 is a perfect gradient up to scale, 1 is no better than
    a zero gradient. NaN when the reference carries no signal (the denominator <= 0)."""
    norm2, dot = float(norm2_R.sum()), float(dot_R.sum())
    scale = dot / norm2 if norm2 > 0 else 0.0
    signal = float(ref2_R.sum() - noise_R.sum())
    if signal <= 0:
        return float("nan")
    return (scale * scale * norm2 - 2 * scale * dot + signal) / signal


def variance_ratio(gram_RR: np.ndarray) -> float:
    """tr Cov(g) / |E g|² over the R batches, from the Gram matrix <g_r, g_s>, each part estimated without
    bias from the pairs of distinct batches:

        tr Cov(g) ~ (1/2) mean_{r != s} |g_r - g_s|²  (the sample covariance's trace, R - 1 in its denominator),
        |E g|²    ~ mean_{r != s} <g_r, g_s>           (|mean g|² would hold tr Cov / R of noise).

    The spread of the one-batch gradient around its expectation relative to the expectation's size;
    scale-free. Batches hold different prompts, so the spread includes theirs, the same for every
    estimator. NaN when the denominator is not positive (the R batches show no common direction)."""
    count = gram_RR.shape[0]
    if count < 2:
        return float("nan")
    total, diagonal = float(gram_RR.sum()), float(np.trace(gram_RR))
    pairs = count * (count - 1)
    size = (total - diagonal) / pairs
    spread = (diagonal * (count - 1) - (total - diagonal)) / pairs  # (1/2) mean_{r != s} |g_r - g_s|²
    return spread / size if size > 0 else float("nan")


def reference_noise(half_a_K: torch.Tensor, half_b_K: torch.Tensor) -> tuple[torch.Tensor, float]:
    """``(ref_K, n)``: the reference gradient (g_A + g_B) / 2 from two independent halves of the reference
    samples, and n = |g_A - g_B|² / 4, an unbiased estimate of tr Cov(ref): E|g_A - g_B|² = 2 tr Cov(g_half)
    and tr Cov(ref) = tr Cov(g_half) / 2."""
    return (half_a_K + half_b_K) / 2, float(((half_a_K - half_b_K) ** 2).sum() / 4)


# --------------------------------------------------------------------------------------------------
# intervals


@dataclass(frozen=True)
class Interval:
    """An estimate and its 95% interval [low, high] (NaN bounds with too few batches)."""

    value: float
    low: float
    high: float

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def mean_interval(values: Iterable[float]) -> Interval:
    """Mean of per-batch values with its 95% t-interval, mean ± t_{0.975, R-1} s / sqrt(R)."""
    array = np.asarray(list(values), dtype=np.float64)
    mean = float(array.mean()) if array.size else float("nan")
    if array.size < 2:
        return Interval(mean, float("nan"), float("nan"))
    half = t_quantile(array.size - 1) * float(array.std(ddof=1)) / math.sqrt(array.size)
    return Interval(mean, mean - half, mean + half)


def jackknife_interval(statistic: Callable[[np.ndarray], float], num_batches: int) -> Interval:
    """``statistic(all batches)`` with a 95% delete-one jackknife interval over batches (Quenouille 1956,
    Tukey 1958): theta_(i) = ``statistic`` without batch i, se² = (R - 1)/R sum_i (theta_(i) - mean theta_(.))²,
    interval theta ± t_{0.975, R-1} se. For a mean it is the t-interval exactly; for the ratio statistics it
    needs no resampling with repeats (a bootstrap draw that repeats a batch makes pairs of equal gradients,
    which biases the variance ratio). A paired difference is the statistic of both estimators on the same
    batches. NaN bounds when a leave-one-out value is NaN or R < 3."""
    everything = np.arange(num_batches)
    value = statistic(everything)
    if num_batches < 3:
        return Interval(value, float("nan"), float("nan"))
    left_out = np.array([statistic(np.delete(everything, i)) for i in range(num_batches)])
    if np.isnan(left_out).any() or math.isnan(value):
        return Interval(value, float("nan"), float("nan"))
    se = math.sqrt((num_batches - 1) / num_batches * float(((left_out - left_out.mean()) ** 2).sum()))
    half = t_quantile(num_batches - 1) * se
    return Interval(value, value - half, value + half)
