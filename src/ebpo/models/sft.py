"""Supervised fine-tuning of the base models: right answers first, then a noisy teacher.

:func:`run_sft` is the loop every recipe shares (optimiser, schedule, shuffled epochs); each recipe feeds it its
examples (``ebpo.models.recipes.arith.train_sft`` the ``arith`` model's, ``ebpo.models.recipes.gym.train`` the gym
model's).

Two phases in one learning-rate schedule. For the first ``clean_steps`` steps the labels are the right
answers: the model learns to compute. Then the recipe's noisy teacher labels the examples
(``ebpo.models.recipes.arith.teacher_label``: the right answer with probability ``p(topic, level)``, else one of its
wrong labels, drawn uniformly). The label is drawn afresh each time an example is put in a batch, so the model
learns the teacher's distribution: the right answer with probability about ``p`` and a spread of wrong ones,
each much less likely. Wherever the model can compute the answer, the right answer stays its most likely
one: its majority vote and its greedy answer are right far more often than one sample at temperature 1.
That is the latent skill RL can sharpen, on problems it was never fine-tuned on too.

The sequence is ``prompt + label + EOS`` with no BOS (the token ids the trainer's sampler feeds the model:
the character tokenizer adds no special tokens); the loss is on the label and EOS only.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import torch


def encode_sft_example(tokenizer, prompt: str, label: str) -> tuple[list[int], list[int]]:
    """Token ids of ``prompt + label + EOS`` and labels (-100 on the prompt: loss on the label and EOS only)."""
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    label_ids = tokenizer(label, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt_ids + label_ids, [-100] * len(prompt_ids) + label_ids


def epoch_batches(n: int, batch_size: int, rng: random.Random) -> list[list[int]]:
    """One epoch of shuffled batches of example indices (the trainer pops them from the end).

    Plain shuffling on purpose: batches of similar length (length bucketing) are batches of one topic,
    and such topic-homogeneous batches made the 45-cell mixture learn about half as fast.
    """
    order = list(range(n))
    rng.shuffle(order)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def collate(examples: list[tuple[list[int], list[int]]], pad_id: int):
    """Right-pad a batch: ``(input_ids_BT, attention_mask_BT, labels_BT)``."""
    import torch

    width = max(len(ids) for ids, _ in examples)
    input_ids_BT = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention_mask_BT = torch.zeros((len(examples), width), dtype=torch.long)
    labels_BT = torch.full((len(examples), width), -100, dtype=torch.long)
    for row, (ids, labels) in enumerate(examples):
        input_ids_BT[row, : len(ids)] = torch.tensor(ids)
        attention_mask_BT[row, : len(ids)] = 1
        labels_BT[row, : len(labels)] = torch.tensor(labels)
    return input_ids_BT, attention_mask_BT, labels_BT


class Schedule(Protocol):
    """What the SFT loop reads of a recipe: its optimiser settings and the length of its run."""

    @property
    def steps(self) -> int: ...
    @property
    def warmup_steps(self) -> int: ...
    @property
    def lr(self) -> float: ...
    @property
    def weight_decay(self) -> float: ...
    @property
    def grad_clip(self) -> float: ...
    @property
    def batch_size(self) -> int: ...


def lr_at(step: int, config: Schedule) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``0.1 * lr`` at the last step."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


Examples = Callable[[int, list[int]], list[tuple[list[int], list[int]]]]
"""``(step, example indices) -> [(input ids, labels)]``: one batch's sequences, labels -100 where no loss."""


def run_sft(
    model: torch.nn.Module,
    config: Schedule,
    *,
    num_examples: int,
    examples: Examples,
    order_rng: random.Random,
    pad_id: int,
    progress: bool = True,
    stop_after: int | None = None,
) -> list[float]:
    """The SFT loop every recipe shares; returns the loss per step.

    AdamW (betas 0.9 / 0.95, weight decay on matrices only), the :func:`lr_at` schedule, gradient clipping;
    shuffled epochs of ``num_examples`` (:func:`epoch_batches` with ``order_rng``), each batch's sequences
    from ``examples``. ``stop_after`` ends the run after that many steps of the full schedule (a prefix of
    the full build, same weights).
    """
    import torch
    from tqdm.auto import tqdm

    decay = [p for _, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
        betas=(0.9, 0.95),
    )
    steps = config.steps if stop_after is None else min(stop_after, config.steps)
    model.train()
    losses: list[float] = []
    batches: list[list[int]] = []
    bar = tqdm(range(steps), desc="base-model SFT", disable=not progress, dynamic_ncols=True)
    for step in bar:
        if not batches:
            batches = epoch_batches(num_examples, config.batch_size, order_rng)
        input_ids_BT, attention_mask_BT, labels_BT = collate(examples(step, batches.pop()), pad_id)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config)
        loss = model(input_ids=input_ids_BT, attention_mask=attention_mask_BT, labels=labels_BT).loss
        if not math.isfinite(loss.item()):  # never train on, or save, a diverged model
            raise FloatingPointError(f"base-model SFT loss is {loss.item()} at step {step}; lower --lr")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == steps - 1:
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    return losses
