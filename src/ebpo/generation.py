"""Batched sampling from a causal LM with a KV cache, shared by the trainer, ``ebpo eval`` and annotate.

One call of :func:`sample` turns B prompts into B*n responses:

1. the prompts are tokenized and left-padded to a common length P;
2. one prefill forward pass runs over the B prompts (attention mask + position ids that skip the left
   padding), so a prompt is encoded once per group rather than once per response;
3. incremental decoding feeds one token per step through the ``DynamicCache``, which holds one row per
   distinct prefix (prompt and tokens drawn so far): responses that drew the same tokens share a row and a
   forward until they differ (topped up to ``MIN_FORWARD_ROWS`` rows); each step draws the next token with
   temperature and nucleus (top-p) sampling from a seeded ``torch.Generator``, or takes the argmax when
   ``temperature == 0``. With one generator for the whole call, the rows are drawn together, so a row's
   draws depend on every other row in its chunk; with ``generators`` (one per prompt, used by ``ebpo
   eval``) each prompt's rows are drawn from its own generator, so a prompt's responses do not depend on
   the other prompts in the call, their order or ``batch_size`` (up to the float rounding of a batched
   forward pass, which can differ with the batch's shape);
4. a row stops after it emits an end-of-sequence token; rows that are done are dropped from the batch
   (and from the cache), and the loop stops when every row is done or ``max_new_tokens`` is reached.

Log-probabilities (``Rollouts.old_logp``) are those of the *temperature-scaled* distribution
``log_softmax(logits / T)`` **before** top-p filtering, as verl's actor computes them: the trainer's PPO
ratio ``exp(logp - old_logp)`` must compare the same distribution, so the trainer's log-probs
(``ebpo.logprobs``) use the same temperature, and with these as old log-probs (``rollout.old_logp=sampler``)
the first ratio is 1 within float rounding. With ``temperature == 0`` (greedy) the log-probs are those of the
unscaled distribution (T = 1).
``with_entropy=True`` also records each drawn token's distribution's entropy (``Rollouts.entropy``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ebpo.losses import entropy_from_logits

__all__ = [
    "IN_KERNEL_GQA",
    "MIN_FORWARD_ROWS",
    "Rollouts",
    "cache_argument",
    "in_kernel_gqa",
    "keeps_last_logits",
    "left_pad",
    "pad_rows",
    "prompt_position_ids",
    "returned_cache",
    "sample",
    "sample_next_token",
    "stop_token_ids",
]


@dataclass
class Rollouts:
    """The responses of one :func:`sample` call; row ``j`` belongs to prompt ``group_index[j]``.

    Rows are grouped by prompt: the n responses of prompt ``b`` are rows ``b*n .. b*n + n - 1``.
    N = B*n rows; P = longest prompt; T = longest response (at most ``max_new_tokens``).

    Attributes:
        prompt_ids: LongTensor (N, P), prompt tokens, left-padded with the pad id.
        prompt_mask: LongTensor (N, P), 1 on prompt tokens, 0 on left padding.
        response_ids: LongTensor (N, T), sampled tokens, right-padded with the pad id. The EOS token,
            when one was sampled, is included.
        response_mask: LongTensor (N, T), 1 on every sampled token up to and including EOS, 0 after.
        old_logp: FloatTensor (N, T), float32, log-prob of each sampled token under the sampling
            distribution ``log_softmax(logits / temperature)`` *before* top-p (T = 1 when greedy);
            0 where ``response_mask`` is 0.
        texts: N decoded responses, without the EOS token or padding (special tokens skipped).
        lengths: LongTensor (N,), number of response tokens including EOS (= ``response_mask.sum(1)``).
        truncated: BoolTensor (N,), True where no EOS was sampled within ``max_new_tokens``.
        group_index: LongTensor (N,), index into ``prompts`` of the prompt each row answers.
        entropy: FloatTensor (N, T), float32, entropy of the distribution ``old_logp`` is taken from, at each
            response token (0 where ``response_mask`` is 0); None unless ``sample(..., with_entropy=True)``.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    old_logp: torch.Tensor
    texts: list[str]
    lengths: torch.Tensor
    truncated: torch.Tensor
    group_index: torch.Tensor
    entropy: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.texts)

    def to(self, device: torch.device | str) -> Rollouts:
        """A copy with every tensor on ``device``."""
        moved: dict[str, Any] = {  # tensors and the list of texts
            name: value.to(device) if isinstance(value, torch.Tensor) else value
            for name, value in self.__dict__.items()
        }
        return Rollouts(**moved)


