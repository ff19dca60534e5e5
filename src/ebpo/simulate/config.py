"""The settings of ``ebpo simulate``: :class:`SimulateConfig` (every field a flag) and, read from it,
:class:`StalenessSettings`, what the staleness study runs."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from typing import Literal

from ebpo.errors import ConfigError

__all__ = ["SimulateConfig", "StalenessSettings"]


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
            "staleness_lags non-empty, each >= 0": bool(self.staleness_lags)
            and all(lag >= 0 for lag in self.staleness_lags),
            "staleness_drifts non-empty, each finite": bool(self.staleness_drifts)
            and all(math.isfinite(drift) for drift in self.staleness_drifts),
            "staleness_memories non-empty, each 'all' or a half-life > 0": bool(self.staleness_memories)
            and all(_is_memory(memory) for memory in self.staleness_memories),
        }
        failed = [rule for rule, ok in checks.items() if not ok]
        if failed:
            named = [
                f.name for f in fields(self) if any(re.search(rf"\b{f.name}\b", rule) for rule in failed)
            ]
            got = ", ".join(f"{name}={getattr(self, name)!r}" for name in named)
            raise ConfigError(f"invalid simulate settings, need: {'; '.join(failed)} (got {got})")


def _is_memory(memory: str) -> bool:
    """Whether ``memory`` is a ``prior_memory`` EBPO takes (``all`` or a finite half-life > 0), by EBPO's own
    check of its options."""
    from ebpo.advantages.checks import OptionError
    from ebpo.advantages.ebpo import EBPOOptions

    try:
        EBPOOptions(prior_memory=memory)
    except OptionError:
        return False
    return True


@dataclass
class StalenessSettings:
    """What the staleness study runs (:meth:`from_config` reads it from :class:`SimulateConfig`; its own
    pool of ``pool_size`` prompts around ``mean_rate``)."""

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

    @classmethod
    def from_config(cls, cfg: SimulateConfig) -> StalenessSettings:
        """The ``staleness_*`` settings of ``cfg`` and the ones it shares with the estimators' study (seeds,
        steps, warm-up, M, G, concentration)."""
        return cls(
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
