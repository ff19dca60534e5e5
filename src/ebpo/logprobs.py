"""Token log-probs of sampled responses under a policy: one interface, the reference it must equal, and the
faster ways it computes the same numbers.

Shapes: ``B`` rows (one response each), ``P`` prompt tokens (left-padded), ``T`` response tokens
(right-padded), ``V`` vocabulary. A batch's token rows are a :class:`Tokens`.

The definition is :func:`reference_logprobs`: one forward pass over each row's prompt and response, the
logits that predict each response token, divided by the sampling temperature, ``log_softmax`` at the sampled
token. :func:`logprobs` is what the trainer calls: it returns the reference's numbers, and picks its way to
compute them from :class:`LogprobOptions` (built once from the config) and from whether autograd is on.
:class:`OldLogprobs` and :func:`step_kl` are the step's two other uses of it.

=====================  =====================================================  ==============================
path                   what it saves, and when                                against the reference
=====================  =====================================================  ==============================
distinct rows          without gradient, a row that repeats another (same     to the bit
                       prompt, response and masks: a group's G responses
                       often agree) is computed once and copied
response logits only   without gradient, the output layer runs at the last    to the bit
                       ``max(T + 1, MIN_PRODUCT_ROWS)`` positions only
                       (``logits_to_keep``), not at every prompt position
parts                  without gradient, forwards of ``part_size`` rows       to the bit
in-kernel GQA          the attention ``ebpo.generation.in_kernel_gqa`` puts   to the bit
                       on a model at load: a grouped-query model's keys and
                       values are not copied once per query head
first update           ``old_logp="recompute"``: the step's first update      to the bit
                       runs at the sampling policy, so its own forward gives
                       its rows' old log-probs (:class:`OldLogprobs`)
shared prompts         ``shared_prompts``: each distinct prompt runs once,    within rounding: below 1e-5
                       packed, and the responses on its cached keys and       (gradients 1e-5 relative)
                       values
sampler's log-probs    ``old_logp="sampler"``: the numbers the sampler drew   within rounding: below 5e-5
                       with serve as old log-probs (no pass at all)
step-KL subset         ``step_kl="subset"``: the step's KL from every U-th    the same estimator on fewer
                       row (:func:`step_kl`)                                  rows
=====================  =====================================================  ==============================

``tests/test_logprobs.py`` holds each path to the reference over random batches, with and without
grouped-query attention, to the bit or to the bound above (the measured differences are about a tenth of it).

Why the exact paths are exact, on the CPU. A row's numbers in a forward pass do not depend on the other rows:
every matrix product, attention and normalisation treats rows apart. They do depend on the algorithm each
matrix product runs, and MKL sums a product of 1 row, of 2-3 rows and of 4 or more rows in three different
orders. So no fast path runs a product of fewer than 4 rows where the reference runs more: a forward over
the distinct rows is topped up with copies of the first to ``min(B, MIN_FORWARD_ROWS)`` rows
(:func:`ebpo.generation.pad_rows`; one distinct row of 2-3 tokens would otherwise run products of 2-3
rows), and the output layer runs at ``MIN_PRODUCT_ROWS`` positions at least (torch runs that slice as one
product over every row and position when the output weight requires gradient, and as one product per row
when it does not). With gradient every row goes through the whole model, as in the reference: the weight
gradients sum over the same positions in the same order, and the log-probs are those of the passes without
gradient, which is what lets the first update serve old log-probs. The in-kernel GQA attention hands key/value
head ``h // groups`` to query head ``h``, as ``sdpa``'s copy does (with gradient it is ``sdpa`` itself).
Shared prompts compute the same function of the weights with fewer positions, in another order: the numbers
differ by rounding, and a run with them diverges from one without as another seed would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal, NamedTuple, get_args

import torch
from torch import Tensor

from ebpo.errors import ConfigError
from ebpo.generation import (
    IN_KERNEL_GQA,
    Rollouts,
    cache_argument,
    keeps_last_logits,
    pad_rows,
    returned_cache,
)
from ebpo.losses import entropy_from_logits, kl_penalty, masked_mean

__all__ = [
    "MIN_PRODUCT_ROWS",
    "SHARED_PROMPT_ATTENTION",
    "LogProbs",
    "LogprobOptions",
    "OldLogpSource",
    "OldLogprobs",
    "StepKLScope",
    "Tokens",
    "attention_of",
    "check_shared_prompt_attention",
    "logprobs",
    "reference_logprobs",
    "step_kl",
]

MIN_PRODUCT_ROWS = 4
"""The fewest positions per row at which the passes without gradient run the output layer: MKL sums a matrix
product of fewer rows in another order (module docstring)."""

OldLogpSource = Literal["recompute", "sampler"]
StepKLScope = Literal["all", "subset", "none"]


@dataclass(frozen=True)
class Tokens:
    """The token rows a log-prob pass reads."""

    prompt_ids_BP: Tensor
    """Prompt tokens (long), left-padded."""
    prompt_mask_BP: Tensor
    """1 on prompt tokens, 0 on the left padding (long)."""
    response_ids_BT: Tensor
    """Response tokens (long), right-padded."""
    response_mask_BT: Tensor
    """1 on the response tokens whose log-probs are read (long); 0 on padding, or on a whole row."""

    @staticmethod
    def from_rollouts(rollouts: Rollouts) -> Tokens:
        """The rows of ``ebpo.generation.sample``'s output."""
        return Tokens(
            rollouts.prompt_ids, rollouts.prompt_mask, rollouts.response_ids, rollouts.response_mask
        )

    @property
    def num_rows(self) -> int:
        return self.response_ids_BT.shape[0]

    def rows(self, index: Tensor | slice) -> Tokens:
        """The rows ``index`` (indices or a slice)."""
        return Tokens(*(getattr(self, f.name)[index] for f in fields(self)))

    def to(self, device: torch.device | str) -> Tokens:
        return Tokens(*(getattr(self, f.name).to(device) for f in fields(self)))


