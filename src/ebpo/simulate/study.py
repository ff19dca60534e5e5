"""``ebpo simulate`` (``--study estimators``): a Monte Carlo study of the advantage estimators on synthetic RLVR
streams (:mod:`ebpo.simulate.streams`).

Two studies, both through the public estimator registry (``ebpo.get_estimator``):

1. **Theorem 2** (paper, "Stability via MSE Reduction"). Gaussian model: latent rate
   theta_m ~ N(mu, tau2), rewards r_mi = theta_m + N(0, sigma2), G per group. The Bayes-optimal
   shrinkage S = (sigma2/G) / (sigma2/G + tau2) gives a baseline with MSE (1 - S) sigma2 / G against
   theta, below GRPO's sigma2 / G. EBPO reaches the closed form when its prior estimates the model's two
   variances, within-group and latent between-prompt (``sigma2="pooled"``, ``tau2="latent"``,
   docs/design.md §2). The paper-faithful defaults (``sigma2="total"``, ``tau2="raw"``) estimate
   sigma2 + tau2 and tau2 + sigma2/G instead: their weight w is not the optimal S and their MSE is
   (1 - w)^2 sigma2/G + w^2 tau2 (printed beside it).

2. **Estimators on a binary RLVR stream.** K topics with distinct mean success rates; each topic holds a
   pool of prompts whose latent rate is Beta around the topic mean; each step draws M prompts and G
   Bernoulli(theta) rewards per prompt. Streams: ``shuffled`` (prompts drawn from every topic) or
   ``topic`` (blocks of ``topic_block`` consecutive steps from one topic, topic order shuffled by seed).
   Policy: ``stationary`` or ``improving`` (every latent logit rises by ``drift`` over the run).
   For each estimator: the MSE of its baseline against the true latent rate, the fraction of samples with
   zero advantage, and the mean |advantage| in all-fail groups (a count, not a measure of signal: a
   group-constant advantage has zero expected gradient, docs/theory.md). For EBPO variants (``prior_scope`` global /
   cluster x ``prior_memory`` all / half-life) also the MSE of the prior mean against theta, the quantity
   of the paper's Proposition "Advantage of Clustered Sampling", beside the proposition's two idealised
   values (the per-step oracle global mean and oracle topic mean).

How baselines are read: the baseline is b = r - a where a is the estimator's raw (un-normalised)
advantage. ``dr_grpo``, ``rloo`` and ``jspo`` do not normalise; ``grpo`` and ``reinforce_pp_baseline``
share the group-mean baseline (read from ``grpo`` with ``norm_by_std=False``); ``ebpo`` runs with
``normalize="none"``, which gives r - V, and its training advantage is ``batch_normalize`` of that (what
``normalize="batch"`` does). The EBPO prior mean is recovered exactly from its baseline: within one
prior (the batch for global scope, a topic for cluster scope) and one group size,
V_m = (1 - S) rbar_m + S mu, a line in rbar_m whose slope gives S and intercept S mu.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ebpo.simulate.config import SimulateConfig
from ebpo.simulate.streams import ORDERS, POLICIES, Stream, make_stream

__all__ = [
    "ZERO_ADV_TOL",
    "EstimatorSpec",
    "SimulateResult",
    "estimator_specs",
    "oracle_prior_mse",
    "recover_prior",
    "run_estimator",
    "simulate",
    "theorem2",
]

ZERO_ADV_TOL = 1e-6
"""|A| below this counts as a zero advantage (advantages come back as float32)."""


# --------------------------------------------------------------------------------------------------
# estimators under study


@dataclass(frozen=True)
class EstimatorSpec:
    """One row of the study: an estimator, its options, and where its raw baseline comes from.

    ``baseline_from``: (name, options) of a twin estimator whose ``r - advantage`` is this estimator's
    baseline, or None when the estimator's own advantage is un-normalised. ``batch_normalized``: the
    estimator is built with ``normalize="none"`` (its output is the raw advantage r - V) and the advantage
    it trains with is ``ebpo.advantages.batch_normalize`` of that, exactly what ``normalize="batch"``
    computes (this saves running EBPO twice). ``prior_key``: for EBPO, what one prior is shared by
    ("batch" for global scope, "topic" for cluster scope), else None.
    """

    label: str
    name: str
    options: dict[str, Any]
    baseline_from: tuple[str, dict[str, Any]] | None
    prior_key: str | None = None
    batch_normalized: bool = False


def _ebpo_spec(label: str, prior_key: str, **options: Any) -> EstimatorSpec:
    return EstimatorSpec(
        label, "ebpo", {**options, "normalize": "none"}, None, prior_key, batch_normalized=True
    )


def estimator_specs(half_life: float) -> list[EstimatorSpec]:
    """The baselines with their default options, then the EBPO prior-scope x prior-memory grid."""
    return [
        EstimatorSpec("grpo", "grpo", {}, ("grpo", {"norm_by_std": False})),
        EstimatorSpec("dr_grpo", "dr_grpo", {}, None),
        EstimatorSpec("rloo", "rloo", {}, None),
        EstimatorSpec("reinforce_pp_baseline", "reinforce_pp_baseline", {}, ("grpo", {"norm_by_std": False})),
        EstimatorSpec("jspo", "jspo", {}, None),
        _ebpo_spec("ebpo (paper: global, all)", "batch"),
        _ebpo_spec("ebpo cluster, all", "topic", prior_scope="cluster"),
        _ebpo_spec(f"ebpo global, half-life {half_life:g}", "batch", prior_memory=half_life),
        _ebpo_spec(
            f"ebpo cluster, half-life {half_life:g}", "topic", prior_scope="cluster", prior_memory=half_life
        ),
    ]


def recover_prior(
    baseline_M: np.ndarray, mean_M: np.ndarray, key_M: np.ndarray, min_shrinkage: float = 1e-3
) -> tuple[np.ndarray, np.ndarray]:
    """Prior mean mu and shrinkage S of each group from EBPO's baseline (equal group sizes).

    Within one key (one prior), V_m = (1 - S) rbar_m + S mu: the least-squares line of V on rbar has
    slope 1 - S and intercept S mu, exact when the points lie on the line. Groups whose key has a single
    distinct rbar, or S < ``min_shrinkage`` (the prior does not enter), get NaN.
    """
    mu_M = np.full(baseline_M.shape, np.nan)
    shrinkage_M = np.full(baseline_M.shape, np.nan)
    for key in np.unique(key_M):
        in_key = key_M == key
        x, y = mean_M[in_key], baseline_M[in_key]
        spread = x - x.mean()
        if np.sum(spread**2) < 1e-12:
            continue
        slope = float(np.sum(spread * (y - y.mean())) / np.sum(spread**2))
        shrinkage = 1.0 - slope
        if shrinkage < min_shrinkage:
            continue
        intercept = float(y.mean() - slope * x.mean())
        mu_M[in_key] = intercept / shrinkage
        shrinkage_M[in_key] = shrinkage
    return mu_M, shrinkage_M


@dataclass
class _Accumulator:
    """Sums over the measured steps of one (stream, estimator) run."""

    baseline_sq_err: float = 0.0
    samples: int = 0
    zero_adv: int = 0
    all_fail_abs_adv: float = 0.0
    all_fail_abs_raw: float = 0.0
    all_fail_samples: int = 0
    prior_sq_err: float = 0.0
    prior_groups: int = 0
    shrinkage: float = 0.0
    shrinkage_groups: int = 0
    prior_sq_err_by_step: list[float] = field(default_factory=list)

    def result(self) -> dict[str, float]:
        nan = float("nan")
        return {
            "baseline_mse": self.baseline_sq_err / self.samples,
            "zero_adv_frac": self.zero_adv / self.samples,
            "all_fail_abs_adv": self.all_fail_abs_adv / self.all_fail_samples
            if self.all_fail_samples
            else nan,
            "all_fail_abs_raw_adv": self.all_fail_abs_raw / self.all_fail_samples
            if self.all_fail_samples
            else nan,
            "prior_mse": self.prior_sq_err / self.prior_groups if self.prior_groups else nan,
            "shrinkage": self.shrinkage / self.shrinkage_groups if self.shrinkage_groups else nan,
        }


def run_estimator(spec: EstimatorSpec, stream: Stream, warmup: int) -> tuple[dict[str, float], list[float]]:
    """Feed the stream to ``spec``'s estimator step by step; return its averages and per-step prior MSE."""
    import torch

    from ebpo import get_estimator
    from ebpo.advantages import batch_normalize

    est = get_estimator(spec.name, **spec.options)
    twin = get_estimator(spec.baseline_from[0], **spec.baseline_from[1]) if spec.baseline_from else None
    S, M, G = stream.rewards_SMG.shape
    index_N = np.repeat(np.arange(M), G)
    acc = _Accumulator()
    for step in range(S):
        rewards_N = torch.from_numpy(stream.rewards_SMG[step].reshape(-1))
        cluster_N = np.repeat(stream.topic_SM[step], G)
        out_N = est(rewards_N, index_N, cluster_N)
        adv_N = (batch_normalize(out_N.double()) if spec.batch_normalized else out_N.double()).numpy()
        raw_N = (
            out_N.double().numpy() if twin is None else twin(rewards_N, index_N, cluster_N).double().numpy()
        )
        if step < warmup:
            continue
        baseline_N = rewards_N.numpy() - raw_N  # b = r - a
        theta_N = np.repeat(stream.theta_SM[step], G)
        acc.baseline_sq_err += float(np.sum((baseline_N - theta_N) ** 2))
        acc.samples += baseline_N.size
        acc.zero_adv += int(np.sum(np.abs(adv_N) < ZERO_ADV_TOL))
        all_fail_N = np.repeat(stream.rewards_SMG[step].max(axis=1) == 0, G)
        acc.all_fail_abs_adv += float(np.abs(adv_N[all_fail_N]).sum())
        acc.all_fail_abs_raw += float(np.abs(raw_N[all_fail_N]).sum())
        acc.all_fail_samples += int(all_fail_N.sum())
        if spec.prior_key is None:
            continue
        key_M = stream.topic_SM[step] if spec.prior_key == "topic" else np.zeros(M, dtype=int)
        mu_M, shrinkage_M = recover_prior(
            baseline_N[::G], stream.rewards_SMG[step].mean(axis=1), key_M
        )  # every sample of a group shares V_m
        known_M = ~np.isnan(mu_M)
        sq_err_M = (mu_M[known_M] - stream.theta_SM[step][known_M]) ** 2
        acc.prior_sq_err += float(sq_err_M.sum())
        acc.prior_groups += int(known_M.sum())
        acc.prior_sq_err_by_step.append(float(sq_err_M.mean()) if known_M.any() else float("nan"))
        acc.shrinkage += float(np.nansum(shrinkage_M))
        acc.shrinkage_groups += int(known_M.sum())
    return acc.result(), acc.prior_sq_err_by_step


