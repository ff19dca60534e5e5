"""``ebpo simulate``: a Monte Carlo study of the advantage estimators on a synthetic RLVR stream.

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

import argparse
import csv
import io
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ebpo.persist import write_bytes_atomic, write_text_atomic

ZERO_ADV_TOL = 1e-6
"""|A| below this counts as a zero advantage (advantages come back as float32)."""

ORDERS = ("shuffled", "topic")
POLICIES = ("stationary", "improving")


@dataclass
class SimulateConfig:
    """Settings of ``ebpo simulate``; every field is a flag (``--group-size``, ...)."""

    group_size: int = field(default=4, metadata={"help": "G, responses per prompt", "aliases": ["-G"]})
    num_topics: int = field(
        default=4,
        metadata={
            "help": "K, topics of distinct mean difficulty, with mean success rates evenly spaced in "
            "[topic_mean_low, topic_mean_high]",
            "aliases": ["-K"],
        },
    )
    prompts_per_step: int = field(
        default=32, metadata={"help": "M, prompts (groups) per step", "aliases": ["-M"]}
    )
    steps: int = field(default=150, metadata={"help": "steps per run"})
    seeds: list[int] = field(
        default_factory=lambda: [0, 1],
        metadata={
            "help": "one run per seed; tables average over them (and give the standard error across them)"
        },
    )
    warmup: int = field(default=20, metadata={"help": "steps left out of the averages while priors fill"})
    topic_mean_low: float = field(
        default=0.1, metadata={"help": "mean latent success rate of the hardest topic"}
    )
    topic_mean_high: float = field(
        default=0.8, metadata={"help": "mean latent success rate of the easiest topic"}
    )
    concentration: float = field(
        default=6.0,
        metadata={"help": "kappa of the within-topic Beta(kappa mu_k, kappa (1 - mu_k)) of latent rates"},
    )
    pool_size: int = field(
        default=256, metadata={"help": "prompts per topic; a step samples its prompts from these pools"}
    )
    topic_block: int = field(
        default=15, metadata={"help": "topic-coherent stream: consecutive steps drawn from one topic"}
    )
    drift: float = field(
        default=2.0,
        metadata={"help": "improving policy: rise of every latent logit from the first to the last step"},
    )
    half_life: float = field(
        default=10.0,
        metadata={"help": "half-life in steps of the EBPO variants with prior_memory = half-life"},
    )
    theorem2_steps: int = field(
        default=300, metadata={"help": "steps of the Gaussian Theorem 2 run (M prompts each)"}
    )
    theorem2_mu: float = field(default=0.5, metadata={"help": "Theorem 2: prior mean of the latent rates"})
    theorem2_tau2: float = field(
        default=0.01, metadata={"help": "Theorem 2: variance of the latent rates (between prompts)"}
    )
    theorem2_sigma2: float = field(
        default=0.04,
        metadata={"help": "Theorem 2: variance of a reward around its prompt's latent rate (within a group)"},
    )
    study: Literal["estimators", "staleness"] = field(
        default="estimators",
        metadata={
            "help": "`estimators`: Theorem 2 and the estimators on the RLVR streams; `staleness`: EBPO's "
            "prior_staleness options on groups sampled by older weights (docs/theory.md, section 6)"
        },
    )
    staleness_lags: list[int] = field(
        default_factory=lambda: [0, 2, 4, 8, 16],
        metadata={"help": "staleness study: the L_max of each lag distribution Uniform{0..L_max}"},
    )
    staleness_drifts: list[float] = field(
        default_factory=lambda: [2.0, 8.0],
        metadata={
            "help": "staleness study: rise of every latent logit over the run (per version: / (steps - 1))"
        },
    )
    staleness_memories: list[str] = field(
        default_factory=lambda: ["all", "10"],
        metadata={"help": "staleness study: the prior_memory settings each option runs with"},
    )
    out_dir: str = field(
        default="runs/simulate", metadata={"help": "output folder for simulate.csv and simulate.png"}
    )

    def __post_init__(self) -> None:
        checks = {
            "group_size >= 2": self.group_size >= 2,
            "num_topics >= 1": self.num_topics >= 1,
            "prompts_per_step >= 2": self.prompts_per_step >= 2,
            "steps > warmup >= 0": self.steps > self.warmup >= 0,
            "seeds non-empty": len(self.seeds) > 0,
            "0 < topic_mean_low <= topic_mean_high < 1": 0 < self.topic_mean_low <= self.topic_mean_high < 1,
            "concentration > 0": self.concentration > 0,
            "pool_size >= prompts_per_step": self.pool_size >= self.prompts_per_step,
            "topic_block >= 1": self.topic_block >= 1,
            "half_life > 0": self.half_life > 0,
            "theorem2_steps > warmup": self.theorem2_steps > self.warmup,
            "theorem2_tau2 > 0 and theorem2_sigma2 > 0": self.theorem2_tau2 > 0 and self.theorem2_sigma2 > 0,
        }
        failed = [rule for rule, ok in checks.items() if not ok]
        if failed:
            raise ValueError(f"invalid simulate settings, need: {'; '.join(failed)} (got {self})")


# --------------------------------------------------------------------------------------------------
# the synthetic stream


@dataclass
class Stream:
    """A whole run's data; arrays indexed (step, prompt[, response]).

    ``theta_SM``: latent success rate of each drawn prompt; ``topic_SM``: its topic;
    ``rewards_SMG``: the G rewards; ``oracle_topic_mean_SM`` / ``oracle_global_mean_SM``: the current mean
    latent rate of the prompt's topic pool / of all pools (the idealised priors of the paper's clustering
    proposition).
    """

    theta_SM: np.ndarray
    topic_SM: np.ndarray
    rewards_SMG: np.ndarray
    oracle_topic_mean_SM: np.ndarray
    oracle_global_mean_SM: np.ndarray


def _logit(p: np.ndarray) -> np.ndarray:
    return np.log(p) - np.log1p(-p)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def make_stream(cfg: SimulateConfig, order: str, policy: str, seed: int) -> Stream:
    """Draw one run's binary RLVR stream (see the module docstring).

    Prompt pools: topic k's latent rates theta0 ~ Beta(kappa mu_k, kappa (1 - mu_k)), clipped to
    [1e-4, 1 - 1e-4]. At step t the rate is sigmoid(logit(theta0) + drift t / (steps - 1)) for an improving
    policy, theta0 for a stationary one. Rewards are Bernoulli(theta).
    """
    if order not in ORDERS or policy not in POLICIES:
        raise ValueError(
            f"order must be one of {ORDERS} and policy one of {POLICIES}, got {order!r}, {policy!r}"
        )
    rng = np.random.default_rng(seed)
    K, P, S, M, G = cfg.num_topics, cfg.pool_size, cfg.steps, cfg.prompts_per_step, cfg.group_size
    topic_mean_K = np.linspace(cfg.topic_mean_low, cfg.topic_mean_high, K)
    kappa = cfg.concentration
    theta0_KP = rng.beta(kappa * topic_mean_K[:, None], kappa * (1 - topic_mean_K[:, None]), size=(K, P))
    theta0_KP = np.clip(theta0_KP, 1e-4, 1 - 1e-4)
    drift_S = (cfg.drift * np.arange(S) / max(S - 1, 1)) if policy == "improving" else np.zeros(S)
    theta_SKP = _sigmoid(_logit(theta0_KP)[None] + drift_S[:, None, None])

    if order == "shuffled":
        topic_SM = rng.integers(0, K, size=(S, M))
        prompt_SM = rng.integers(0, P, size=(S, M))
    else:
        topic_order = np.concatenate([rng.permutation(K) for _ in range(S // (cfg.topic_block * K) + 1)])
        topic_S = topic_order[np.arange(S) // cfg.topic_block]
        topic_SM = np.repeat(topic_S[:, None], M, axis=1)
        prompt_SM = np.stack([rng.choice(P, size=M, replace=False) for _ in range(S)])
    step_SM = np.repeat(np.arange(S)[:, None], M, axis=1)
    theta_SM = theta_SKP[step_SM, topic_SM, prompt_SM]
    rewards_SMG = (rng.random((S, M, G)) < theta_SM[..., None]).astype(np.float64)
    topic_mean_SK = theta_SKP.mean(axis=2)
    return Stream(
        theta_SM=theta_SM,
        topic_SM=topic_SM,
        rewards_SMG=rewards_SMG,
        oracle_topic_mean_SM=topic_mean_SK[step_SM, topic_SM],
        oracle_global_mean_SM=np.repeat(topic_mean_SK.mean(axis=1)[:, None], M, axis=1),
    )


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


# --------------------------------------------------------------------------------------------------
# output


def _fmt(value: float, se: float | None = None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    text = f"{value:.4f}"
    if se is not None and not math.isnan(se):
        text += f" ± {se:.4f}"
    return text


def format_tables(result: SimulateResult) -> str:
    """Markdown tables: Theorem 2, then one estimator table per scenario."""
    t2 = result.theorem2
    lines = [
        "## Theorem 2 (Gaussian model)",
        "",
        "| baseline | measured MSE | closed form |",
        "|---|---|---|",
        f"| GRPO group mean | {t2['mse_grpo']:.6f} | sigma2/G = {t2['closed_form_grpo']:.6f} |",
        f"| EBPO, pooled sigma2 + latent tau2 | {t2['mse_ebpo_textbook']:.6f} | "
        f"(1-S) sigma2/G = {t2['closed_form_ebpo']:.6f} (S = {t2['shrinkage_true']:.4f}) |",
        f"| EBPO, paper defaults (total sigma2, raw tau2) | {t2['mse_ebpo_paper']:.6f} | "
        f"(1-w)^2 sigma2/G + w^2 tau2 = {t2['closed_form_ebpo_paper']:.6f} (w = {t2['paper_weight_w']:.4f}) |",
        "",
        f"EBPO (textbook prior) vs closed form: relative error {t2['rel_err_ebpo_textbook']:+.4f} "
        f"(Monte Carlo standard error about {t2['mc_rel_se']:.4f}, {int(t2['groups'])} groups).",
        "",
    ]
    scenarios = list(dict.fromkeys(row["scenario"] for row in result.rows))
    for scenario in scenarios:
        rows = [row for row in result.rows if row["scenario"] == scenario]
        first = rows[0]
        lines += [
            f"## Stream {scenario}",
            "",
            f"all-fail groups: {first['all_fail_group_frac']:.3f}; proposition's ideal prior MSE: "
            f"shuffle (oracle global mean) {first['oracle_global_prior_mse']:.4f}, "
            f"coherent (oracle topic mean) {first['oracle_topic_prior_mse']:.4f}",
            "",
            "| estimator | baseline MSE | prior MSE | mean S | zero-adv frac | all-fail mean abs A | "
            "all-fail mean abs raw a |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in rows:
            lines.append(
                f"| {row['estimator']} | {_fmt(row['baseline_mse'], row['baseline_mse_se'])} | "
                f"{_fmt(row['prior_mse'], row['prior_mse_se'])} | {_fmt(row['shrinkage'])} | "
                f"{_fmt(row['zero_adv_frac'])} | {_fmt(row['all_fail_abs_adv'])} | "
                f"{_fmt(row['all_fail_abs_raw_adv'])} |"
            )
        lines.append("")
    lines.append(f"({result.seconds:.1f} s)")
    return "\n".join(lines)


def write_csv(result: SimulateResult, path: Path) -> None:
    """One row per (scenario, estimator) (``study=stream``) plus one ``study=theorem2`` row per figure."""
    stream_fields = list(result.rows[0])
    fieldnames = [*stream_fields, "quantity", "value"]
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=fieldnames)
    writer.writeheader()
    for row in result.rows:
        writer.writerow(row)
    for quantity, value in result.theorem2.items():
        writer.writerow({"study": "theorem2", "quantity": quantity, "value": value})
    write_text_atomic(path, text.getvalue())


def write_plot(result: SimulateResult, path: Path) -> None:
    """Three panels: baseline MSE per estimator and scenario; EBPO prior MSE per variant against the
    proposition's ideal values; per-step prior MSE on the topic-coherent stationary stream."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(row["scenario"] for row in result.rows))
    estimators = list(dict.fromkeys(row["estimator"] for row in result.rows))
    ebpo_variants = [label for label in estimators if label.startswith("ebpo")]
    value = {(row["scenario"], row["estimator"]): row for row in result.rows}
    fig, axes = plt.subplots(1, 3, figsize=(19, 5.5))
    width = 0.8 / len(estimators)
    x = np.arange(len(scenarios))
    for i, label in enumerate(estimators):
        axes[0].bar(x + i * width, [value[(s, label)]["baseline_mse"] for s in scenarios], width, label=label)
    axes[0].set_xticks(x + 0.4 - width / 2, scenarios, fontsize=8)
    axes[0].set_ylabel("baseline MSE vs latent rate")
    axes[0].set_title("Baseline MSE (lower is better)")
    axes[0].legend(fontsize=7)

    width = 0.8 / (len(ebpo_variants) + 2)
    for i, label in enumerate(ebpo_variants):
        axes[1].bar(x + i * width, [value[(s, label)]["prior_mse"] for s in scenarios], width, label=label)
    for j, (key, name) in enumerate(
        [
            ("oracle_global_prior_mse", "ideal shuffle (global mean)"),
            ("oracle_topic_prior_mse", "ideal coherent"),
        ]
    ):
        offset = (len(ebpo_variants) + j) * width
        axes[1].bar(
            x + offset, [value[(s, estimators[0])][key] for s in scenarios], width, label=name, hatch="//"
        )
    axes[1].set_xticks(x + 0.4 - width / 2, scenarios, fontsize=8)
    axes[1].set_ylabel("prior MSE vs latent rate")
    axes[1].set_title("EBPO prior MSE (the clustering proposition)")
    axes[1].legend(fontsize=7)

    scenario = "topic/stationary"
    for label in ebpo_variants:
        curve = result.prior_curves.get((scenario, label))
        if curve:
            axes[2].plot(np.arange(len(curve)), curve, label=label, linewidth=1)
    axes[2].axhline(value[(scenario, estimators[0])]["oracle_topic_prior_mse"], color="k", ls="--", lw=1)
    axes[2].set_xlabel("step after warm-up")
    axes[2].set_ylabel("prior MSE")
    axes[2].set_title(f"Prior MSE per step, {scenario} (dashed: ideal coherent)")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, dpi=110, format="png")
    write_bytes_atomic(path, image.getvalue())
    plt.close(fig)