class LogProbs(NamedTuple):
    logp_BT: Tensor
    """log_softmax(logits / temperature) at each response token (float32)."""
    entropy_BT: Tensor | None
    """The entropy of that distribution (float32, computed without gradient), when asked for."""


@dataclass(frozen=True)
class LogprobOptions:
    """How :func:`logprobs`, :class:`OldLogprobs` and :func:`step_kl` compute (the trainer builds one from its
    config: ``rollout.temperature``, ``optim.micro_batch_size``, ``optim.shared_prompts``, ``rollout.old_logp``,
    ``run.step_kl``). The defaults give the reference's numbers to the bit."""

    temperature: float = 1.0
    """The sampling temperature: log-probs are those of ``log_softmax(logits / temperature)``."""
    part_size: int | None = None
    """Rows per forward pass without gradient (None: all at once)."""
    shared_prompts: bool = False
    """Run each distinct prompt once and the responses on its cached keys and values (within rounding)."""
    old_logp: OldLogpSource = "recompute"
    """Old log-probs: recomputed at the sampling policy, or the sampler's own (within rounding)."""
    step_kl: StepKLScope = "all"
    """:func:`step_kl` over every row, every U-th row, or not at all."""

    def __post_init__(self) -> None:
        for name, kind in (("old_logp", OldLogpSource), ("step_kl", StepKLScope)):
            if getattr(self, name) not in get_args(kind):
                raise ValueError(f"{name} must be one of {get_args(kind)}, got {getattr(self, name)!r}")


def reference_logprobs(
    model: torch.nn.Module, tokens: Tokens, temperature: float, *, with_entropy: bool = False
) -> LogProbs:
    """The definition :func:`logprobs` is held to: one forward over every row's prompt and response, then
    ``log_softmax(logits / temperature)`` at each sampled response token (and its entropy)."""
    num_prompt = tokens.prompt_ids_BP.shape[1]
    num_response = tokens.response_ids_BT.shape[1]
    logits_BLV = model(**_sequence_inputs(tokens)).logits
    # the token at response position t is predicted by the output at sequence position P - 1 + t
    logits_BTV = logits_BLV[:, num_prompt - 1 : num_prompt - 1 + num_response]
    return _token_logprobs(logits_BTV, tokens.response_ids_BT, temperature, with_entropy)


def _sequence_inputs(tokens: Tokens) -> dict[str, Tensor]:
    """Each row's prompt and response as one sequence; position ids skip the left padding, as in sampling."""
    attention_BL = torch.cat([tokens.prompt_mask_BP, tokens.response_mask_BT], dim=1)
    return {
        "input_ids": torch.cat([tokens.prompt_ids_BP, tokens.response_ids_BT], dim=1),
        "attention_mask": attention_BL,
        "position_ids": (attention_BL.cumsum(-1) - 1).clamp(min=0),
    }