def oracle_prior_mse(stream: Stream, warmup: int) -> dict[str, float]:
    """The clustering proposition's two idealised regimes, measured on this stream after warm-up.

    J_shuffle: prior = the current mean latent rate over all topics; J_coherent: prior = the current mean
    latent rate of the prompt's topic (the prior "has adapted" to the cluster).
    """
    theta = stream.theta_SM[warmup:]
    return {
        "oracle_global_prior_mse": float(np.mean((stream.oracle_global_mean_SM[warmup:] - theta) ** 2)),
        "oracle_topic_prior_mse": float(np.mean((stream.oracle_topic_mean_SM[warmup:] - theta) ** 2)),
        "all_fail_group_frac": float(np.mean(stream.rewards_SMG[warmup:].max(axis=2) == 0)),
    }


# --------------------------------------------------------------------------------------------------
# Theorem 2


def theorem2(cfg: SimulateConfig, seed: int) -> dict[str, float]:
    """Gaussian-model Monte Carlo of Theorem 2 (see the module docstring); one run of ``theorem2_steps``.

    Returns the measured baseline MSEs after warm-up of GRPO (group mean), EBPO with the textbook
    Empirical Bayes prior (pooled sigma2, latent tau2) and paper-default EBPO, with the closed forms:
    sigma2/G, (1 - S) sigma2/G with S = (sigma2/G)/(sigma2/G + tau2), and for the paper default
    (1 - w)^2 sigma2/G + w^2 tau2 at its measured mean weight w.
    """
    import torch

    from ebpo import get_estimator

    rng = np.random.default_rng(seed)
    S, M, G = cfg.theorem2_steps, cfg.prompts_per_step, cfg.group_size
    mu, tau2, sigma2 = cfg.theorem2_mu, cfg.theorem2_tau2, cfg.theorem2_sigma2
    theta_SM = mu + math.sqrt(tau2) * rng.standard_normal((S, M))
    rewards_SMG = theta_SM[..., None] + math.sqrt(sigma2) * rng.standard_normal((S, M, G))
    index_N = np.repeat(np.arange(M), G)
    textbook = get_estimator("ebpo", sigma2="pooled", tau2="latent", normalize="none")
    paper = get_estimator("ebpo", normalize="none")
    sq_err = {"grpo": 0.0, "textbook": 0.0, "paper": 0.0}
    paper_weight = 0.0
    for step in range(S):
        rewards_N = torch.from_numpy(rewards_SMG[step].reshape(-1))
        baseline_textbook_N = rewards_N.numpy() - textbook(rewards_N, index_N).double().numpy()
        baseline_paper_N = rewards_N.numpy() - paper(rewards_N, index_N).double().numpy()
        if step < cfg.warmup:
            continue
        theta_M = theta_SM[step]
        sq_err["grpo"] += float(np.sum((rewards_SMG[step].mean(axis=1) - theta_M) ** 2))
        sq_err["textbook"] += float(np.sum((baseline_textbook_N[::G] - theta_M) ** 2))
        sq_err["paper"] += float(np.sum((baseline_paper_N[::G] - theta_M) ** 2))
        paper_weight += paper.metrics()["ebpo/shrinkage"]
    groups = (S - cfg.warmup) * M
    shrinkage = (sigma2 / G) / (sigma2 / G + tau2)  # the Bayes-optimal S of Theorem 2
    closed_form = (1 - shrinkage) * sigma2 / G
    w = paper_weight / (S - cfg.warmup)
    mse_textbook = sq_err["textbook"] / groups
    return {
        "groups": groups,
        "shrinkage_true": shrinkage,
        "mse_grpo": sq_err["grpo"] / groups,
        "closed_form_grpo": sigma2 / G,
        "mse_ebpo_textbook": mse_textbook,
        "closed_form_ebpo": closed_form,
        "rel_err_ebpo_textbook": mse_textbook / closed_form - 1,
        "mse_ebpo_paper": sq_err["paper"] / groups,
        "paper_weight_w": w,
        "closed_form_ebpo_paper": (1 - w) ** 2 * sigma2 / G + w**2 * tau2,
    }


