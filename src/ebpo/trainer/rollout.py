"""A step's rollouts: prompts drawn, G responses each sampled and scored, as groups (:class:`GroupCollector`),
held as one typed batch (:class:`RolloutBatch`).

Shapes: ``B`` rows (one sampled response each; a group's G responses are consecutive rows), ``P`` prompt
tokens (left-padded), ``T`` response tokens (right-padded).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from itertools import count
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ebpo.data.dynamic import DynamicSamplingConfig, Group, collect_groups
from ebpo.data.prompts import PromptFormat
from ebpo.data.records import Record
from ebpo.generation import Rollouts, sample
from ebpo.logprobs import LogProbs, Tokens
from ebpo.losses import overlong_penalty
from ebpo.trainer.config import TrainConfig


@dataclass(frozen=True)
class RolloutBatch:
    """Sampled responses with their rewards, ready for the log-prob passes and the update.

    Built per generation round from ``ebpo.generation.Rollouts`` (one group = G consecutive rows) and
    concatenated over the groups a step trains on (:meth:`concat`); :attr:`tokens` is what ``ebpo.logprobs``
    reads.
    """

    prompt_ids_BP: torch.Tensor
    """Prompt tokens (long), left-padded with the pad id."""
    prompt_mask_BP: torch.Tensor
    """1 on prompt tokens, 0 on the left padding (long)."""
    response_ids_BT: torch.Tensor
    """Sampled tokens (long), EOS included, right-padded with the pad id."""
    response_mask_BT: torch.Tensor
    """1 on the tokens trained on (long): every sampled token up to EOS, none of a row whose reward failed."""
    lengths_B: torch.Tensor
    """Sampled tokens per response, EOS included (long)."""
    truncated_B: torch.Tensor
    """True where no EOS came within ``rollout.max_new_tokens`` (bool)."""
    score_B: torch.Tensor
    """The task reward (float64); 0 where the reward failed."""
    reward_B: torch.Tensor
    """The training reward (float64): the score plus DAPO's overlong penalty when that is on."""
    valid_B: torch.Tensor
    """False where the reward function raised or returned a non-finite value (the row is masked out)."""
    sampler_logp_BT: torch.Tensor | None = None
    """The sampler's log-probs of the response tokens (float32, 0 on padding): ``rollout.old_logp=sampler``."""
    sampler_entropy_BT: torch.Tensor | None = None
    """The sampler's entropies at the response tokens (float32, 0 on padding), when it recorded them."""

    @staticmethod
    def from_rollouts(
        rollouts: Rollouts, score_B: torch.Tensor, reward_B: torch.Tensor, valid_B: torch.Tensor
    ) -> RolloutBatch:
        """One generation round's batch; the rows of failed samples get no tokens to train on."""
        return RolloutBatch(
            prompt_ids_BP=rollouts.prompt_ids,
            prompt_mask_BP=rollouts.prompt_mask,
            response_ids_BT=rollouts.response_ids,
            response_mask_BT=rollouts.response_mask * valid_B[:, None].long(),
            lengths_B=rollouts.lengths,
            truncated_B=rollouts.truncated,
            score_B=score_B,
            reward_B=reward_B,
            valid_B=valid_B,
            sampler_logp_BT=rollouts.old_logp,
            sampler_entropy_BT=rollouts.entropy,
        )

    @property
    def num_rows(self) -> int:
        return self.response_ids_BT.shape[0]

    def select(self, rows: torch.Tensor | slice) -> RolloutBatch:
        """The rows ``rows`` (indices or a slice) of every field."""
        return RolloutBatch(
            **{f.name: _rows(getattr(self, f.name), rows) for f in fields(self)}  # type: ignore[arg-type]
        )

    @property
    def tokens(self) -> Tokens:
        """The token rows the log-prob passes read (``ebpo.logprobs``)."""
        return Tokens(self.prompt_ids_BP, self.prompt_mask_BP, self.response_ids_BT, self.response_mask_BT)

    @property
    def sampled(self) -> LogProbs | None:
        """The sampler's log-probs and entropies, when it recorded them (``rollout.old_logp=sampler``)."""
        return (
            None if self.sampler_logp_BT is None else LogProbs(self.sampler_logp_BT, self.sampler_entropy_BT)
        )

    def metrics(self, *, shaped: bool) -> dict[str, float]:
        """``reward/mean`` (the task reward of the valid rows), ``reward/shaped_mean`` (the training reward,
        when ``shaped``), ``response_length/mean`` and ``response_length/clip_ratio`` (the truncated share)."""
        valid_B = self.valid_B
        metrics = {
            "reward/mean": float(self.score_B[valid_B].mean()) if bool(valid_B.any()) else 0.0,
            "response_length/mean": float(self.lengths_B.float().mean()),
            "response_length/clip_ratio": float(self.truncated_B.float().mean()),
        }
        if shaped:
            metrics["reward/shaped_mean"] = (
                float(self.reward_B[valid_B].mean()) if bool(valid_B.any()) else 0.0
            )
        return metrics

    @staticmethod
    def concat(batches: Sequence[RolloutBatch], pad_id: int) -> RolloutBatch:
        """Stack batches of different widths (dynamic sampling's rounds): prompts left-padded and responses
        right-padded to the widest, per-row fields concatenated."""
        width_P = max(b.prompt_ids_BP.shape[1] for b in batches)
        width_T = max(b.response_ids_BT.shape[1] for b in batches)

        def left(tensor_BP: torch.Tensor, value: int) -> torch.Tensor:
            return F.pad(tensor_BP, (width_P - tensor_BP.shape[1], 0), value=value)

        def right(tensor_BT: torch.Tensor, value: int) -> torch.Tensor:
            return F.pad(tensor_BT, (0, width_T - tensor_BT.shape[1]), value=value)

        def right_optional(name: str) -> torch.Tensor | None:  # None unless every batch holds the field
            parts = [getattr(b, name) for b in batches]
            return None if any(p is None for p in parts) else torch.cat([right(p, 0) for p in parts])

        return RolloutBatch(
            prompt_ids_BP=torch.cat([left(b.prompt_ids_BP, pad_id) for b in batches]),
            prompt_mask_BP=torch.cat([left(b.prompt_mask_BP, 0) for b in batches]),
            response_ids_BT=torch.cat([right(b.response_ids_BT, pad_id) for b in batches]),
            response_mask_BT=torch.cat([right(b.response_mask_BT, 0) for b in batches]),
            lengths_B=torch.cat([b.lengths_B for b in batches]),
            truncated_B=torch.cat([b.truncated_B for b in batches]),
            score_B=torch.cat([b.score_B for b in batches]),
            reward_B=torch.cat([b.reward_B for b in batches]),
            valid_B=torch.cat([b.valid_B for b in batches]),
            sampler_logp_BT=right_optional("sampler_logp_BT"),
            sampler_entropy_BT=right_optional("sampler_entropy_BT"),
        )


