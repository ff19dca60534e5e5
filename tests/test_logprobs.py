"""ebpo.logprobs: every path of ``logprobs`` held to ``reference_logprobs`` over random batches.

To the bit (``torch.equal``): distinct rows with their row padding, the output layer at the response positions
only (``logits_to_keep``, with and without ``requires_grad`` on the weights), parts of any size, the in-kernel
GQA attention, the forward with gradient (what lets the first update serve old log-probs) and
``OldLogprobs`` built that way, and ``step_kl`` against the k3 of reference log-probs. Within a bound: shared
prompts (log-probs and entropies 1e-5 absolute, weight gradients 1e-5 relative; measured at most 3.8e-6,
2.4e-6 and 2.1e-6 over 20 seeds of both models) and the sampler's own log-probs (5e-5; measured 5.7e-6).

The batches are drawn to look like a step's: a few prompts of 1 to 8 tokens, left-padded, shared by several
rows; responses of at most 1, 2, 3 or 6 tokens, right-padded; repeated rows; a failed reward's row (mask all
0). The models are tiny Llama models built here from a config, one with grouped-query attention (2 query heads
per key/value head and tied embeddings, as the shipped model) and one without.
"""

from __future__ import annotations

import copy

import pytest
import torch

from ebpo.generation import MIN_FORWARD_ROWS, in_kernel_gqa, sample
from ebpo.logprobs import LogprobOptions, LogProbs, OldLogprobs, Tokens, logprobs, reference_logprobs, step_kl
from ebpo.losses import kl_penalty, masked_mean

SEEDS = range(6)
VOCAB = 100
PAD, EOS = 0, 2


def tiny_llama(kv_heads: int, seed: int = 0, attention: str = "sdpa") -> torch.nn.Module:
    """A random 2-layer Llama (64 wide, 4 query heads, ``kv_heads`` key/value heads); a large init, so that its
    distributions are peaked and vary with the context."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=64,
        initializer_range=0.2,
        tie_word_embeddings=kv_heads == 2,  # the shipped model ties them
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=EOS,
        attn_implementation=attention,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


MODELS = {"gqa": 2, "mha": 4}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    return tiny_llama(MODELS[request.param])


def random_tokens(seed: int, max_rows: int = 12, max_prompt: int = 8) -> Tokens:
    """A batch as a step holds one: rows drawn from a few prompts, some rows repeated, one masked out; every
    response at most 1, 2, 3 or 6 tokens long (by seed)."""
    g = torch.Generator().manual_seed(seed)
    max_response = (1, 2, 3, 6)[seed % 4]

    def randint(low: int, high: int) -> int:  # in [low, high]
        return int(torch.randint(low, high + 1, (1,), generator=g))

    prompts = [torch.randint(3, VOCAB, (randint(1, max_prompt),), generator=g) for _ in range(randint(1, 4))]
    rows: list[tuple[torch.Tensor, torch.Tensor]] = []
    for _ in range(randint(1, max_rows)):
        if rows and randint(0, 2) == 0:  # a repeated row (a group's responses often agree)
            rows.append(rows[randint(0, len(rows) - 1)])
        else:
            response = torch.randint(3, VOCAB, (randint(1, max_response),), generator=g)
            rows.append((prompts[randint(0, len(prompts) - 1)], response))
    width_P = max(len(p) for p, _ in rows)
    width_T = max(len(r) for _, r in rows)
    tokens = Tokens(
        prompt_ids_BP=torch.full((len(rows), width_P), PAD),
        prompt_mask_BP=torch.zeros((len(rows), width_P), dtype=torch.long),
        response_ids_BT=torch.full((len(rows), width_T), PAD),
        response_mask_BT=torch.zeros((len(rows), width_T), dtype=torch.long),
    )
    for b, (prompt, response) in enumerate(rows):
        tokens.prompt_ids_BP[b, width_P - len(prompt) :] = prompt
        tokens.prompt_mask_BP[b, width_P - len(prompt) :] = 1
        tokens.response_ids_BT[b, : len(response)] = response
        tokens.response_mask_BT[b, : len(response)] = 1
    if len(rows) > 2:
        tokens.response_mask_BT[randint(0, len(rows) - 1)] = 0  # a failed reward's row
    return tokens


def temperature_of(seed: int) -> float:
    return (1.0, 0.7, 1.3)[seed % 3]


def reference(model, tokens: Tokens, temperature: float) -> LogProbs:
    with torch.no_grad():
        return reference_logprobs(model, tokens, temperature, with_entropy=True)


def assert_equal(fast: LogProbs, ref: LogProbs, what: str) -> None:
    assert torch.equal(fast.logp_BT, ref.logp_BT), what
    assert fast.entropy_BT is not None and ref.entropy_BT is not None
    assert torch.equal(fast.entropy_BT, ref.entropy_BT), what


# -- to the bit -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_without_gradient_every_part_size_equals_the_reference_to_the_bit(model, seed):
    """Distinct rows computed once (topped up to MIN_FORWARD_ROWS), the output layer at the response positions
    only, in parts of 1, 2, 3, 5 or all rows: the reference's log-probs and entropies, to the bit."""
    tokens, temperature = random_tokens(seed), temperature_of(seed)
    assert model.lm_head.weight.requires_grad  # what keeps logits_to_keep exact (ebpo.logprobs)
    ref = reference(model, tokens, temperature)
    for part_size in (None, 1, 2, 3, 5):
        options = LogprobOptions(temperature=temperature, part_size=part_size)
        with torch.no_grad():
            fast = logprobs(model, tokens, options, with_entropy=True)
        assert_equal(fast, ref, f"part_size={part_size}")


