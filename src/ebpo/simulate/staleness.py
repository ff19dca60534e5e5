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
from typing import Any

import numpy as np

from ebpo.simulate.config import StalenessSettings
from ebpo.simulate.streams import staleness_stream

__all__ = ["GROUP_MEAN", "METRICS", "STALENESS_OPTIONS", "run_staleness"]

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