def _rows(tensor: torch.Tensor | None, rows: torch.Tensor | slice) -> torch.Tensor | None:
    return None if tensor is None else tensor[rows]


@dataclass(frozen=True)
class RewardFailure:
    """A sample whose reward function raised or returned a non-finite value."""

    index: int
    prompt: str
    completion: str
    message: str


def score_samples(
    reward_fn: Any, texts: Sequence[str], answers: Sequence[str], prompts: Sequence[str]
) -> tuple[torch.Tensor, torch.Tensor, list[RewardFailure]]:
    """Rewards ``(B,)`` float64 (0 where invalid), a validity mask ``(B,)`` bool, and the failures.

    The fast ``reward_fn.batch`` path is tried first; if it raises, every sample is scored alone to find the
    ones that fail. A non-finite reward counts as a failure too.
    """
    try:
        scores = list(reward_fn.batch(texts, answers))
    except Exception:  # noqa: BLE001 - locate the failing samples below
        scores = None
    failures: list[RewardFailure] = []
    if scores is None:
        scores = []
        for i, (text, answer) in enumerate(zip(texts, answers)):
            try:
                scores.append(float(reward_fn(text, answer)))
            except Exception as err:  # noqa: BLE001 - reported with the sample
                scores.append(math.nan)
                failures.append(RewardFailure(i, prompts[i], text, f"{type(err).__name__}: {err}"))
    rewards_B = torch.tensor([float(s) for s in scores], dtype=torch.float64)
    failed = {failure.index for failure in failures}
    for i in torch.nonzero(~torch.isfinite(rewards_B)).flatten().tolist():
        if i not in failed:
            failures.append(RewardFailure(i, prompts[i], texts[i], f"non-finite reward {scores[i]}"))
    valid_B = torch.isfinite(rewards_B)
    return torch.where(valid_B, rewards_B, torch.zeros_like(rewards_B)), valid_B, failures