# --------------------------------------------------------------------------------------------------
# CLI


DESCRIPTION = (
    "Reproduce Theorem 2 (EBPO's baseline MSE equals (1-S) sigma2/G under the Gaussian model) and compare the "
    "estimators (baseline MSE against the latent success rate, zero-advantage fraction, advantage in all-fail "
    "groups) and EBPO's prior scopes and memories on shuffled vs topic-coherent, stationary vs improving "
    "streams. Prints tables; writes simulate.csv and simulate.png to --out-dir."
)


def _run_staleness(cfg: SimulateConfig) -> int:
    """``--study staleness``: run it, print its tables, write ``staleness.csv``."""
    from ebpo.simulate_staleness import StalenessSettings, format_staleness, run_staleness

    start = time.perf_counter()
    settings = StalenessSettings(
        lags=list(cfg.staleness_lags),
        drifts=list(cfg.staleness_drifts),
        memories=[str(memory) for memory in cfg.staleness_memories],
        seeds=list(cfg.seeds),
        steps=cfg.steps,
        warmup=cfg.warmup,
        prompts_per_step=cfg.prompts_per_step,
        group_size=cfg.group_size,
        concentration=cfg.concentration,
    )
    rows = run_staleness(settings)
    print(format_staleness(rows))
    print(f"({time.perf_counter() - start:.1f} s)")
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(out_dir / "staleness.csv", text.getvalue())
    print(f"wrote {out_dir / 'staleness.csv'}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add ``ebpo simulate`` to the CLI: one flag per :class:`SimulateConfig` field."""
    from ebpo.dataclass_cli import add_command, dataclass_parser

    add_command(
        subparsers,
        "simulate",
        help="Monte Carlo study of the advantage estimators on a synthetic RLVR stream",
        parser=lambda prog: dataclass_parser(prog, DESCRIPTION, [SimulateConfig]),
        run=run,
    )


def run(args: argparse.Namespace) -> int:
    """Entry point of ``ebpo simulate``: run, print the tables, write CSV and PNG, print their folder."""
    from ebpo.dataclass_cli import from_args

    cfg = from_args(SimulateConfig, args)
    if cfg.study == "staleness":
        return _run_staleness(cfg)
    result = simulate(cfg)
    print(format_tables(result))
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(result, out_dir / "simulate.csv")
    write_plot(result, out_dir / "simulate.png")
    print(f"wrote {out_dir / 'simulate.csv'} and {out_dir / 'simulate.png'}")
    print(f"output: {out_dir.resolve()}")
    return 0


__all__ = [
    "EstimatorSpec",
    "SimulateConfig",
    "SimulateResult",
    "Stream",
    "add_parser",
    "estimator_specs",
    "format_tables",
    "make_stream",
    "oracle_prior_mse",
    "recover_prior",
    "run",
    "run_estimator",
    "simulate",
    "theorem2",
    "write_csv",
    "write_plot",
]
