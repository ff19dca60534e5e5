"""``ebpo simulate --study staleness``: how EBPO's ``prior_staleness`` options treat groups sampled by old weights.

The model of verl's asynchronous modes (docs/theory.md, section 6, where the study is pre-registered): one
pool of prompts whose latent success rate rises with the weight version, p_m(v) = sigmoid(logit theta0_m +
rate v); at step t (the trainer's version) each of M groups is sampled by the weights of version t - L with a
lag L ~ Uniform{0, ..., L_max} (at most t), and the estimator gets L as ``lag=``. For each option and lag
distribution, over the measured steps:

- ``bias_now`` = mean(mu_glob - p̄_now), p̄_now the pool's mean rate under the current weights;
- ``bias_sample`` = mean(mu_glob - p̄_sample), p̄_sample the batch's mean sampling rate;
- ``rmse_now`` / ``rmse_sample``: RMSE of the baseline V_m (``normalize="none"``: V = r - a) against p_m(t) /
  p_m(t - L_m); GRPO's group mean beside them (``grpo (group mean)``).

Every option sees the same stream (seeded by seed, L_max and drift): the comparison is paired.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["STALENESS_OPTIONS", "StalenessSettings", "format_staleness", "run_staleness", "staleness_stream"]

STALENESS_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("all", {}),
    ("max_lag 2", {"prior_staleness": "max_lag", "staleness_max_lag": 2}),
    ("max_lag 4", {"prior_staleness": "max_lag", "staleness_max_lag": 4}),
    ("decay 2", {"prior_staleness": "decay", "staleness_half_life": 2.0}),
    ("decay 4", {"prior_staleness": "decay", "staleness_half_life": 4.0}),
]
"""The study's ``prior_staleness`` settings (label, options)."""

GROUP_MEAN = "grpo (group mean)"
METRICS = ("bias_now", "bias_sample", "rmse_now", "rmse_sample")


@dataclass
class StalenessSettings:
    """What the study runs (read from ``SimulateConfig``)."""

    lags: list[int]
    drifts: list[float]
    memories: list[str]
    seeds: list[int]
    steps: int = 150
    warmup: int = 20
    prompts_per_step: int = 32
    group_size: int = 4
    pool_size: int = 1024
    mean_rate: float = 0.35
    concentration: float = 6.0


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def staleness_stream(cfg: StalenessSettings, max_lag: int, drift: float, seed: int) -> dict[str, np.ndarray]:
    """One run's stream: ``rewards_SMG``, ``lag_SM``, ``p_sample_SM``, ``p_now_SM``, ``pool_now_S``."""
    rng = np.random.default_rng([seed, max_lag, int(round(drift * 1000))])
    S, M, G, P = cfg.steps, cfg.prompts_per_step, cfg.group_size, cfg.pool_size
    kappa, mu = cfg.concentration, cfg.mean_rate
    theta0_P = np.clip(rng.beta(kappa * mu, kappa * (1 - mu), size=P), 1e-4, 1 - 1e-4)
    logit0_P = np.log(theta0_P) - np.log1p(-theta0_P)
    rate = drift / max(S - 1, 1)  # logits per weight version
    step_S = np.arange(S)
    prompt_SM = rng.integers(0, P, size=(S, M))
    lag_SM = np.minimum(rng.integers(0, max_lag + 1, size=(S, M)), step_S[:, None])
    p_sample_SM = _sigmoid(logit0_P[prompt_SM] + rate * (step_S[:, None] - lag_SM))
    p_now_SM = _sigmoid(logit0_P[prompt_SM] + rate * step_S[:, None])
    pool_now_S = _sigmoid(logit0_P[None, :] + rate * step_S[:, None]).mean(axis=1)
    rewards_SMG = (rng.random((S, M, G)) < p_sample_SM[..., None]).astype(np.float64)
    return {
        "rewards_SMG": rewards_SMG,
        "lag_SM": lag_SM,
        "p_sample_SM": p_sample_SM,
        "p_now_SM": p_now_SM,
        "pool_now_S": pool_now_S,
    }