@pytest.mark.parametrize("requires_grad", [True, False])
def test_response_logits_only_on_short_responses_equal_the_reference_to_the_bit(model, requires_grad):
    """The output layer at the response positions only (logits_to_keep), on 1 to 24 rows with responses of 1
    to 3 tokens, whether the weights require gradient (the policy) or not: to the bit. (Keeping only the T + 1
    positions would run a product of fewer than 4 rows here, summed in another order: MIN_PRODUCT_ROWS.)"""
    from ebpo.logprobs import _forward

    g = torch.Generator().manual_seed(0)
    model.requires_grad_(requires_grad)
    try:
        for width_T in (1, 2, 3):
            for rows in (1, 2, 3, 5, 24):
                tokens = Tokens(
                    torch.randint(3, VOCAB, (rows, 6), generator=g),
                    torch.ones((rows, 6), dtype=torch.long),
                    torch.randint(3, VOCAB, (rows, width_T), generator=g),
                    torch.ones((rows, width_T), dtype=torch.long),
                )
                with torch.no_grad():
                    kept = _forward(model, tokens, LogprobOptions(), True, response_logits_only=True)
                assert_equal(kept, reference(model, tokens, 1.0), f"T={width_T}, rows={rows}")
    finally:
        model.requires_grad_(True)


def test_distinct_rows_by_hand():
    # rows 0 and 2 are equal; row 3 equals row 1 but for its response mask (a failed reward): 3 distinct rows
    from ebpo.logprobs import _distinct_rows

    tokens = Tokens(
        prompt_ids_BP=torch.tensor([[0, 5], [4, 5], [0, 5], [4, 5]]),
        prompt_mask_BP=torch.tensor([[0, 1], [1, 1], [0, 1], [1, 1]]),
        response_ids_BT=torch.tensor([[7, 2], [8, 2], [7, 2], [8, 2]]),
        response_mask_BT=torch.tensor([[1, 1], [1, 1], [1, 1], [0, 0]]),
    )
    first_U, inverse_B = _distinct_rows(tokens)
    assert sorted(first_U.tolist()) == [0, 1, 3]
    assert [int(first_U[u]) for u in inverse_B] == [0, 1, 0, 3]
    assert _distinct_rows(tokens.rows(slice(0, 2))) is None