def _token_logprobs(
    logits_BTV: Tensor, response_ids_BT: Tensor, temperature: float, with_entropy: bool
) -> LogProbs:
    """``log_softmax(logits / temperature)`` at the sampled tokens, as ``z_y - logsumexp(z)`` (no second
    (B, T, V) tensor), and the entropies."""
    logits_BTV = logits_BTV.float()
    if temperature != 1.0:  # x / 1.0 is x: skipping it saves a (B, T, V) copy and its backward
        logits_BTV = logits_BTV / temperature
    logp_BT = logits_BTV.gather(-1, response_ids_BT[..., None]).squeeze(-1) - torch.logsumexp(
        logits_BTV, dim=-1
    )
    entropy_BT = None
    if with_entropy:
        with torch.no_grad():
            entropy_BT = entropy_from_logits(logits_BTV.detach())
    return LogProbs(logp_BT, entropy_BT)


def logprobs(
    model: torch.nn.Module, tokens: Tokens, options: LogprobOptions, *, with_entropy: bool = False
) -> LogProbs:
    """:func:`reference_logprobs` of ``tokens`` under ``model`` at ``options.temperature``, on the device of
    ``tokens`` (the forwards run on the model's).

    With gradient: one forward over every row (the caller's micro-batch), so that the weight gradients sum
    as a full forward's do. Without gradient (``torch.no_grad``): forwards of ``options.part_size`` rows, each
    computing its distinct rows once and the output layer at the response positions only (the module
    docstring says why these give the same numbers). ``options.shared_prompts`` applies to both."""
    if torch.is_grad_enabled():
        return _forward(model, tokens, options, with_entropy, response_logits_only=False)
    model_device = next(model.parameters()).device
    size = options.part_size or max(1, tokens.num_rows)
    parts = [
        _forward_distinct(
            model, tokens.rows(slice(start, start + size)).to(model_device), options, with_entropy
        )
        for start in range(0, tokens.num_rows, size)
    ]
    device = tokens.response_ids_BT.device
    logp_BT = torch.cat([part.logp_BT for part in parts]).to(device)
    entropies = [part.entropy_BT for part in parts if part.entropy_BT is not None]
    return LogProbs(logp_BT, torch.cat(entropies).to(device) if with_entropy else None)


def _forward_distinct(
    model: torch.nn.Module, tokens: Tokens, options: LogprobOptions, with_entropy: bool
) -> LogProbs:
    """:func:`_forward` (response logits only) over the distinct rows of ``tokens``, topped up to
    ``min(B, MIN_FORWARD_ROWS)`` rows, copied to their repeats."""
    distinct = _distinct_rows(tokens)
    if distinct is None:
        return _forward(model, tokens, options, with_entropy, response_logits_only=True)
    first_U, inverse_B = distinct
    logp_UT, entropy_UT = _forward(
        model,
        tokens.rows(pad_rows(first_U, inverse_B.shape[0])),
        options,
        with_entropy,
        response_logits_only=True,
    )
    return LogProbs(logp_UT[inverse_B], None if entropy_UT is None else entropy_UT[inverse_B])


def _forward(
    model: torch.nn.Module,
    tokens: Tokens,
    options: LogprobOptions,
    with_entropy: bool,
    response_logits_only: bool,
) -> LogProbs:
    """One forward over every row of ``tokens``: on the shared prompts' cache (``options.shared_prompts``), or
    :func:`reference_logprobs`'s, with the output layer at the T + 1 last positions only
    (``response_logits_only``, for models that take ``logits_to_keep``), or at least ``MIN_PRODUCT_ROWS``."""
    num_response = tokens.response_ids_BT.shape[1]
    if options.shared_prompts and num_response > 0:
        logits_BTV = _response_logits_shared_prompts(model, tokens)
    else:
        keep = max(num_response + 1, MIN_PRODUCT_ROWS)
        response_only = {"logits_to_keep": keep} if response_logits_only and keeps_last_logits(model) else {}
        logits_BKV = model(**_sequence_inputs(tokens), **response_only).logits
        # the token at response position t is predicted by the logits at sequence position P - 1 + t, the
        # (T + 1 - t)-th from the end
        logits_BTV = logits_BKV[:, logits_BKV.shape[1] - num_response - 1 : -1, :]
    return _token_logprobs(logits_BTV, tokens.response_ids_BT, options.temperature, with_entropy)


def _distinct_rows(tokens: Tokens) -> tuple[Tensor, Tensor] | None:
    """The distinct rows of ``tokens`` (tokens and masks equal): ``(first_U, inverse_B)`` with ``first_U`` the
    first row of each distinct row and row b equal to row ``first_U[inverse_B[b]]``; None when every row is
    distinct."""
    first_U, inverse_B = _first_of_each(
        torch.cat([getattr(tokens, f.name).to("cpu", torch.long) for f in fields(tokens)], dim=1)
    )
    if first_U.shape[0] == inverse_B.shape[0]:
        return None
    device = tokens.prompt_ids_BP.device
    return first_U.to(device), inverse_B.to(device)


