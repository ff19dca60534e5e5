"""The synthetic RLVR streams of ``ebpo simulate``: :func:`make_stream` (K topics of prompts, shuffled or
topic-coherent, a stationary or improving policy) for the estimators' study, :func:`staleness_stream` (one
pool sampled by weights of older versions) for the staleness study."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ebpo.simulate.config import SimulateConfig, StalenessSettings

__all__ = ["ORDERS", "POLICIES", "Stream", "make_stream", "staleness_stream"]

ORDERS = ("shuffled", "topic")
POLICIES = ("stationary", "improving")


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
    """Draw one run's binary RLVR stream (the estimators' study: :mod:`ebpo.simulate.study`).

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


def staleness_stream(cfg: StalenessSettings, max_lag: int, drift: float, seed: int) -> dict[str, np.ndarray]:
    """One run's stream of the staleness study (its model: :mod:`ebpo.simulate.staleness`): ``rewards_SMG``,
    ``lag_SM``, ``p_sample_SM``, ``p_now_SM``, ``pool_now_S``."""
    rng = np.random.default_rng([seed, max_lag, int(round(drift * 1000))])
    S, M, G, P = cfg.steps, cfg.prompts_per_step, cfg.group_size, cfg.pool_size
    kappa, mu = cfg.concentration, cfg.mean_rate
    theta0_P = np.clip(rng.beta(kappa * mu, kappa * (1 - mu), size=P), 1e-4, 1 - 1e-4)
    logit0_P = _logit(theta0_P)
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