def test_distinct_rows_run_once_topped_up_to_min_forward_rows(model):
    """25 rows drawn from 12, the last one masked out (a failed reward: another row than the one it repeats):
    one forward of MIN_FORWARD_ROWS = 16 rows (the 13 distinct ones and 3 copies), copied to the repeats,
    equal to the reference to the bit."""
    pool = random_tokens(0, max_rows=1).rows(torch.zeros(12, dtype=torch.long))
    pool = Tokens(
        pool.prompt_ids_BP,
        pool.prompt_mask_BP,
        torch.randint(3, VOCAB, (12, 4), generator=torch.Generator().manual_seed(1)),
        torch.ones((12, 4), dtype=torch.long),
    )
    tokens = pool.rows(
        torch.tensor([0, 5, 5, 11, 0, 3, 3, 3, 7, 1, 2, 4, 6, 8, 9, 10, 0, 5, 11, 2, 2, 9, 1, 1, 0])
    )
    tokens.response_mask_BT[-1] = 0
    seen: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    with torch.no_grad():
        fast = logprobs(model, tokens, LogprobOptions(), with_entropy=True)
    hook.remove()
    assert seen == [MIN_FORWARD_ROWS]
    assert_equal(fast, reference(model, tokens, 1.0), "distinct rows")


@pytest.mark.parametrize("rows,width_P,width_T", [(2, 1, 1), (5, 1, 2), (5, 2, 1)])
def test_a_repeated_short_row_is_topped_up_to_the_bit(model, rows, width_P, width_T):
    """One row of 2-3 tokens repeated: its one forward, alone, would be products of 2-3 rows, summed in another
    order than the reference's over every row; topped up with copies to min(B, MIN_FORWARD_ROWS) rows it
    equals the reference to the bit."""
    tokens = Tokens(
        torch.full((rows, width_P), 7),
        torch.ones((rows, width_P), dtype=torch.long),
        torch.full((rows, width_T), 9),
        torch.ones((rows, width_T), dtype=torch.long),
    )
    with torch.no_grad():
        fast = logprobs(model, tokens, LogprobOptions(), with_entropy=True)
    assert_equal(fast, reference(model, tokens, 1.0), "one distinct row")


