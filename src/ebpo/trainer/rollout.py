"""A step's rollouts: generated and scored in groups, held as one typed batch, and the log-probs the update
needs.

Shapes: ``B`` rows (one sampled response each; a group's G responses are consecutive rows), ``P`` prompt
tokens (left-padded), ``T`` response tokens (right-padded), ``V`` vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F

from ebpo.data.dynamic import Group
from ebpo.data.records import Record
from ebpo.generation import IN_KERNEL_GQA, Rollouts, keeps_last_logits, pad_rows, sample
from ebpo.losses import entropy_from_logits, overlong_penalty
from ebpo.trainer.config import ConfigError, TrainConfig


@dataclass(frozen=True)
class RolloutBatch:
    """Sampled responses with their rewards, ready for the log-prob passes and the update.

    Built per generation round from ``ebpo.generation.Rollouts`` (one group = G consecutive rows) and
    concatenated over the groups a step trains on (:meth:`concat`).
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

    def model_inputs(self, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        """The token tensors :func:`forward_logp` reads, on ``device``, named as in ``ebpo.generation.Rollouts``."""
        return {
            "prompt_ids": self.prompt_ids_BP.to(device),
            "prompt_mask": self.prompt_mask_BP.to(device),
            "response_ids": self.response_ids_BT.to(device),
            "response_mask": self.response_mask_BT.to(device),
        }

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


def _concat_padded(parts: Sequence[Mapping[str, torch.Tensor]], pad_id: int) -> dict[str, torch.Tensor]:
    """:meth:`RolloutBatch.concat` on plain dicts keyed by the field names without their shape suffix
    (``prompt_ids`` for ``prompt_ids_BP``); kept for callers (and tests) that hold rollouts as dicts."""
    names = {f.name.rsplit("_", 1)[0]: f.name for f in fields(RolloutBatch)}
    batches = [RolloutBatch(**{names[key]: value for key, value in part.items()}) for part in parts]
    batch = RolloutBatch.concat(batches, pad_id)
    keys = set().union(*parts) if parts else set()
    return {key: getattr(batch, name) for key, name in names.items() if key in keys}


def forward_logp(
    model: torch.nn.Module,
    inputs: Mapping[str, torch.Tensor],
    temperature: float,
    *,
    with_entropy: bool = False,
    response_logits_only: bool = False,
    shared_prompts: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token log-probs of the responses under ``log_softmax(logits / T)``: returns ``(logp_BT, entropy_BT)``.

    ``inputs`` holds ``prompt_ids`` / ``prompt_mask`` (B, P), left-padded, and ``response_ids`` /
    ``response_mask`` (B, T), right-padded (:meth:`RolloutBatch.model_inputs`). Position ids skip the left
    padding, as in generation, so the numbers match the sampler's. ``entropy_BT`` is the entropy of the same
    distribution (computed without gradient), or None without ``with_entropy``.

    ``response_logits_only``: only the T + 1 last positions go through the output layer when the model takes
    ``logits_to_keep`` (Hugging Face causal LMs), as the prompt's logits are never read. The log-probs are
    the same to the bit as long as the output layer's weight has ``requires_grad`` (torch then runs those
    positions as one matrix product; without it, T + 1 rows per response, which MKL sums in another order
    when T + 1 < 4). The trainer sets it for its passes without gradient only, because under autograd
    the output layer's weight gradient would then sum over fewer positions, in another order, and differ
    in the last bits from a full forward's. A row's numbers do not depend on the other rows of the call
    (the trainer reuses an update's forward as the old log-probs of its rows).

    Without gradient (``torch.no_grad``), rows that repeat another row (same prompt, response and masks: a
    group's G responses often agree, and more so as training converges) are computed once and copied, which
    is exact for the same reason (``ebpo.generation.MIN_FORWARD_ROWS`` says when). Under autograd every row
    goes through the model, so that the weight gradients sum over the same positions in the same order.

    ``shared_prompts``: each distinct prompt of the call runs through the model once, packed with the others
    (:func:`_packed_prompt_cache`), and every row's last prompt token and response run on its prompt's cached
    keys and values (as the sampler does; gradients flow back through the cache), instead of every row
    running its own copy of the prompt. The same function of the weights with fewer positions computed, but
    sums in another order: the numbers differ from the default's by float rounding (``optim.shared_prompts``;
    ``tests/test_trainer_update.py`` bounds the difference). Needs a model that takes ``past_key_values``
    (Hugging Face causal LMs) with an attention of :data:`SHARED_PROMPT_ATTENTION`.
    """
    if not torch.is_grad_enabled():
        distinct = distinct_rows(inputs)
        if distinct is not None:
            first_U, inverse_B = distinct
            rows_U = pad_rows(first_U, inverse_B.shape[0])
            logp_UT, entropy_UT = _forward_logp(
                model,
                {name: tensor[rows_U] for name, tensor in inputs.items()},
                temperature,
                with_entropy,
                response_logits_only,
                shared_prompts,
            )
            return logp_UT[inverse_B], (None if entropy_UT is None else entropy_UT[inverse_B])
    return _forward_logp(model, inputs, temperature, with_entropy, response_logits_only, shared_prompts)


def _response_logits(
    model: torch.nn.Module, inputs: Mapping[str, torch.Tensor], response_logits_only: bool
) -> torch.Tensor:
    """Logits ``(B, T, V)`` at the positions that predict each response token, one forward over every
    row's prompt and response."""
    prompt_ids_BP, prompt_mask_BP = inputs["prompt_ids"], inputs["prompt_mask"]
    response_ids_BT, response_mask_BT = inputs["response_ids"], inputs["response_mask"]
    num_response = response_ids_BT.shape[1]
    input_ids_BL = torch.cat([prompt_ids_BP, response_ids_BT], dim=1)
    attention_BL = torch.cat([prompt_mask_BP, response_mask_BT], dim=1)
    position_BL = (attention_BL.cumsum(-1) - 1).clamp(min=0)
    keep = {"logits_to_keep": num_response + 1} if response_logits_only and keeps_last_logits(model) else {}
    logits_BKV = model(
        input_ids=input_ids_BL, attention_mask=attention_BL, position_ids=position_BL, **keep
    ).logits
    # the token at response position t is predicted by the logits at sequence position P - 1 + t, the
    # (T + 1 - t)-th from the end
    return logits_BKV[:, logits_BKV.shape[1] - num_response - 1 : -1, :]


SHARED_PROMPT_ATTENTION = ("sdpa", IN_KERNEL_GQA, "eager")
"""Attention implementations ``shared_prompts`` runs with: it hands them a 4-D mask of its own (boolean for
``sdpa``, additive for ``eager``); the flash-attention kernels take no such mask."""


def check_shared_prompt_attention(model: torch.nn.Module, name: str = "the model") -> str:
    """The attention implementation of ``model`` (``name`` says which, in the message); a
    :class:`~ebpo.errors.ConfigError` unless ``shared_prompts`` runs with it (:data:`SHARED_PROMPT_ATTENTION`)."""
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if attention not in SHARED_PROMPT_ATTENTION:
        raise ConfigError(
            f"optim.shared_prompts=true needs sdpa or eager attention; {name} loads with {attention!r}. Load it "
            "with attn_implementation='sdpa' or set optim.shared_prompts=false"
        )
    return attention


def _response_logits_shared_prompts(
    model: torch.nn.Module, inputs: Mapping[str, torch.Tensor]
) -> torch.Tensor:
    """:func:`_response_logits` with each distinct prompt computed once (``forward_logp``'s
    ``shared_prompts``): the distinct prompts less their last token go through the model packed
    (:func:`_packed_prompt_cache`), and one forward runs every row's last prompt token and its response on
    their cached keys and values (the last prompt token's output predicts the first response token)."""
    prompt_ids_BP, prompt_mask_BP = inputs["prompt_ids"], inputs["prompt_mask"]
    response_ids_BT, response_mask_BT = inputs["response_ids"], inputs["response_mask"]
    first_U, inverse_B = _first_of_each(torch.cat([prompt_ids_BP, prompt_mask_BP], dim=1))
    real_UP = prompt_mask_BP[first_U].bool()
    cached = [ids[real][:-1] for ids, real in zip(prompt_ids_BP[first_U], real_UP)]  # all but the last token
    cache, prompt_mask_BW = _packed_prompt_cache(model, cached, inverse_B)
    last_B1 = prompt_ids_BP[:, -1:]  # left padding: every row's last prompt token is in the last column
    attention_BL = torch.cat([prompt_mask_BW, torch.ones_like(last_B1), response_mask_BT[:, :-1]], dim=1)
    position_BL = (attention_BL.cumsum(-1) - 1).clamp(min=0)  # as _response_logits numbers them
    return model(
        input_ids=torch.cat([last_B1, response_ids_BT[:, :-1]], dim=1),
        attention_mask=attention_BL,
        position_ids=position_BL[:, prompt_mask_BW.shape[1] :],
        past_key_values=cache,
        use_cache=cache is not None,
    ).logits


def _packed_prompt_cache(
    model: torch.nn.Module, prompts: Sequence[torch.Tensor], inverse_B: torch.Tensor
) -> tuple[Any, torch.Tensor]:
    """The keys and values of the U token sequences ``prompts`` for the B rows that use them (row b: prompt
    ``inverse_B[b]``), as a ``DynamicCache`` left-padded to the longest, with its (B, W) attention mask;
    ``(None, an empty mask)`` when every prompt is empty.

    The prompts run in rows as long as the longest, filled first fit, longest first (so at most one row is
    less than half full), each attending to itself only (a block-diagonal causal mask, positions from 0 in
    each); their keys and values are then gathered into each row's place."""
    from transformers import DynamicCache

    device = inverse_B.device
    length_U = [int(p.shape[0]) for p in prompts]
    width = max(length_U)
    if width == 0:
        return None, torch.zeros((inverse_B.shape[0], 0), dtype=torch.long, device=device)
    attention = check_shared_prompt_attention(model)
    config = getattr(model, "config", None)  # a Hugging Face model's: the cache's layer types
    bin_U, start_U = [0] * len(prompts), [0] * len(prompts)
    fill: list[int] = []  # tokens in each row so far
    for u in sorted(range(len(prompts)), key=lambda u: -length_U[u]):
        b = next((b for b, used in enumerate(fill) if used + length_U[u] <= width), len(fill))
        if b == len(fill):
            fill.append(0)
        bin_U[u], start_U[u] = b, fill[b]
        fill[b] += length_U[u]
    packed_RW = torch.zeros((len(fill), width), dtype=torch.long, device=device)
    segment_RW = torch.full_like(packed_RW, -1)  # the prompt at each packed position; -1: padding
    position_RW = torch.zeros_like(packed_RW)
    for u, (b, start, length) in enumerate(zip(bin_U, start_U, length_U)):
        packed_RW[b, start : start + length] = prompts[u]
        segment_RW[b, start : start + length] = u
        position_RW[b, start : start + length] = torch.arange(length, device=device)
    causal_WW = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    attend_R1WW = ((segment_RW[:, :, None] == segment_RW[:, None, :]) & causal_WW)[:, None]
    mask_R1WW: torch.Tensor = attend_R1WW
    if attention == "eager":  # an additive mask
        dtype = next(model.parameters()).dtype
        mask_R1WW = torch.zeros(attend_R1WW.shape, dtype=dtype, device=device).masked_fill(
            ~attend_R1WW, torch.finfo(dtype).min
        )
    packed = model(
        input_ids=packed_RW,
        attention_mask=mask_R1WW,
        position_ids=position_RW,
        past_key_values=DynamicCache(config=config),
        use_cache=True,
        **({"logits_to_keep": 1} if keeps_last_logits(model) else {}),
    ).past_key_values
    # row b's prompt, left-padded to the width: column w holds packed position (bin, start + w - (width -
    # length)), or a zero column (flat index R * width) where w is padding
    bin_t, start_t, length_t = (torch.tensor(v, device=device) for v in (bin_U, start_U, length_U))
    column_W = torch.arange(width, device=device)
    pad_UW = column_W[None, :] < (width - length_t)[:, None]
    flat_UW = (bin_t * width + start_t - width + length_t)[:, None] + column_W[None, :]
    source_BW = torch.where(pad_UW, len(fill) * width, flat_UW)[inverse_B]
    layers = []
    for layer in packed.layers:
        states = []
        for states_RHWD in (layer.keys, layer.values):
            rows, heads, _, dim = states_RHWD.shape
            flat_HND = states_RHWD.transpose(0, 1).reshape(heads, rows * width, dim)
            flat_HND = torch.cat([flat_HND, flat_HND.new_zeros(heads, 1, dim)], dim=1)
            states.append(flat_HND[:, source_BW].transpose(0, 1))
        layers.append(tuple(states))
    return DynamicCache(layers, config=config), (~pad_UW).long()[inverse_B]


def _forward_logp(
    model: torch.nn.Module,
    inputs: Mapping[str, torch.Tensor],
    temperature: float,
    with_entropy: bool,
    response_logits_only: bool,
    shared_prompts: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`forward_logp` over every row of ``inputs``."""
    response_ids_BT = inputs["response_ids"]
    if shared_prompts and response_ids_BT.shape[1] > 0:
        logits_BTV = _response_logits_shared_prompts(model, inputs).float()
    else:
        logits_BTV = _response_logits(model, inputs, response_logits_only).float()
    if temperature != 1.0:  # x / 1.0 is x: skipping it saves a (B, T, V) copy and its backward
        logits_BTV = logits_BTV / temperature
    # log_softmax at the sampled token without a second (B, T, V) tensor: z_y - logsumexp(z)
    logp_BT = logits_BTV.gather(-1, response_ids_BT[..., None]).squeeze(-1) - torch.logsumexp(
        logits_BTV, dim=-1
    )
    entropy_BT = None
    if with_entropy:
        with torch.no_grad():
            entropy_BT = entropy_from_logits(logits_BTV.detach())
    return logp_BT, entropy_BT


def distinct_rows(inputs: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The distinct rows of a batch of :func:`forward_logp` inputs (tokens and masks equal): ``(first_U,
    inverse_B)`` with ``first_U`` the first row of each distinct row and row b equal to row
    ``first_U[inverse_B[b]]``; None when every row is distinct."""
    names = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")
    first_U, inverse_B = _first_of_each(
        torch.cat([inputs[name].to("cpu", torch.long) for name in names], dim=1)
    )
    if first_U.shape[0] == inverse_B.shape[0]:
        return None
    device = inputs["prompt_ids"].device
    return first_U.to(device), inverse_B.to(device)


def _first_of_each(rows_BL: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first_U, inverse_B)`` of the distinct rows of ``rows_BL``: row b equals row ``first_U[inverse_B[b]]``,
    the first of its kind."""
    unique_UL, inverse_B = torch.unique(rows_BL, dim=0, return_inverse=True)
    row_B = torch.arange(rows_BL.shape[0], device=rows_BL.device)
    first_U = torch.full((unique_UL.shape[0],), rows_BL.shape[0], device=rows_BL.device)
    return first_U.scatter_reduce(0, inverse_B, row_B, "amin"), inverse_B


def batched_logp(
    model: torch.nn.Module,
    batch: RolloutBatch,
    temperature: float,
    device: torch.device | str,
    part_size: int | None,
    *,
    with_entropy: bool = False,
    shared_prompts: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``(B, T)`` (and entropies) of every row of ``batch`` on the CPU, without gradient, in
    forward passes of ``part_size`` rows (None: all at once); :func:`forward_logp` with
    ``response_logits_only`` (and ``shared_prompts``)."""
    size = part_size or batch.num_rows
    logps, entropies = [], []
    for start in range(0, batch.num_rows, size):
        part = batch.select(slice(start, start + size))
        logp_BT, entropy_BT = forward_logp(
            model,
            part.model_inputs(device),
            temperature,
            with_entropy=with_entropy,
            response_logits_only=True,
            shared_prompts=shared_prompts,
        )
        logps.append(logp_BT.cpu())
        if entropy_BT is not None:
            entropies.append(entropy_BT.cpu())
    return torch.cat(logps), (torch.cat(entropies) if entropies else None)


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


def generate_groups(
    model: Any,
    tokenizer: Any,
    records: Sequence[Record],
    clusters: Sequence[Any] | None,
    uids: Iterator[int],
    *,
    cfg: TrainConfig,
    generator: torch.Generator,
    reward_fn: Any,
) -> tuple[list[Group], list[RewardFailure]]:
    """One generation round: G = ``data.group_size`` responses per record, scored (plus DAPO's overlong
    shaping when ``algorithm.overlong_shaping``); one :class:`~ebpo.data.dynamic.Group` per record (uid from
    ``uids``, cluster from ``clusters``) whose ``data`` is its :class:`RolloutBatch` and ``rewards`` the
    training rewards of its valid samples. Returns the groups and the samples whose reward failed."""
    a, r, G = cfg.algorithm, cfg.rollout, cfg.data.group_size
    rollouts = sample(
        model,
        tokenizer,
        [rec.prompt for rec in records],
        n=G,
        temperature=r.temperature,
        top_p=r.top_p,
        max_new_tokens=r.max_new_tokens,
        generator=generator,
        with_entropy=r.old_logp == "sampler",
    )
    answers = [rec.answer for rec in records for _ in range(G)]
    prompts = [rec.prompt for rec in records for _ in range(G)]
    score_B, valid_B, failures = score_samples(reward_fn, rollouts.texts, answers, prompts)
    reward_B = score_B.clone()
    if a.overlong_shaping:  # DAPO soft overlong punishment, added to the task reward
        reward_B += overlong_penalty(rollouts.lengths, r.max_new_tokens, a.overlong_cache_len).double()
    batch = RolloutBatch.from_rollouts(rollouts, score_B, reward_B, valid_B)
    groups = []
    for m in range(len(records)):
        rows = slice(m * G, (m + 1) * G)
        cluster = clusters[m] if clusters is not None else None
        rewards_G = reward_B[rows][valid_B[rows]]
        groups.append(Group(uid=next(uids), rewards=rewards_G, cluster=cluster, data=batch.select(rows)))
    return groups, failures