# --------------------------------------------------------------------------------------------------
# the whole study


@dataclass
class SimulateResult:
    """``rows``: one dict per (scenario, estimator) with means over seeds and ``*_se`` standard errors;
    ``theorem2``: the Theorem 2 figures pooled over seeds; ``prior_curves``: per-step prior MSE (mean over
    seeds) of each EBPO variant in each scenario, for the plot."""

    rows: list[dict[str, Any]]
    theorem2: dict[str, float]
    prior_curves: dict[tuple[str, str], list[float]]
    seconds: float


def _mean_and_se(values: list[float]) -> tuple[float, float]:
    array = np.asarray(values, dtype=np.float64)
    if np.all(np.isnan(array)):
        return float("nan"), float("nan")
    mean = float(np.nanmean(array))
    valid = array[~np.isnan(array)]
    se = float(np.std(valid, ddof=1) / math.sqrt(valid.size)) if valid.size > 1 else float("nan")
    return mean, se


def _nanmean_over_seeds(curves: list[list[float]]) -> list[float]:
    """Per-step mean over seeds ignoring NaN (steps where no prior could be recovered); NaN if none."""
    array = np.array(curves, dtype=np.float64)
    known = ~np.isnan(array)
    total = np.where(known, array, 0.0).sum(axis=0)
    count = known.sum(axis=0)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan).tolist()