@pytest.mark.parametrize("seed", SEEDS)
def test_the_forward_with_gradient_equals_the_passes_without_it_to_the_bit(model, seed):
    """With gradient every row of the micro-batch goes through the whole model: the log-probs of any subset of
    rows equal the reference over the whole batch to the bit (so the first update's forward can serve old
    log-probs), and the weight gradients are the reference's own."""
    tokens, temperature = random_tokens(seed), temperature_of(seed)
    ref = reference(model, tokens, temperature)
    g = torch.Generator().manual_seed(100 + seed)
    rows = torch.randperm(tokens.num_rows, generator=g)[
        : int(torch.randint(1, tokens.num_rows + 1, (1,), generator=g))
    ]
    part = tokens.rows(rows)
    grads = []
    for compute in (
        lambda: logprobs(model, part, LogprobOptions(temperature=temperature), with_entropy=True),
        lambda: reference_logprobs(model, part, temperature, with_entropy=True),
    ):
        model.zero_grad(set_to_none=True)
        current = compute()
        (current.logp_BT * part.response_mask_BT).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        assert_equal(
            LogProbs(current.logp_BT.detach(), current.entropy_BT),
            LogProbs(ref.logp_BT[rows], ref.entropy_BT[rows]),
            "grad",
        )
    assert torch.equal(grads[0], grads[1])
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("seed", SEEDS)
def test_old_logprobs_served_by_the_first_update_equal_the_reference_to_the_bit(model, seed):
    """OldLogprobs.at_sampling runs the pass over the other rows; the first update's parts, forwards with
    gradient at the sampling policy, hand theirs to take(): together every row's old log-prob and entropy is
    the reference's, to the bit."""
    tokens, temperature = random_tokens(seed), temperature_of(seed)
    g = torch.Generator().manual_seed(200 + seed)
    order = torch.randperm(tokens.num_rows, generator=g)
    first_size = int(torch.randint(1, tokens.num_rows + 1, (1,), generator=g))
    options = LogprobOptions(temperature=temperature, part_size=int(torch.randint(1, 4, (1,), generator=g)))
    old = OldLogprobs.at_sampling(
        model, tokens, options, first_update=order[:first_size], others=order[first_size:]
    )
    for part in order[:first_size].split(options.part_size):
        assert old.pending(part)
        current = logprobs(model, tokens.rows(part), options, with_entropy=True)
        assert torch.equal(old.take(part, current), current.logp_BT.detach())
        assert not old.pending(part)
    assert_equal(LogProbs(old.logp_BT, old.entropy_BT), reference(model, tokens, temperature), "old")
    later = order[:first_size]  # a later update's rows read the kept numbers
    kept = old.take(later, LogProbs(torch.zeros(len(later), tokens.response_ids_BT.shape[1]), None))
    assert torch.equal(kept, old.logp_BT[later])


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_in_kernel_gqa_equals_sdpa_to_the_bit(seed):
    """The grouped-query model switched to the in-kernel attention (as the trainer and ebpo eval load it):
    every path without gradient, and the forward with gradient and its weight gradients, equal the plain
    sdpa model's reference to the bit."""
    plain = tiny_llama(kv_heads=2)
    fast = copy.deepcopy(plain)
    assert in_kernel_gqa(fast)
    tokens, temperature = random_tokens(seed), temperature_of(seed)
    ref = reference(plain, tokens, temperature)
    for part_size in (None, 2):
        with torch.no_grad():
            ours = logprobs(
                fast, tokens, LogprobOptions(temperature=temperature, part_size=part_size), with_entropy=True
            )
        assert_equal(ours, ref, f"gqa part_size={part_size}")
    grads = []
    for model in (plain, fast):
        current = logprobs(model, tokens, LogprobOptions(temperature=temperature))
        (current.logp_BT * tokens.response_mask_BT).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        assert torch.equal(current.logp_BT.detach(), ref.logp_BT)
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_step_kl_is_the_k3_of_reference_logprobs_over_all_rows_or_every_stride_th(model, seed):
    """step_kl: masked mean of k3(old, new) over every response token ("all"), over those of rows 0, U, 2U, ...
    ("subset"), or None ("none"); the new log-probs are the reference's, to the bit."""
    tokens, temperature = random_tokens(seed), temperature_of(seed)
    old_logp_BT = reference(model, tokens, temperature).logp_BT + 0.01 * torch.randn(
        tokens.response_ids_BT.shape
    )
    new_logp_BT = reference(model, tokens, temperature).logp_BT
    for scope, rows in (("all", slice(None)), ("subset", slice(0, None, 3))):
        options = LogprobOptions(temperature=temperature, step_kl=scope)
        expected = masked_mean(
            kl_penalty(old_logp_BT[rows], new_logp_BT[rows], "k3"), tokens.response_mask_BT[rows]
        )
        assert step_kl(model, tokens, old_logp_BT, options, stride=3) == float(expected)
    assert step_kl(model, tokens, old_logp_BT, LogprobOptions(step_kl="none"), stride=3) is None


# -- within a tolerance -----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed,max_prompt", [(seed, 8) for seed in SEEDS] + [(0, 1), (1, 1)])
def test_shared_prompts_equal_the_reference_within_rounding(model, seed, max_prompt):
    """Each distinct prompt runs once, packed, and the responses on its cached keys and values: log-probs and
    entropies within 1e-5 of the reference, weight gradients within 1e-5 relative, with and without
    gradient."""
    tokens, temperature = random_tokens(seed, max_prompt=max_prompt), temperature_of(seed)
    mask_BT = tokens.response_mask_BT.bool()
    options = LogprobOptions(temperature=temperature, shared_prompts=True)
    ref = reference(model, tokens, temperature)
    with torch.no_grad():
        shared = logprobs(model, tokens, options, with_entropy=True)
    assert float((shared.logp_BT - ref.logp_BT).abs()[mask_BT].max()) < 1e-5
    assert float((shared.entropy_BT - ref.entropy_BT).abs()[mask_BT].max()) < 1e-5
    grads = []
    for compute in (
        lambda: logprobs(model, tokens, options),
        lambda: reference_logprobs(model, tokens, temperature),
    ):
        model.zero_grad(set_to_none=True)
        current = compute()
        (current.logp_BT * mask_BT).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        assert float((current.logp_BT.detach() - ref.logp_BT).abs()[mask_BT].max()) < 1e-5
    assert float((grads[0] - grads[1]).norm() / grads[1].norm()) < 1e-5
    model.zero_grad(set_to_none=True)