MIN_FORWARD_ROWS = 16
"""The fewest rows a forward over the distinct rows of a batch runs on (fewer only when the batch has fewer):
the sampler's forward per distinct prefix and the log-prob passes' forward per distinct row are topped up with
copies to this many (:func:`pad_rows`), so that their matrix products are summed as the whole batch's would
be and the numbers stay those of a forward over every row, to the bit (``ebpo.logprobs`` says why)."""


IN_KERNEL_GQA = "ebpo_sdpa_gqa"
"""The name under which :func:`in_kernel_gqa` registers its attention with ``transformers``."""


def _sdpa_gqa_without_grad(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Hugging Face's ``sdpa`` attention, except that on the CPU without gradient a grouped-query model's
    keys and values go to the kernel once per key/value head (``enable_gqa``) instead of copied once per
    query head: Hugging Face makes that copy whenever a padding mask is given, and in decoding it copies the
    whole cache at every layer and step. The kernel reads key/value head ``h // groups`` for query head
    ``h``, as the copy does, so the numbers are the same to the bit (``tests/test_generation.py``,
    ``tests/test_logprobs.py``). From transformers 5.23, ``sdpa`` decodes (one query position, with a mask)
    by packing the query heads of each key/value head instead, which sums in another order; this attention
    keeps the copy's numbers there, so a run samples the same on every transformers release we accept.
    With gradient, or on another device, it is ``sdpa`` itself: there the backward of the in-kernel version
    would sum the query heads' key and value gradients in another order."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if torch.is_grad_enabled() or groups == 1 or query.device.type != "cpu":
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = query.shape[2] > 1 and attention_mask is None and causal  # as sdpa_attention_forward decides
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


def in_kernel_gqa(model: Any) -> bool:
    """Switch a Hugging Face model that uses ``sdpa`` attention to :func:`_sdpa_gqa_without_grad` (with
    ``sdpa``'s masks): the same numbers, less copying in sampling and in forward passes without gradient
    (docs/benchmarks.md measures it). Returns whether it switched; a model with another attention is left as
    it is. The choice is not written by ``save_pretrained``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or not hasattr(
        model, "set_attn_implementation"
    ):
        return False
    AttentionInterface.register(IN_KERNEL_GQA, _sdpa_gqa_without_grad)
    AttentionMaskInterface.register(IN_KERNEL_GQA, sdpa_mask)
    model.set_attn_implementation(IN_KERNEL_GQA)
    return True


def pad_rows(index_U: torch.Tensor, num_rows: int) -> torch.Tensor:
    """``index_U`` (rows to compute) followed by copies of its first entry, up to ``min(num_rows,
    MIN_FORWARD_ROWS)`` entries (:data:`MIN_FORWARD_ROWS`); ``num_rows`` is the size of the whole batch."""
    missing = min(num_rows, MIN_FORWARD_ROWS) - index_U.shape[0]
    return torch.cat([index_U, index_U[:1].expand(missing)]) if missing > 0 else index_U


def stop_token_ids(model, tokenizer, eos_token_id: int | Sequence[int] | None = None) -> list[int]:
    """Token ids that end a response: ``eos_token_id`` if given, else the union of the tokenizer's EOS
    and the model's ``generation_config.eos_token_id`` (chat models often list several, e.g. Qwen's
    ``<|im_end|>`` and ``<|endoftext|>``)."""
    if eos_token_id is not None:
        ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    else:
        ids = []
        if tokenizer.eos_token_id is not None:
            ids.append(int(tokenizer.eos_token_id))
        gen_cfg = getattr(model, "generation_config", None)
        cfg_eos = getattr(gen_cfg, "eos_token_id", None)
        if cfg_eos is not None:
            ids.extend([cfg_eos] if isinstance(cfg_eos, int) else list(cfg_eos))
    ids = list(dict.fromkeys(int(i) for i in ids))
    if not ids:
        raise ValueError("no end-of-sequence token: the tokenizer has no eos_token_id; pass eos_token_id=")
    return ids


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token id lists to a common length: returns ``(ids_BP, mask_BP)``."""
    max_len = max(len(seq) for seq in sequences)
    ids_BP = torch.full((len(sequences), max_len), pad_id, dtype=torch.long)
    mask_BP = torch.zeros((len(sequences), max_len), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if len(seq):
            ids_BP[row, max_len - len(seq) :] = torch.as_tensor(list(seq), dtype=torch.long)
            mask_BP[row, max_len - len(seq) :] = 1
    return ids_BP, mask_BP


def prompt_position_ids(mask_BP: torch.Tensor) -> torch.Tensor:
    """Position ids for a left-padded batch: 0 at each row's first real token (padding gets 1, as
    Hugging Face ``generate`` does; padded positions are masked out so their value is irrelevant)."""
    pos_BP = mask_BP.long().cumsum(-1) - 1
    return pos_BP.masked_fill(mask_BP == 0, 1)


def sample_next_token(
    logits_BV: torch.Tensor,
    *,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; returns ``(token_B, logp_B)``.

    ``logp_B`` = log_softmax(logits / T)[token], the log-prob under the temperature-scaled distribution
    before top-p (T = 1 when greedy). Greedy (``temperature == 0``): argmax, no randomness.
    Top-p (Holtzman et al. 2020): keep the smallest set of most likely tokens whose probability mass
    reaches ``top_p`` (the most likely token is always kept), renormalise, and draw with
    ``torch.multinomial(..., generator=generator)`` over the tokens in descending-probability order
    (with ``top_p == 1`` the draw is over the whole vocabulary in id order, skipping the sort).
    Rows are drawn in one ``multinomial`` call, so a seeded generator makes the draw deterministic.
    """
    logits_BV = logits_BV.float()
    if temperature == 0:
        token_B = logits_BV.argmax(dim=-1)
        logp_BV = torch.log_softmax(logits_BV, dim=-1)
        return token_B, logp_BV.gather(-1, token_B[:, None]).squeeze(-1)
    logp_BV = torch.log_softmax(logits_BV / temperature if temperature != 1.0 else logits_BV, dim=-1)
    probs_BV = logp_BV.exp()
    draw_device = generator.device if generator is not None else probs_BV.device
    if top_p >= 1.0:  # no nucleus: draw over the vocabulary in id order, no sort
        token_B = torch.multinomial(probs_BV.to(draw_device), 1, generator=generator).squeeze(-1)
        token_B = token_B.to(probs_BV.device)
    else:
        sorted_probs_BV, sorted_idx_BV = probs_BV.sort(dim=-1, descending=True)
        mass_before_BV = sorted_probs_BV.cumsum(dim=-1) - sorted_probs_BV  # mass of strictly likelier tokens
        sorted_probs_BV = sorted_probs_BV.masked_fill(mass_before_BV >= top_p, 0.0)
        rank_B = torch.multinomial(sorted_probs_BV.to(draw_device), 1, generator=generator).squeeze(-1)
        token_B = sorted_idx_BV.gather(-1, rank_B.to(sorted_idx_BV.device)[:, None]).squeeze(-1)
    return token_B, logp_BV.gather(-1, token_B[:, None]).squeeze(-1)


def _encode_prompts(tokenizer, prompts: Sequence[str | Sequence[int]]) -> list[list[int]]:
    """Token ids of each prompt: strings go through ``tokenizer`` (its own special-token settings),
    lists of ints are taken as already tokenized."""
    encoded: list[list[int]] = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            encoded.append(list(tokenizer(prompt)["input_ids"]))
        elif isinstance(prompt, Sequence) and all(isinstance(t, int) for t in prompt):
            encoded.append([int(t) for t in prompt])
        else:
            raise TypeError(
                f"prompt {i} is a {type(prompt).__name__}, not a string or a list of token ids; check the "
                f"data that produced it (ebpo.data.loaders names the file and line of a non-string prompt)"
            )
        if not encoded[-1]:
            raise ValueError(f"prompt {i} is empty after tokenization")
    return encoded


def _forward_takes(model, name: str) -> bool:
    """Whether the model's forward has a parameter ``name`` (False where its signature cannot be read)."""
    import inspect

    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def keeps_last_logits(model) -> bool:
    """Whether the model's forward takes ``logits_to_keep=k`` (Hugging Face causal LMs do): logits for the
    last k positions only, instead of a (B, L, V) tensor (gigabytes for long prompts and a large vocab)."""
    return _forward_takes(model, "logits_to_keep")


def cache_argument(model) -> str:
    """The name under which the model's forward takes its KV cache: ``cache`` where it has that parameter
    (transformers 5.24 renamed it, and warns on ``past_key_values``), else ``past_key_values``."""
    return "cache" if _forward_takes(model, "cache") else "past_key_values"


def returned_cache(out: Any) -> Any:
    """The KV cache in a forward's output, under either name (see :func:`cache_argument`)."""
    return out.cache if hasattr(out, "cache") else out.past_key_values


def _last_logits_only(model) -> dict[str, int]:
    """``{"logits_to_keep": 1}`` when the model takes it: the prefill computes the last position's logits."""
    return {"logits_to_keep": 1} if keeps_last_logits(model) else {}


def _sample_per_prompt(
    logits_AV: torch.Tensor,
    prompt_A: torch.Tensor,
    generators: Sequence[torch.Generator],
    *,
    temperature: float,
    top_p: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sample_next_token` with each prompt's rows drawn from that prompt's own generator.

    ``prompt_A`` (A,) gives the prompt of each active row, in ascending order (a prompt's rows are
    contiguous); prompt b's rows are drawn in one call with ``generators[b]``, so the draw depends only on
    that prompt's rows, never on which other prompts share the batch.
    """
    token_A = torch.empty(prompt_A.shape[0], dtype=torch.long, device=logits_AV.device)
    logp_A = torch.empty(prompt_A.shape[0], dtype=torch.float32, device=logits_AV.device)
    prompts_U, counts_U = torch.unique_consecutive(prompt_A, return_counts=True)
    start = 0
    for prompt, count in zip(prompts_U.tolist(), counts_U.tolist()):
        rows = slice(start, start + count)
        token_A[rows], logp_A[rows] = sample_next_token(
            logits_AV[rows], temperature=temperature, top_p=top_p, generator=generators[prompt]
        )
        start += count
    return token_A, logp_A


@torch.no_grad()
def _generate_chunk(
    model,
    prompt_ids_BP: torch.Tensor,
    prompt_mask_BP: torch.Tensor,
    *,
    n: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    generator: torch.Generator | None,
    stop_ids: list[int],
    pad_id: int,
    prompt_generators: Sequence[torch.Generator] | None = None,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Sample n responses for each of B prompts: returns ``(response_ids_NT, old_logp_NT, entropy_NT)`` on
    the CPU, N = B*n, right-padded with ``pad_id`` / 0 / 0 (``entropy_NT`` None without ``with_entropy``).
    A row's tokens stop after its first stop token. ``prompt_generators`` (B,), when given, replaces
    ``generator``: prompt b's rows draw from entry b."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    num_rows = prompt_ids_BP.shape[0] * n
    response_ids_NT = torch.full((num_rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    old_logp_NT = torch.zeros((num_rows, max_new_tokens), dtype=torch.float32, device=device)
    entropy_NT = torch.zeros_like(old_logp_NT) if with_entropy else None
    if max_new_tokens == 0:
        return response_ids_NT.cpu(), old_logp_NT.cpu(), None if entropy_NT is None else entropy_NT.cpu()
    stop_ids_S = torch.as_tensor(stop_ids, dtype=torch.long, device=device)

    # Prefill once per unique prompt. The cache then holds one row per distinct *prefix* (prompt and tokens
    # drawn so far): a row's next-token distribution depends only on its prefix, so rows that drew the same
    # tokens share one cache row and one forward per step (prefix_A maps the active rows to them). A row's
    # numbers do not depend on the other rows of a forward, so the draws equal those of a forward per row.
    mask_BP = prompt_mask_BP.to(device)
    cache_arg = cache_argument(model)
    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=prompt_ids_BP.to(device),
        attention_mask=mask_BP,
        position_ids=prompt_position_ids(mask_BP),
        use_cache=True,
        **{cache_arg: cache},
        **_last_logits_only(model),
    )
    cache = returned_cache(out)
    logits_UV = out.logits[:, -1, :].float()  # U = distinct prefixes, here the prompts
    attn_mask_UL = mask_BP  # L = tokens so far
    next_pos_U = attn_mask_UL.sum(-1)  # position of the next token = number of real tokens so far
    active_rows_A = torch.arange(num_rows, device=device)  # A = rows still active
    prefix_A = active_rows_A // n  # rows b*n .. b*n+n-1 answer prompt b
    del out

    for step in range(max_new_tokens):
        logits_AV = logits_UV[prefix_A]
        if prompt_generators is None:
            token_A, logp_A = sample_next_token(
                logits_AV, temperature=temperature, top_p=top_p, generator=generator
            )
        else:  # active rows stay in ascending order
            token_A, logp_A = _sample_per_prompt(
                logits_AV, active_rows_A // n, prompt_generators, temperature=temperature, top_p=top_p
            )
        response_ids_NT[active_rows_A, step] = token_A
        old_logp_NT[active_rows_A, step] = logp_A
        if entropy_NT is not None:  # of the distribution logp_A is taken from (T = 1 when greedy)
            entropy_NT[active_rows_A, step] = entropy_from_logits(logits_AV / (temperature or 1.0))
        if step == max_new_tokens - 1:
            break
        still_active_A = ~torch.isin(token_A, stop_ids_S)
        if not bool(still_active_A.any()):
            break
        if not bool(still_active_A.all()):  # finished rows leave
            keep_A = still_active_A.nonzero().squeeze(-1)
            active_rows_A, token_A, prefix_A = active_rows_A[keep_A], token_A[keep_A], prefix_A[keep_A]
        # the new prefixes: each distinct (prefix, token) of the active rows
        vocab = logits_UV.shape[-1]
        new_prefix_U, prefix_A = torch.unique(prefix_A * vocab + token_A, return_inverse=True)
        new_prefix_U = pad_rows(new_prefix_U, prefix_A.shape[0])
        parent_U, new_token_U = new_prefix_U // vocab, new_prefix_U % vocab
        num_cached = logits_UV.shape[0]
        if parent_U.shape[0] != num_cached or not torch.equal(
            parent_U, torch.arange(num_cached, device=device)
        ):
            # the cache rows change (a prefix split, ended or was topped up); else each row goes on as it is
            cache.batch_select_indices(parent_U)
            attn_mask_UL, next_pos_U = attn_mask_UL[parent_U], next_pos_U[parent_U]
        attn_mask_UL = torch.cat([attn_mask_UL, attn_mask_UL.new_ones((attn_mask_UL.shape[0], 1))], dim=1)
        out = model(
            input_ids=new_token_U[:, None],
            attention_mask=attn_mask_UL,
            position_ids=next_pos_U[:, None],
            use_cache=True,
            **{cache_arg: cache},
        )
        cache = returned_cache(out)
        logits_UV = out.logits[:, -1, :].float()
        next_pos_U = next_pos_U + 1
        del out
    return response_ids_NT.cpu(), old_logp_NT.cpu(), None if entropy_NT is None else entropy_NT.cpu()


def response_mask_from_ids(response_ids_NT: torch.Tensor, stop_ids: Sequence[int]) -> torch.Tensor:
    """1 on every token up to and including the first stop token of each row (all ones if none)."""
    is_stop_NT = torch.isin(response_ids_NT, torch.as_tensor(list(stop_ids), dtype=torch.long))
    stops_before_NT = is_stop_NT.long().cumsum(dim=1) - is_stop_NT.long()  # stop tokens strictly before t
    return (stops_before_NT == 0).long()


def sample(
    model,
    tokenizer,
    prompts: Sequence[str] | Sequence[Sequence[int]],
    *,
    n: int = 1,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 256,
    generator: torch.Generator | int | None = None,
    batch_size: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    generators: Sequence[torch.Generator | int] | None = None,
    with_entropy: bool = False,
) -> Rollouts:
    """Sample ``n`` responses per prompt with a KV cache; see the module docstring for the algorithm.

    Args:
        model: a Hugging Face causal LM (``model(input_ids, attention_mask, position_ids,
            past_key_values)`` -> ``.logits``, the cache named as :func:`cache_argument` says); CPU or CUDA;
            put in eval mode for the call and restored.
        tokenizer: its tokenizer (pad id: ``pad_token_id``, else the first EOS id).
        prompts: B strings (tokenized with the tokenizer's defaults; apply any chat template first) or B
            lists of token ids.
        n: responses per prompt (the group size G).
        temperature: softmax temperature; 0 means greedy decoding (argmax).
        top_p: nucleus sampling mass in (0, 1]; 1 disables it. Ignored when greedy.
        max_new_tokens: the most response tokens per row (EOS included).
        generator: a seeded ``torch.Generator`` (or an int seed) for the draws; ``None`` uses the global
            RNG. The draws depend on the seed and on ``batch_size`` (chunks consume it in order). An int
            seed makes a CPU generator; with a CUDA model, pass a generator on the model's device to
            avoid copying the probabilities to the host at every step.
        batch_size: the most rows (prompts x n) decoded together; prompts are chunked so each chunk holds
            ``max(1, batch_size // n)`` prompts. ``None``: all at once.
        eos_token_id: stop token id(s); default :func:`stop_token_ids`.
        generators: instead of ``generator``, one generator (or int seed) per prompt: prompt b's n rows
            are drawn from ``generators[b]`` alone, so its responses are the same whichever prompts share
            the call, in any order and any ``batch_size`` (up to the float rounding of a batched forward
            pass, which can differ with the batch's shape). One draw call per prompt and step instead of
            one per step. ``ebpo eval`` seeds one per problem.
        with_entropy: also return each response token's distribution's entropy (``Rollouts.entropy``); the
            draws are the same either way.

    Returns:
        :class:`Rollouts` with N = B*n rows, on the CPU.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of strings (or of token id lists), not one string")
    prompt_generators: list[torch.Generator] | None = None
    if generators is not None:
        if generator is not None:
            raise ValueError("pass either generator= (one for the call) or generators= (one per prompt)")
        if len(generators) != len(prompts):
            raise ValueError(
                f"generators: one generator per prompt: {len(prompts)} prompts, {len(generators)} generators"
            )
        prompt_generators = [
            torch.Generator(device="cpu").manual_seed(g) if isinstance(g, int) else g for g in generators
        ]
    if isinstance(generator, int):
        generator = torch.Generator(device="cpu").manual_seed(generator)

    stop_ids = stop_token_ids(model, tokenizer, eos_token_id)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
    encoded = _encode_prompts(tokenizer, prompts)
    num_prompts = len(encoded)
    prompts_per_chunk = num_prompts if batch_size is None else max(1, batch_size // n)

    was_training = model.training
    model.eval()
    try:
        chunks: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
        for start in range(0, num_prompts, max(1, prompts_per_chunk)):
            chunk_ids_BP, chunk_mask_BP = left_pad(encoded[start : start + prompts_per_chunk], pad_id)
            chunks.append(
                _generate_chunk(
                    model,
                    chunk_ids_BP,
                    chunk_mask_BP,
                    n=n,
                    temperature=temperature,
                    top_p=top_p,
                    max_new_tokens=max_new_tokens,
                    generator=generator,
                    stop_ids=stop_ids,
                    pad_id=pad_id,
                    prompt_generators=None
                    if prompt_generators is None
                    else prompt_generators[start : start + prompts_per_chunk],
                    with_entropy=with_entropy,
                )
            )
    finally:
        model.train(was_training)

    if chunks:
        response_ids_NT = torch.cat([ids for ids, _, _ in chunks], dim=0)
        old_logp_NT = torch.cat([logp for _, logp, _ in chunks], dim=0)
    else:
        response_ids_NT = torch.zeros((0, max_new_tokens), dtype=torch.long)
        old_logp_NT = torch.zeros((0, max_new_tokens), dtype=torch.float32)
    entropy_NT = None
    if with_entropy:
        entropies = [entropy for _, _, entropy in chunks if entropy is not None]
        entropy_NT = torch.cat(entropies) if entropies else torch.zeros_like(old_logp_NT)
    response_mask_NT = response_mask_from_ids(response_ids_NT, stop_ids)
    lengths_N = response_mask_NT.sum(dim=1)
    longest = int(lengths_N.max()) if len(lengths_N) else 0
    response_ids_NT = response_ids_NT[:, :longest].masked_fill(response_mask_NT[:, :longest] == 0, pad_id)
    old_logp_NT = old_logp_NT[:, :longest] * response_mask_NT[:, :longest]
    if entropy_NT is not None:
        entropy_NT = entropy_NT[:, :longest] * response_mask_NT[:, :longest]
    response_mask_NT = response_mask_NT[:, :longest]
    ended_N = torch.isin(response_ids_NT, torch.as_tensor(stop_ids, dtype=torch.long)).any(dim=1)

    texts, decoded = [], {}  # a group's responses often agree: each distinct one is decoded once
    kept_N = lengths_N - ended_N.long()  # tokens of a text: without the EOS token itself
    for tokens, kept in zip(response_ids_NT.tolist(), kept_N.tolist()):
        response = tuple(tokens[:kept])
        if response not in decoded:
            decoded[response] = tokenizer.decode(list(response), skip_special_tokens=True)
        texts.append(decoded[response])

    if encoded:
        prompt_ids_NP, prompt_mask_NP = (t.repeat_interleave(n, dim=0) for t in left_pad(encoded, pad_id))
    else:
        prompt_ids_NP = prompt_mask_NP = torch.zeros((0, 0), dtype=torch.long)
    return Rollouts(
        prompt_ids=prompt_ids_NP,
        prompt_mask=prompt_mask_NP,
        response_ids=response_ids_NT,
        response_mask=response_mask_NT,
        old_logp=old_logp_NT,
        texts=texts,
        lengths=lengths_N,
        truncated=~ended_N,
        group_index=torch.arange(num_prompts).repeat_interleave(n),
        entropy=entropy_NT,
    )
