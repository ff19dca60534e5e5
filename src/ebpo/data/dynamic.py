"""DAPO dynamic sampling (docs/design.md §3; Yu et al. 2025, "DAPO", section 3.2).

A group whose rewards are all equal (all pass or all fail) has zero GRPO advantage and gives no gradient.
DAPO drops such groups and samples more prompts until the batch holds ``batch_size`` informative groups,
with a bounded number of generation rounds. :func:`collect_groups` is that loop as pure logic: the caller
gives a prompt source (e.g. ``sampler.next_batch``) and a callable that generates and scores one round of
groups; nothing here knows about models.

EBPO's prior must see every sampled group exactly once. The trainer calls ``est(...)`` on the groups it
trains on, so :func:`collect_groups` calls ``estimator.observe(rewards, index, cluster)`` (docs/design.md),
once, on every other sampled group: the dropped all-equal groups, and informative groups beyond
``batch_size`` that the batch has no room for. Sampled = returned + observed, disjointly.

When ``max_rounds`` rounds do not yield ``batch_size`` informative groups, ``on_shortfall`` decides:

- ``"train"`` (default): return the informative groups there are (fewer than ``batch_size``) and warn;
- ``"fill"``: top the batch up with dropped all-equal groups, in sampling order (they are then returned, so
  not observed);
- ``"error"``: raise ``RuntimeError``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import torch

__all__ = ["Group", "DynamicSamplingConfig", "DynamicResult", "collect_groups", "is_informative"]


@dataclass
class Group:
    """One prompt's sampled responses, scored.

    Attributes:
        uid: group id passed as ``index`` to the estimator; unique among all groups of one collection
            (a prompt drawn twice needs two uids, e.g. ``f"{record.id}/{round}"``).
        rewards: the G sequence rewards.
        cluster: the group's cluster key (topic or difficulty bucket) or ``None``.
        data: whatever the trainer needs later (rollouts, token ids); passed through untouched.
    """

    uid: Hashable
    rewards: Sequence[float] | torch.Tensor
    cluster: Hashable | None = None
    data: Any = None


class _Observer(Protocol):
    def observe(
        self, rewards: torch.Tensor, index: Sequence[Hashable], cluster: Sequence[Hashable] | None = None
    ) -> None: ...


@dataclass
class DynamicSamplingConfig:
    """Settings of DAPO dynamic sampling.

    Attributes:
        batch_size: informative groups the training batch should hold.
        max_rounds: generation rounds at most (DAPO / verl ``max_num_gen_batches``); >= 1.
        on_shortfall: ``"train"`` (use what is there, warn), ``"fill"`` (top up with all-equal groups) or
            ``"error"``, when ``max_rounds`` rounds fall short.
    """

    batch_size: int
    max_rounds: int = 10
    on_shortfall: str = "train"

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"dynamic sampling: batch_size must be >= 1, got {self.batch_size}")
        if self.max_rounds < 1:
            raise ValueError(f"dynamic sampling: max_rounds must be >= 1, got {self.max_rounds}")
        if self.on_shortfall not in _SHORTFALL:
            raise ValueError(
                f"dynamic sampling: on_shortfall must be one of {sorted(_SHORTFALL)}, got {self.on_shortfall!r}"
            )


@dataclass
class DynamicResult:
    """Groups to train on and the loop's metrics.

    Attributes:
        groups: at most ``batch_size`` groups (exactly that many unless rounds ran out with ``"train"``).
        observed: the groups passed to ``estimator.observe`` (dropped and surplus ones).
        metrics: ``dynamic/rounds`` (generation rounds run), ``dynamic/kept_frac`` (informative groups /
            sampled groups), ``dynamic/dropped`` (all-equal groups sampled), ``dynamic/filled`` (all-equal
            groups put back by ``"fill"``), ``dynamic/shortfall`` (``batch_size`` minus groups returned).
    """

    groups: list[Group]
    observed: list[Group] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


def is_informative(rewards: Sequence[float] | torch.Tensor) -> bool:
    """True unless all rewards are equal (DAPO's filter: ``0 < #correct < G`` for binary rewards).

    Exact equality: a group of one is never informative; shaped rewards that differ at all are kept.
    """
    rewards_G = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)
    return bool(rewards_G.numel() > 1 and (rewards_G.max() > rewards_G.min()).item())


def _shortfall_train(kept: list[Group], dropped: list[Group], cfg: DynamicSamplingConfig) -> list[Group]:
    warnings.warn(
        f"dynamic sampling: {len(kept)} of {cfg.batch_size} informative groups after {cfg.max_rounds} "
        "rounds; training on the smaller batch (raise max_rounds, or on_shortfall='fill')",
        RuntimeWarning,
        stacklevel=3,
    )
    return kept


def _shortfall_fill(kept: list[Group], dropped: list[Group], cfg: DynamicSamplingConfig) -> list[Group]:
    return kept + dropped[: cfg.batch_size - len(kept)]


def _shortfall_error(kept: list[Group], dropped: list[Group], cfg: DynamicSamplingConfig) -> list[Group]:
    raise RuntimeError(
        f"dynamic sampling: only {len(kept)} of {cfg.batch_size} informative groups after "
        f"{cfg.max_rounds} rounds; raise max_rounds or set on_shortfall to 'train' or 'fill'"
    )


_SHORTFALL: dict[str, Callable[[list[Group], list[Group], DynamicSamplingConfig], list[Group]]] = {
    "train": _shortfall_train,
    "fill": _shortfall_fill,
    "error": _shortfall_error,
}


def _observe(estimator: _Observer, groups: list[Group]) -> None:
    """One ``estimator.observe`` call over the concatenated groups (rewards flattened, uid per reward)."""
    rewards = [torch.as_tensor(g.rewards, dtype=torch.float32).reshape(-1) for g in groups]
    rewards_N = torch.cat(rewards)
    index_N = [g.uid for g, r in zip(groups, rewards) for _ in range(r.numel())]
    has_cluster = any(g.cluster is not None for g in groups)
    cluster_N = (
        [g.cluster for g, r in zip(groups, rewards) for _ in range(r.numel())] if has_cluster else None
    )
    estimator.observe(rewards_N, index_N, cluster_N)


# whatever next_prompts returns and generate takes (the trainer: a list of record indices)
PromptsT = TypeVar("PromptsT")


def collect_groups(
    next_prompts: Callable[[], PromptsT],
    generate: Callable[[PromptsT], Sequence[Group]],
    cfg: DynamicSamplingConfig,
    estimator: _Observer | None = None,
) -> DynamicResult:
    """Sample rounds until ``cfg.batch_size`` informative groups are kept or ``cfg.max_rounds`` is reached.

    Each round: ``prompts = next_prompts()``; ``groups = generate(prompts)``; groups with all rewards equal
    are dropped (:func:`is_informative`). Informative groups are kept in sampling order; the first
    ``batch_size`` of them are returned, the surplus and the dropped groups go to ``estimator.observe``
    (one call, after the last round, before the trainer's ``est(...)`` on the returned groups).

    Raises ``ValueError`` if two sampled groups share a uid (the prior would merge them).
    """
    kept: list[Group] = []
    dropped: list[Group] = []
    seen: set[Hashable] = set()
    sampled = rounds = 0
    while len(kept) < cfg.batch_size and rounds < cfg.max_rounds:
        rounds += 1
        for group in generate(next_prompts()):
            if group.uid in seen:
                raise ValueError(
                    f"dynamic sampling: group uid {group.uid!r} was sampled twice (round {rounds}); make "
                    "uids unique per round, e.g. f'{record.id}/{round}'"
                )
            seen.add(group.uid)
            sampled += 1
            (kept if is_informative(group.rewards) else dropped).append(group)
    surplus = kept[cfg.batch_size :]
    kept = kept[: cfg.batch_size]
    num_informative = len(kept) + len(surplus)
    if len(kept) < cfg.batch_size:
        returned = _SHORTFALL[cfg.on_shortfall](kept, dropped, cfg)
    else:
        returned = kept
    returned_ids = {id(g) for g in returned}
    observed = [g for g in dropped if id(g) not in returned_ids] + surplus
    if estimator is not None and observed:
        _observe(estimator, observed)
    metrics = {
        "dynamic/rounds": float(rounds),
        "dynamic/kept_frac": num_informative / sampled if sampled else 0.0,
        "dynamic/dropped": float(len(dropped)),
        "dynamic/filled": float(len(returned) - len(kept)),
        "dynamic/shortfall": float(cfg.batch_size - len(returned)),
    }
    return DynamicResult(groups=list(returned), observed=observed, metrics=metrics)