def _forward_shapes(model, compute) -> list[tuple[int, ...]]:
    """The ``input_ids`` shape of each forward ``compute()`` runs."""
    shapes: list[tuple[int, ...]] = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    try:
        compute()
    finally:
        hook.remove()
    return shapes


@pytest.mark.parametrize("seed,max_prompt", [(seed, 8) for seed in SEEDS] + [(0, 1), (1, 1)])
def test_shared_prompts_run_packed_then_the_responses(model, seed, max_prompt):
    """The distinct prompts less their last token run packed into rows as long as the longest (first fit, so
    any two rows together hold more than one row's width), then every row's last prompt token and response
    in one forward: (rows, 1 + T - 1). Prompts of one token leave nothing to cache: that second forward
    alone."""
    tokens = random_tokens(seed, max_prompt=max_prompt)
    shapes = _forward_shapes(model, lambda: logprobs(model, tokens, LogprobOptions(shared_prompts=True)))
    real = [ids[m.bool()].tolist() for ids, m in zip(tokens.prompt_ids_BP, tokens.prompt_mask_BP)]
    cached = [len(p) - 1 for p in {tuple(p) for p in real}]
    last = (tokens.num_rows, tokens.response_ids_BT.shape[1])  # with gradient: every row
    if max(cached) == 0:
        assert shapes == [last]
        return
    (bins, width), forward = shapes
    assert width == max(cached) and sum(cached) <= bins * width
    assert 2 * sum(cached) > (bins - 1) * width
    assert forward == last


def test_shared_prompts_with_eager_attention_and_a_refusal_for_others():
    """With eager attention the packed prompts get an additive mask (sdpa takes a boolean one): the reference's
    log-probs within rounding. An attention that takes no 4-D mask is refused by name."""
    from ebpo.errors import ConfigError

    model = tiny_llama(kv_heads=2, attention="eager")
    tokens = random_tokens(3)
    with torch.no_grad():
        shared = logprobs(model, tokens, LogprobOptions(shared_prompts=True))
    mask_BT = tokens.response_mask_BT.bool()
    assert float((shared.logp_BT - reference(model, tokens, 1.0).logp_BT).abs()[mask_BT].max()) < 1e-5
    model.config._attn_implementation = "flash_attention_2"  # as loaded with it (not installed here)
    with pytest.raises(ConfigError, match=r"^optim\.shared_prompts=true .*'flash_attention_2'"):
        logprobs(model, tokens, LogprobOptions(shared_prompts=True))


class _IdTokenizer:
    """Enough of a tokenizer for ``sample`` on prompts given as token ids."""

    eos_token_id, pad_token_id = EOS, PAD

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_the_samplers_logprobs_equal_the_reference_within_rounding(model, seed):
    """The log-probs and entropies the sampler records (rollout.old_logp=sampler) are those of the reference on
    its rows within 5e-5: the same distribution, computed incrementally with a cache instead of in one
    forward, so summed in another order."""
    g = torch.Generator().manual_seed(300 + seed)
    prompts = [
        torch.randint(3, VOCAB, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist()
        for _ in range(3)
    ]
    temperature = temperature_of(seed)
    rollouts = sample(
        model,
        _IdTokenizer(),
        prompts,
        n=4,
        temperature=temperature,
        max_new_tokens=6,
        generator=seed,
        with_entropy=True,
    )
    tokens = Tokens.from_rollouts(rollouts)
    mask_BT = tokens.response_mask_BT.bool()
    ref = reference(model, tokens, temperature)
    assert float((rollouts.old_logp - ref.logp_BT).abs()[mask_BT].max()) < 5e-5
    assert float((rollouts.entropy - ref.entropy_BT).abs()[mask_BT].max()) < 5e-5
    options = LogprobOptions(temperature=temperature, old_logp="sampler")
    old = OldLogprobs.at_sampling(
        model,
        tokens,
        options,
        first_update=torch.arange(4),
        others=torch.arange(4, 12),
        sampled=LogProbs(rollouts.old_logp, rollouts.entropy),
    )
    assert not old.pending(torch.arange(12)) and old.logp_BT is rollouts.old_logp
