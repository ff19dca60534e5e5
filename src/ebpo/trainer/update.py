"""Step 5's updates (``ebpo.trainer.trainer``): K = ``optim.epochs`` passes over a step's batch in shuffled
mini-batches (:func:`minibatches`), each one optimizer step (:func:`update`): the policy loss and its aggregation
(``ebpo.losses``) plus ``kl_coef * agg(kl(logp, ref_logp))``, accumulated over micro-batches, the gradient clipped,
AdamW. Every log-prob comes from ``ebpo.logprobs.logprobs``.

Shapes: ``B`` rows of the batch (one response each), ``T`` response tokens.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from ebpo.logprobs import LogprobOptions, OldLogprobs, logprobs
from ebpo.losses import agg_loss, kl_penalty
from ebpo.trainer.config import TrainConfig
from ebpo.trainer.rollout import RolloutBatch


def minibatches(order_B: Tensor, size: int, epochs: int, generator: torch.Generator) -> Iterator[Tensor]:
    """The rows of each update: ``epochs`` passes over the batch in mini-batches of ``size`` rows, the first
    pass in the order ``order_B``, each later one in a new shuffle drawn from ``generator``."""
    for epoch in range(epochs):
        if epoch > 0:
            order_B = torch.randperm(len(order_B), generator=generator)
        yield from order_B.split(size)


def update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    policy_loss: Any,
    loss_cfg: Any,
    batch: RolloutBatch,
    rows: Tensor,
    adv_B: Tensor,
    old: OldLogprobs,
    ref_logp_BT: Tensor | None,
    cfg: TrainConfig,
    options: LogprobOptions,
    device: torch.device,
) -> dict[str, list[float]]:
    """One optimizer step on the mini-batch ``rows``, in parts of ``optim.micro_batch_size`` rows whose
    losses are weighted by their share of the mini-batch's tokens (token-mean) or sequences, so that for
    the vanilla loss the gradient equals the whole mini-batch's. A non-finite gradient norm skips the step
    (``actor/nonfinite_grad``). Returns each metric's values, one per part."""
    a, o = cfg.algorithm, cfg.optim
    mini_mask_BT = batch.response_mask_BT[rows]
    total_tokens = float(mini_mask_BT.sum().clamp(min=1))
    total_seqs = float((mini_mask_BT.sum(1) > 0).sum().clamp(min=1))
    metrics: dict[str, list[float]] = defaultdict(list)
    optimizer.zero_grad(set_to_none=True)
    for part in rows.split(o.micro_batch_size or len(rows)):
        tokens = batch.tokens.rows(part).to(device)
        current = logprobs(model, tokens, options, with_entropy=old.pending(part))
        logp_BT, mask_BT = current.logp_BT, tokens.response_mask_BT
        old_BT = old.take(part, current)
        loss, part_metrics = policy_loss(logp_BT, old_BT, adv_B[part].to(device), mask_BT, loss_cfg)
        if ref_logp_BT is not None:
            kl_BT = kl_penalty(logp_BT, ref_logp_BT[part].to(device), a.kl_estimator)
            kl_ref = agg_loss(kl_BT, mask_BT, a.loss_agg_mode, max_len=cfg.rollout.max_new_tokens)
            loss = loss + a.kl_coef * kl_ref
            part_metrics["actor/kl_ref"] = float(kl_ref.detach())
        if a.loss_agg_mode == "token-mean":
            weight = float(mask_BT.sum()) / total_tokens
        else:
            weight = float((mask_BT.sum(1) > 0).sum()) / total_seqs
        (loss * weight).backward()
        for name, value in part_metrics.items():
            metrics[name].append(float(value))
    max_norm = o.grad_clip if o.grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if torch.isfinite(grad_norm):
        optimizer.step()
        metrics["actor/grad_norm"].append(float(grad_norm))
    else:  # skip the update; the step's metrics say so
        metrics["actor/nonfinite_grad"].append(1.0)
        optimizer.zero_grad(set_to_none=True)
    return metrics