def reward_counters(reward_fn: Any) -> dict[str, float]:
    """The reward's cumulative ``reward/...`` counters (``reward_fn.metrics()``, optional in the reward
    protocol of ``ebpo.rewards``); empty for a reward without them."""
    metrics = getattr(reward_fn, "metrics", None)
    return {name: float(value) for name, value in metrics().items()} if callable(metrics) else {}


class RewardFailed(Exception):
    """A generation round's samples whose reward failed (``algorithm.skip_reward_errors`` off)."""

    def __init__(self, failures: list[RewardFailure]) -> None:
        super().__init__(f"the reward failed on {len(failures)} sample(s)")
        self.failures = failures


class RewardError(RuntimeError):
    """A reward function raised on a sample; a checkpoint was written before this was raised."""

    @classmethod
    def stopped(
        cls, failures: list[RewardFailure], *, reward: str, step: int, checkpoint: Path, run_dir: Path
    ) -> RewardError:
        """The error that stops the run at ``step`` (1-based), naming the first failed sample, the checkpoint of
        the state before the step and the two ways on."""
        first = failures[0]
        more = f" ({len(failures) - 1} more sample(s) failed too)" if len(failures) > 1 else ""
        return cls(
            f"reward function {reward!r} raised on sample {first.index} of step {step}: {first.message}{more}\n"
            f"  prompt: {first.prompt!r}\n  completion: {first.completion!r}\nA checkpoint of the state before "
            f"this step is at {checkpoint}; fix the reward and continue with `ebpo train --resume {run_dir}`, or "
            "set algorithm.skip_reward_errors=true to mask such samples."
        )


def batch_advantages(
    estimator: Any, batch: RolloutBatch, groups: list[Group], group_size: int, *, clustered: bool
) -> torch.Tensor:
    """Step 4: the estimator's advantages ``(B,)`` float32 over the valid rows (a failed reward: advantage 0,
    and its row has no tokens); a row's group id is its prompt's position in the batch, never the record id;
    with ``clustered``, each row's cluster is its group's."""
    valid_rows = torch.nonzero(batch.valid_B).flatten()
    group_B = torch.arange(batch.num_rows) // group_size
    cluster = None
    if clustered:
        cluster_B = [g.cluster for g in groups for _ in range(group_size)]
        cluster = [cluster_B[i] for i in valid_rows.tolist()]
    adv_B = torch.zeros(batch.num_rows, dtype=torch.float32)
    rewards = batch.reward_B[valid_rows]
    adv_B[valid_rows] = estimator(rewards, group_B[valid_rows], cluster=cluster).float()
    return adv_B