def _run_one(stream: dict[str, np.ndarray], options: dict[str, Any] | None, warmup: int) -> dict[str, float]:
    """The four measures of one estimator (None: GRPO's group mean, which has no prior) on one stream."""
    import torch

    from ebpo import get_estimator

    rewards_SMG = stream["rewards_SMG"]
    S, M, G = rewards_SMG.shape
    index_N = np.repeat(np.arange(M), G)
    from ebpo.advantages.ebpo import EBPOEstimator

    est = None if options is None else get_estimator("ebpo", normalize="none", **options)
    assert est is None or isinstance(est, EBPOEstimator)  # takes lag=
    sums = dict.fromkeys(("bias_now", "bias_sample", "sq_now", "sq_sample"), 0.0)
    steps = groups = 0
    for step in range(S):
        rewards_N = torch.from_numpy(rewards_SMG[step].reshape(-1))
        mean_M = rewards_SMG[step].mean(axis=1)
        if est is None:
            baseline_M, mu = mean_M, math.nan
        else:
            adv_N = est(rewards_N, index_N, lag=np.repeat(stream["lag_SM"][step], G)).double().numpy()
            baseline_M = (rewards_N.numpy() - adv_N)[::G]  # V_m = r - a, shared by a group's samples
            mu = est.metrics()["ebpo/mu_glob"]
        if step < warmup:
            continue
        steps += 1
        groups += M
        sums["bias_now"] += mu - float(stream["pool_now_S"][step])
        sums["bias_sample"] += mu - float(stream["p_sample_SM"][step].mean())
        sums["sq_now"] += float(np.sum((baseline_M - stream["p_now_SM"][step]) ** 2))
        sums["sq_sample"] += float(np.sum((baseline_M - stream["p_sample_SM"][step]) ** 2))
    return {
        "bias_now": sums["bias_now"] / steps,
        "bias_sample": sums["bias_sample"] / steps,
        "rmse_now": math.sqrt(sums["sq_now"] / groups),
        "rmse_sample": math.sqrt(sums["sq_sample"] / groups),
    }


def run_staleness(cfg: StalenessSettings) -> list[dict[str, Any]]:
    """One row per (drift, prior_memory, option, L_max): each measure's mean over seeds and its ``_se``."""
    rows = []
    for drift in cfg.drifts:
        for memory in cfg.memories:
            variants: list[tuple[str, dict[str, Any] | None]] = [
                (label, {**options, "prior_memory": memory}) for label, options in STALENESS_OPTIONS
            ]
            if memory == cfg.memories[0]:
                variants.append((GROUP_MEAN, None))
            for max_lag in cfg.lags:
                streams = [staleness_stream(cfg, max_lag, drift, seed) for seed in cfg.seeds]
                for label, options in variants:
                    results = [_run_one(stream, options, cfg.warmup) for stream in streams]
                    row: dict[str, Any] = {
                        "drift": drift,
                        "prior_memory": "-" if options is None else memory,
                        "option": label,
                        "max_lag": max_lag,
                    }
                    for metric in METRICS:
                        values = np.array([result[metric] for result in results])
                        row[metric] = float(values.mean())
                        row[f"{metric}_se"] = (
                            float(values.std(ddof=1) / math.sqrt(len(values)))
                            if len(values) > 1
                            else math.nan
                        )
                    rows.append(row)
    return rows


def format_staleness(rows: list[dict[str, Any]]) -> str:
    """Markdown: per drift and memory, baseline RMSE vs the current rate and the prior's bias, by L_max."""
    lags = sorted({row["max_lag"] for row in rows})
    lines = []
    for drift in dict.fromkeys(row["drift"] for row in rows):
        for memory in dict.fromkeys(row["prior_memory"] for row in rows if row["prior_memory"] != "-"):
            lines += [
                f"## drift {drift:g} logits over the run, prior_memory={memory}",
                "",
                "cells: baseline RMSE vs current rate (vs sampling rate); prior bias vs current (vs sampling)",
                "",
                "| option | " + " | ".join(f"L_max = {lag}" for lag in lags) + " |",
                "|---|" + "---|" * len(lags),
            ]
            labels = [label for label, _ in STALENESS_OPTIONS] + [GROUP_MEAN]
            for label in labels:
                cells = []
                for lag in lags:
                    match = [
                        row
                        for row in rows
                        if row["drift"] == drift
                        and row["max_lag"] == lag
                        and row["option"] == label
                        and row["prior_memory"] in (memory, "-")
                    ]
                    if not match:
                        continue
                    row = match[0]
                    bias = (
                        "" if label == GROUP_MEAN else f"; {row['bias_now']:+.4f} ({row['bias_sample']:+.4f})"
                    )
                    cells.append(f"{row['rmse_now']:.4f} ({row['rmse_sample']:.4f}){bias}")
                if cells:
                    lines.append(f"| {label} | " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines)