def _first_of_each(rows_BL: Tensor) -> tuple[Tensor, Tensor]:
    """``(first_U, inverse_B)`` of the distinct rows of ``rows_BL``: row b equals row ``first_U[inverse_B[b]]``,
    the first of its kind."""
    unique_UL, inverse_B = torch.unique(rows_BL, dim=0, return_inverse=True)
    row_B = torch.arange(rows_BL.shape[0], device=rows_BL.device)
    first_U = torch.full((unique_UL.shape[0],), rows_BL.shape[0], device=rows_BL.device)
    return first_U.scatter_reduce(0, inverse_B, row_B, "amin"), inverse_B


# -- shared prompts ------------------------------------------------------------------------------------

SHARED_PROMPT_ATTENTION = ("sdpa", IN_KERNEL_GQA, "eager")
"""Attention implementations ``shared_prompts`` runs with: it hands them a 4-D mask of its own (boolean for
``sdpa``, additive for ``eager``); the flash-attention kernels take no such mask."""


def attention_of(model: torch.nn.Module) -> str | None:
    """The attention implementation ``model`` loaded with (its config's ``_attn_implementation``)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def check_shared_prompt_attention(model: torch.nn.Module, name: str = "the model") -> str:
    """The attention implementation of ``model`` (``name`` says which, in the message); a
    :class:`~ebpo.errors.ConfigError` unless ``shared_prompts`` runs with it (:data:`SHARED_PROMPT_ATTENTION`)."""
    attention = attention_of(model)
    if attention not in SHARED_PROMPT_ATTENTION:
        raise ConfigError(
            f"optim.shared_prompts=true needs sdpa or eager attention; {name} loads with {attention!r}. Load it "
            "with attn_implementation='sdpa' or set optim.shared_prompts=false"
        )
    return attention


def _response_logits_shared_prompts(model: torch.nn.Module, tokens: Tokens) -> Tensor:
    """The logits ``(B, T, V)`` that predict each response token, each distinct prompt computed once: the
    distinct prompts less their last token go through the model packed (:func:`_packed_prompt_cache`), and
    one forward runs every row's last prompt token and its response on their cached keys and values (the
    last prompt token's output predicts the first response token). Needs a model that takes a KV cache
    (Hugging Face causal LMs; :func:`ebpo.generation.cache_argument`) with an attention of
    :data:`SHARED_PROMPT_ATTENTION`."""
    prompt_ids_BP, prompt_mask_BP = tokens.prompt_ids_BP, tokens.prompt_mask_BP
    response_ids_BT, response_mask_BT = tokens.response_ids_BT, tokens.response_mask_BT
    first_U, inverse_B = _first_of_each(torch.cat([prompt_ids_BP, prompt_mask_BP], dim=1))
    real_UP = prompt_mask_BP[first_U].bool()
    cached = [ids[real][:-1] for ids, real in zip(prompt_ids_BP[first_U], real_UP)]  # all but the last token
    cache, prompt_mask_BW = _packed_prompt_cache(model, cached, inverse_B)
    last_B1 = prompt_ids_BP[:, -1:]  # left padding: every row's last prompt token is in the last column
    attention_BL = torch.cat([prompt_mask_BW, torch.ones_like(last_B1), response_mask_BT[:, :-1]], dim=1)
    position_BL = (attention_BL.cumsum(-1) - 1).clamp(min=0)  # as _sequence_inputs numbers them
    return model(
        input_ids=torch.cat([last_B1, response_ids_BT[:, :-1]], dim=1),
        attention_mask=attention_BL,
        position_ids=position_BL[:, prompt_mask_BW.shape[1] :],
        use_cache=cache is not None,
        **{cache_argument(model): cache},
    ).logits


def _packed_prompt_cache(
    model: torch.nn.Module, prompts: Sequence[Tensor], inverse_B: Tensor
) -> tuple[Any, Tensor]:
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
    mask_R1WW: Tensor = attend_R1WW
    if attention == "eager":  # an additive mask
        dtype = next(model.parameters()).dtype
        mask_R1WW = torch.zeros(attend_R1WW.shape, dtype=dtype, device=device).masked_fill(
            ~attend_R1WW, torch.finfo(dtype).min
        )
    packed = returned_cache(
        model(
            input_ids=packed_RW,
            attention_mask=mask_R1WW,
            position_ids=position_RW,
            use_cache=True,
            **{cache_argument(model): DynamicCache(config=config)},
            **({"logits_to_keep": 1} if keeps_last_logits(model) else {}),
        )
    )
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


# -- a step's old log-probs and its KL ---------------------------------------------------------------


class OldLogprobs:
    """The old log-probs and entropies ``(B, T)`` of a step's rows: those of the policy that sampled them.

    Built by :meth:`at_sampling` before the step's first update; each update's forward then asks
    :meth:`take` for its rows' old log-probs, handing it its own log-probs: for the rows of the first update,
    whose forward runs at the sampling policy, those are the old ones (``options.old_logp="recompute"``).
    """

    def __init__(self, logp_BT: Tensor, entropy_BT: Tensor, pending_B: Tensor) -> None:
        self.logp_BT, self.entropy_BT = logp_BT, entropy_BT
        self._pending_B = pending_B  # rows whose old log-probs their own forward will give

    @staticmethod
    def at_sampling(
        model: torch.nn.Module,
        tokens: Tokens,
        options: LogprobOptions,
        *,
        first_update: Tensor,
        others: Tensor,
        sampled: LogProbs | None = None,
    ) -> OldLogprobs:
        """The old log-probs of ``tokens``' rows (on the CPU): the sampler's (``sampled``, when
        ``options.old_logp="sampler"``), or recomputed by ``model``, still the sampling policy: one pass
        without gradient over the rows ``others`` (in that order), while the rows ``first_update`` wait for
        the first update's forward (:meth:`take`)."""
        num_rows = tokens.num_rows
        if options.old_logp == "sampler":
            if sampled is None or sampled.entropy_BT is None:
                raise ValueError(
                    "old_logp='sampler' needs the sampler's log-probs and entropies (with_entropy)"
                )
            return OldLogprobs(sampled.logp_BT, sampled.entropy_BT, torch.zeros(num_rows, dtype=torch.bool))
        logp_BT = torch.zeros(tokens.response_ids_BT.shape, dtype=torch.float32)
        entropy_BT = torch.zeros(tokens.response_ids_BT.shape, dtype=torch.float32)
        if len(others):
            with torch.no_grad():
                computed = logprobs(model, tokens.rows(others), options, with_entropy=True)
            assert computed.entropy_BT is not None  # asked for with_entropy
            logp_BT[others], entropy_BT[others] = computed.logp_BT, computed.entropy_BT
        pending_B = torch.zeros(num_rows, dtype=torch.bool)
        pending_B[first_update] = True
        return OldLogprobs(logp_BT, entropy_BT, pending_B)

    def pending(self, rows: Tensor) -> bool:
        """Whether the old log-probs of ``rows`` are still to come from their own forward (then ask it for
        entropies too)."""
        return bool(self._pending_B[rows].any())

    def take(self, rows: Tensor, current: LogProbs) -> Tensor:
        """The old log-probs of ``rows``, on the device of ``current``, the log-probs of their forward at the
        policy being updated: for pending rows (the step's first update), ``current`` itself, detached, which
        is then kept as theirs."""
        pending_R = self._pending_B[rows]
        if not bool(pending_R.any()):
            return self.logp_BT[rows].to(current.logp_BT.device)
        if not bool(pending_R.all()) or current.entropy_BT is None:
            raise ValueError("the first update's rows take their old log-probs together, with entropies")
        old_BT = current.logp_BT.detach()
        self.logp_BT[rows], self.entropy_BT[rows] = old_BT.cpu(), current.entropy_BT.cpu()
        self._pending_B[rows] = False
        return old_BT


def step_kl(
    model: torch.nn.Module, tokens: Tokens, old_logp_BT: Tensor, options: LogprobOptions, stride: int
) -> float | None:
    """``actor/step_kl``: the k3 estimate of KL(pi_t || pi_t+1) from ``old_logp_BT`` (pi_t, the sampling
    policy, whose samples the tokens are) and ``model`` (pi_t+1, after the step's updates), over every
    response token (``options.step_kl="all"``), over those of every ``stride``-th row (``"subset"``: rows
    fixed by their place in the batch, not by the updates' shuffle, so that no update's rows weigh more), or
    None (``"none"``)."""
    if options.step_kl == "none":
        return None
    rows = slice(0, tokens.num_rows, max(1, stride)) if options.step_kl == "subset" else slice(None)
    tokens, old_logp_BT = tokens.rows(rows), old_logp_BT[rows]
    with torch.no_grad():
        new_logp_BT = logprobs(model, tokens, options).logp_BT
    # kl_penalty(p, q) estimates KL(p || q) from samples of p
    return float(masked_mean(kl_penalty(old_logp_BT, new_logp_BT, "k3"), tokens.response_mask_BT))