@dataclass
class GroupCollector:
    """Steps 1-3 of a training step: prompts from the sampler, G = ``data.group_size`` responses each, scored
    (plus DAPO's overlong shaping when ``algorithm.overlong_shaping``), as one :class:`~ebpo.data.dynamic.Group`
    per prompt whose ``data`` is its :class:`RolloutBatch` and ``rewards`` the training rewards of its valid
    samples.

    Without dynamic sampling: one batch from the sampler. With it (DAPO, docs/design.md §3): groups whose
    rewards are all equal are dropped and more prompts drawn, at most ``1 + algorithm.max_gen_rounds`` rounds
    (``ebpo.data.dynamic.collect_groups``, which hands the dropped groups to ``estimator.observe`` so EBPO's
    prior still sees every sampled group); a shortfall trains on the groups there are.
    """

    cfg: TrainConfig
    model: Any
    tokenizer: Any
    prompt_format: PromptFormat
    """How a record becomes the prompt ids the model reads (``data.chat_template``)."""
    records: Sequence[Record]
    clusters: Sequence[Any] | None
    """Each record's cluster key (``data.cluster_key``), or None."""
    sampler: Any
    """An ``ebpo.data.samplers`` sampler: ``next_batch()`` gives record indices."""
    reward_fn: Any
    generator: torch.Generator
    """The run's seeded stream: the draws of the responses."""
    estimator: Any
    """Observes the groups dynamic sampling drops."""
    _uids: Iterator[int] = field(init=False, repr=False)
    """Group ids, unique across a step's rounds (``collect_groups`` checks): never record ids."""
    _failed: int = field(init=False, default=0)
    """Samples of the step whose reward failed."""

    def collect(self) -> tuple[list[Group], dict[str, float]]:
        """One step's groups and metrics (the reward's own ``reward/...`` counters over the step's samples,
        ``dynamic/...``, ``reward/errors``); raises :class:`RewardFailed` at the first round with a failed
        reward, unless ``algorithm.skip_reward_errors`` (its samples are then masked out and counted)."""
        a = self.cfg.algorithm
        counters_before = reward_counters(self.reward_fn)
        self._uids, self._failed = count(), 0
        if a.dynamic_sampling:
            dynamic = DynamicSamplingConfig(
                batch_size=self.cfg.data.batch_size, max_rounds=1 + a.max_gen_rounds, on_shortfall="train"
            )
            with warnings.catch_warnings():  # a shortfall is logged as dynamic/shortfall, not warned about
                warnings.simplefilter("ignore", RuntimeWarning)
                result = collect_groups(self.sampler.next_batch, self._round, dynamic, self.estimator)
            groups, metrics = result.groups, result.metrics
        else:
            groups, metrics = self._round(self.sampler.next_batch()), {}
        counters = {  # this step's samples only, not validation's
            name: value - counters_before.get(name, 0.0)
            for name, value in reward_counters(self.reward_fn).items()
        }
        return groups, {**counters, **metrics, "reward/errors": float(self._failed)}

    def _round(self, indices: list[int]) -> list[Group]:
        """One generation round: G responses to each record of ``indices``, scored, one group each."""
        a, r, G = self.cfg.algorithm, self.cfg.rollout, self.cfg.data.group_size
        records = [self.records[i] for i in indices]
        rollouts = sample(
            self.model,
            self.tokenizer,
            self.prompt_format.ids(records),
            n=G,
            temperature=r.temperature,
            top_p=r.top_p,
            max_new_tokens=r.max_new_tokens,
            generator=self.generator,
            with_entropy=r.old_logp == "sampler",
        )
        answers = [rec.answer for rec in records for _ in range(G)]
        prompts = [rec.prompt for rec in records for _ in range(G)]
        score_B, valid_B, failures = score_samples(self.reward_fn, rollouts.texts, answers, prompts)
        if failures and not a.skip_reward_errors:
            raise RewardFailed(failures)
        self._failed += len(failures)
        reward_B = score_B.clone()
        if a.overlong_shaping:  # DAPO soft overlong punishment, added to the task reward
            reward_B += overlong_penalty(rollouts.lengths, r.max_new_tokens, a.overlong_cache_len).double()
        batch = RolloutBatch.from_rollouts(rollouts, score_B, reward_B, valid_B)
        groups = []
        for m, index in enumerate(indices):
            rows = slice(m * G, (m + 1) * G)
            cluster = self.clusters[index] if self.clusters is not None else None
            rewards_G = reward_B[rows][valid_B[rows]]
            groups.append(
                Group(uid=next(self._uids), rewards=rewards_G, cluster=cluster, data=batch.select(rows))
            )
        return groups