def simulate(cfg: SimulateConfig) -> SimulateResult:
    """Run both studies over every seed (deterministic given ``cfg``)."""
    start = time.perf_counter()
    specs = estimator_specs(cfg.half_life)
    rows: list[dict[str, Any]] = []
    prior_curves: dict[tuple[str, str], list[float]] = {}
    for order in ORDERS:
        for policy in POLICIES:
            scenario = f"{order}/{policy}"
            per_spec: dict[str, list[dict[str, float]]] = {spec.label: [] for spec in specs}
            curves: dict[str, list[list[float]]] = {spec.label: [] for spec in specs}
            oracles = []
            for seed in cfg.seeds:
                stream = make_stream(cfg, order, policy, seed)
                oracles.append(oracle_prior_mse(stream, cfg.warmup))
                for spec in specs:
                    result, curve = run_estimator(spec, stream, cfg.warmup)
                    per_spec[spec.label].append(result)
                    curves[spec.label].append(curve)
            oracle = {key: float(np.mean([o[key] for o in oracles])) for key in oracles[0]}
            for spec in specs:
                row: dict[str, Any] = {"study": "stream", "scenario": scenario, "estimator": spec.label}
                for metric in per_spec[spec.label][0]:
                    mean, se = _mean_and_se([result[metric] for result in per_spec[spec.label]])
                    row[metric], row[f"{metric}_se"] = mean, se
                row.update(oracle)
                rows.append(row)
                if spec.prior_key is not None:
                    prior_curves[(scenario, spec.label)] = _nanmean_over_seeds(curves[spec.label])
    per_seed = [theorem2(cfg, seed) for seed in cfg.seeds]
    groups = sum(t["groups"] for t in per_seed)
    pooled = {
        key: sum(t[key] * t["groups"] for t in per_seed) / groups for key in per_seed[0] if key != "groups"
    }
    pooled["groups"] = groups
    pooled["rel_err_ebpo_textbook"] = pooled["mse_ebpo_textbook"] / pooled["closed_form_ebpo"] - 1
    # Monte Carlo standard error of an MSE over n independent Gaussian errors: MSE * sqrt(2 / n)
    pooled["mc_rel_se"] = math.sqrt(2.0 / groups)
    return SimulateResult(rows, pooled, prior_curves, time.perf_counter() - start)
