"""Tests for ebpo.generation.sample: KV-cache decoding against a no-cache reference, HF greedy, EOS, logp."""

from __future__ import annotations

import math

import pytest
import torch

from ebpo.generation import (
    MIN_FORWARD_ROWS,
    cache_argument,
    left_pad,
    pad_rows,
    prompt_position_ids,
    response_mask_from_ids,
    returned_cache,
    sample,
    sample_next_token,
)

PROMPTS = ["1+2=", "What is 33*4?", "7"]


@pytest.fixture(scope="module")
def spiky(tmp_path_factory):
    """A tiny model with large initial weights, so its next-token distributions are peaked and vary with
    the context (the default init gives nearly uniform logits and a greedy output of one repeated token)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ebpo.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("spiky"), seed=3, initializer_range=0.3)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    return model, AutoTokenizer.from_pretrained(path)


def frequent_tokens(model, tokenizer, k: int) -> list[int]:
    """The k tokens greedy decoding emits most often: used as stop ids so rows end at different steps."""
    out = sample(
        model, tokenizer, PROMPTS, temperature=1.0, n=4, max_new_tokens=16, generator=11, eos_token_id=[0]
    )
    counts = torch.bincount(out.response_ids.flatten(), minlength=len(tokenizer))
    counts[tokenizer.pad_token_id] = 0
    return counts.argsort(descending=True)[:k].tolist()


@torch.no_grad()
def reference_sample(model, tokenizer, prompts, *, n, temperature, top_p, max_new_tokens, seed, stop_ids):
    """Slow reference: no KV cache; every step re-runs the full forward over prompt + tokens so far for the
    rows still active (in row order) and draws with the same sample_next_token. Returns token lists."""
    pad_id = tokenizer.pad_token_id
    generator = torch.Generator().manual_seed(seed)
    rows = [list(tokenizer(p)["input_ids"]) for p in prompts for _ in range(n)]
    responses: list[list[int]] = [[] for _ in rows]
    active = list(range(len(rows)))
    for _ in range(max_new_tokens):
        ids_AL, mask_AL = left_pad([rows[r] + responses[r] for r in active], pad_id)
        logits_AV = model(
            input_ids=ids_AL, attention_mask=mask_AL, position_ids=prompt_position_ids(mask_AL)
        ).logits[:, -1]
        token_A, _ = sample_next_token(logits_AV, temperature=temperature, top_p=top_p, generator=generator)
        for r, tok in zip(active, token_A.tolist()):
            responses[r].append(tok)
        active = [r for r in active if responses[r][-1] not in stop_ids]
        if not active:
            break
    return responses


def as_lists(rollouts) -> list[list[int]]:
    return [row[: int(length)].tolist() for row, length in zip(rollouts.response_ids, rollouts.lengths)]


@pytest.mark.parametrize(
    "n,temperature,top_p,seed",
    [(1, 1.0, 1.0, 0), (3, 0.7, 0.9, 1), (2, 1.3, 0.5, 2), (4, 1.0, 1.0, 3), (2, 0.0, 1.0, 4)],
)
def test_kv_cache_matches_no_cache_reference(spiky, n, temperature, top_p, seed):
    model, tok = spiky
    stop_ids = frequent_tokens(model, tok, 3)  # rows stop at different steps, exercising the row dropping
    fast = sample(
        model,
        tok,
        PROMPTS,
        n=n,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=14,
        generator=torch.Generator().manual_seed(seed),
        eos_token_id=stop_ids,
    )
    slow = reference_sample(
        model,
        tok,
        PROMPTS,
        n=n,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=14,
        seed=seed,
        stop_ids=stop_ids,
    )
    assert as_lists(fast) == slow
    assert fast.truncated.tolist() == [resp[-1] not in stop_ids for resp in slow]


@torch.no_grad()
def reference_row_cache_sample(
    model, tokenizer, prompts, *, n, temperature, top_p, max_new_tokens, seed, stop_ids
):
    """Reference for prefix sharing: the KV cache holds one row per response (the prompt's prefill repeated n
    times) and every step runs a forward over every active row. Returns (response ids, log-probs, entropies)
    as lists per row."""
    from transformers import DynamicCache

    from ebpo.losses import entropy_from_logits

    ids_BP, mask_BP = left_pad([list(tokenizer(p)["input_ids"]) for p in prompts], tokenizer.pad_token_id)
    generator = torch.Generator().manual_seed(seed)
    out = model(
        input_ids=ids_BP,
        attention_mask=mask_BP,
        position_ids=prompt_position_ids(mask_BP),
        **{cache_argument(model): DynamicCache(config=model.config)},
        use_cache=True,
        logits_to_keep=1,
    )
    cache = returned_cache(out)
    cache.batch_repeat_interleave(n)
    logits_AV = out.logits[:, -1].float().repeat_interleave(n, dim=0)
    mask_AL = mask_BP.repeat_interleave(n, dim=0)
    active = list(range(ids_BP.shape[0] * n))
    rows = {r: ([], [], []) for r in active}
    for step in range(max_new_tokens):
        token_A, logp_A = sample_next_token(
            logits_AV, temperature=temperature, top_p=top_p, generator=generator
        )
        entropy_A = entropy_from_logits(logits_AV / (temperature or 1.0))
        for i, r in enumerate(active):
            for values, value in zip(rows[r], (token_A[i], logp_A[i], entropy_A[i])):
                values.append(value.item())
        keep = [i for i, tok in enumerate(token_A.tolist()) if tok not in stop_ids]
        if not keep or step == max_new_tokens - 1:
            break
        keep_A = torch.tensor(keep)
        cache.batch_select_indices(keep_A)
        active, token_A, mask_AL = [active[i] for i in keep], token_A[keep_A], mask_AL[keep_A]
        mask_AL = torch.cat([mask_AL, mask_AL.new_ones((len(keep), 1))], dim=1)
        out = model(
            input_ids=token_A[:, None],
            attention_mask=mask_AL,
            position_ids=mask_AL.sum(-1, keepdim=True) - 1,
            **{cache_argument(model): cache},
            use_cache=True,
        )
        cache, logits_AV = returned_cache(out), out.logits[:, -1].float()
    return [rows[r] for r in sorted(rows)]


@pytest.mark.parametrize("n,temperature,top_p,seed", [(8, 1.0, 1.0, 0), (6, 0.7, 0.9, 1), (5, 0.0, 1.0, 2)])
def test_rows_that_drew_the_same_tokens_share_a_forward_to_the_bit(spiky, n, temperature, top_p, seed):
    """The sampler runs one forward per distinct prefix (rows of a prompt that drew the same tokens so far);
    the draws, log-probs and entropies equal, to the bit, those of a cache with one row per response, and
    fewer rows go through the model."""
    model, tok = spiky
    stop_ids = frequent_tokens(model, tok, 3)
    settings = dict(n=n, temperature=temperature, top_p=top_p, max_new_tokens=14)
    forward_rows = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: forward_rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        generator = torch.Generator().manual_seed(seed)
        shared = sample(
            model, tok, PROMPTS, generator=generator, eos_token_id=stop_ids, with_entropy=True, **settings
        )
    finally:
        hook.remove()
    reference = reference_row_cache_sample(model, tok, PROMPTS, seed=seed, stop_ids=stop_ids, **settings)
    mask_NT = shared.response_mask.bool()
    for row, (ids, logps, entropies) in enumerate(reference):
        assert shared.response_ids[row][mask_NT[row]].tolist() == ids
        assert shared.old_logp[row][mask_NT[row]].tolist() == logps  # float32 -> Python float: exact
        assert shared.entropy[row][mask_NT[row]].tolist() == entropies
    decode_rows = sum(forward_rows[1:])  # after the prefill
    assert decode_rows < int(shared.lengths.clamp(max=13).sum())  # a forward per row would be this many


def test_pad_rows_tops_up_few_rows_with_copies():
    # a batch of 40 rows with 3 distinct ones: topped up to MIN_FORWARD_ROWS = 16 rows with copies of the first;
    # a batch of 5 rows: to 5; enough rows: unchanged
    index = torch.tensor([7, 2, 9])
    assert pad_rows(index, 40).tolist() == [7, 2, 9] + [7] * 13 and MIN_FORWARD_ROWS == 16
    assert pad_rows(index, 5).tolist() == [7, 2, 9, 7, 7]
    assert pad_rows(torch.arange(20), 40).tolist() == list(range(20))


def test_greedy_matches_hf_generate(spiky):
    model, tok = spiky
    ours = sample(model, tok, PROMPTS, temperature=0.0, max_new_tokens=24)
    enc = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    hf = model.generate(
        **enc,
        do_sample=False,
        max_new_tokens=24,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    hf_resp = hf[:, enc["input_ids"].shape[1] :]
    # the comparison means something only if greedy output is not one token repeated
    assert len(set(hf_resp.flatten().tolist())) > 3
    width = ours.response_ids.shape[1]
    assert torch.equal(ours.response_ids, hf_resp[:, :width])
    assert bool((hf_resp[:, width:] == tok.pad_token_id).all())


def test_eos_padding_masks_and_texts(spiky):
    model, tok = spiky
    stop_ids = frequent_tokens(model, tok, 2)
    out = sample(model, tok, PROMPTS, n=3, max_new_tokens=10, generator=5, eos_token_id=stop_ids)
    N, T = out.response_ids.shape
    assert N == 9 and T == int(out.lengths.max()) <= 10
    assert out.group_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert torch.equal(out.lengths, out.response_mask.sum(1))
    for row in range(N):
        length = int(out.lengths[row])
        ids = out.response_ids[row].tolist()
        # mask is a prefix of ones; after it, pad ids and zero logp
        assert out.response_mask[row].tolist() == [1] * length + [0] * (T - length)
        assert all(t == tok.pad_token_id for t in ids[length:])
        assert bool((out.old_logp[row, length:] == 0).all()) and bool((out.old_logp[row, :length] < 0).all())
        stops_in = [i for i, t in enumerate(ids[:length]) if t in stop_ids]
        if out.truncated[row]:
            assert stops_in == [] and length == 10
        else:  # exactly one stop token, the last one inside the mask
            assert stops_in == [length - 1]
        body = ids[: length - (0 if out.truncated[row] else 1)]
        assert out.texts[row] == tok.decode(body, skip_special_tokens=True)
    assert bool(out.truncated.any()) and bool((~out.truncated).any())  # both kinds exercised
    # prompts: left padded, mask matches
    assert torch.equal(out.prompt_mask, (out.prompt_ids != tok.pad_token_id).long())
    assert out.prompt_mask[:, -1].all()


def test_response_mask_from_ids_by_hand():
    # stop id 2: row 0 stops at t=1 -> mask 1,1,0,0; row 1 never stops -> all ones; row 2 stops at t=0
    ids = torch.tensor([[5, 2, 0, 2], [5, 6, 7, 8], [2, 9, 2, 0]])
    assert response_mask_from_ids(ids, [2]).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]


def test_determinism_and_seed_sensitivity(spiky):
    model, tok = spiky
    a = sample(model, tok, PROMPTS, n=2, max_new_tokens=12, generator=torch.Generator().manual_seed(7))
    b = sample(model, tok, PROMPTS, n=2, max_new_tokens=12, generator=7)
    c = sample(model, tok, PROMPTS, n=2, max_new_tokens=12, generator=8)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.old_logp, b.old_logp)
    assert a.texts == b.texts
    assert not torch.equal(a.response_ids, c.response_ids)


@torch.no_grad()
def response_logits(model, out) -> torch.Tensor:
    """Logits (N, T, V) predicting each response token, from one full forward over prompt + response."""
    ids_NL = torch.cat([out.prompt_ids, out.response_ids], dim=1)
    mask_NL = torch.cat([out.prompt_mask, out.response_mask], dim=1)
    logits_NLV = model(
        input_ids=ids_NL, attention_mask=mask_NL, position_ids=prompt_position_ids(mask_NL)
    ).logits
    return logits_NLV[:, out.prompt_ids.shape[1] - 1 : -1].float()


def test_old_logp_equals_recomputed_forward(spiky):
    """PPO's first ratio exp(logp - old_logp) must be 1: recompute logp with one full forward pass over
    prompt + response at the sampling temperature."""
    model, tok = spiky
    temperature = 0.8
    out = sample(model, tok, PROMPTS, n=2, temperature=temperature, top_p=0.9, max_new_tokens=12, generator=3)
    logits_NTV = response_logits(model, out) / temperature
    logp_NT = torch.log_softmax(logits_NTV, -1).gather(-1, out.response_ids[..., None]).squeeze(-1)
    logp_NT = logp_NT * out.response_mask
    assert torch.allclose(logp_NT, out.old_logp, atol=1e-4)
    ratio = torch.exp(logp_NT - out.old_logp)[out.response_mask.bool()]
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-4)


def test_entropy_is_the_recomputed_forwards_and_changes_no_draw(spiky):
    """with_entropy records, per response token, the entropy of the distribution old_logp comes from (the
    temperature-scaled one, T = 1 when greedy), as one full forward pass gives it; the draws are unchanged."""
    from ebpo.losses import entropy_from_logits

    model, tok = spiky
    for temperature in (0.8, 0.0):
        kwargs = dict(n=2, temperature=temperature, top_p=0.9, max_new_tokens=12, generator=3)
        out = sample(model, tok, PROMPTS, with_entropy=True, **kwargs)
        plain = sample(model, tok, PROMPTS, **kwargs)
        assert plain.entropy is None and out.entropy is not None and out.entropy.dtype == torch.float32
        assert torch.equal(out.response_ids, plain.response_ids) and torch.equal(out.old_logp, plain.old_logp)
        entropy_NT = entropy_from_logits(response_logits(model, out) / (temperature or 1.0))
        assert torch.allclose(entropy_NT * out.response_mask, out.entropy, atol=1e-4)
        assert bool((out.entropy[out.response_mask == 0] == 0).all())


def test_batch_size_chunks_and_token_id_prompts_match(spiky):
    model, tok = spiky
    full = sample(model, tok, PROMPTS, n=2, temperature=0.0, max_new_tokens=10)
    chunked = sample(model, tok, PROMPTS, n=2, temperature=0.0, max_new_tokens=10, batch_size=2)
    ids_prompts = [tok(p)["input_ids"] for p in PROMPTS]
    from_ids = sample(model, tok, ids_prompts, n=2, temperature=0.0, max_new_tokens=10)
    assert torch.equal(full.response_ids, chunked.response_ids)
    assert torch.equal(full.response_ids, from_ids.response_ids)
    assert torch.equal(full.prompt_ids, chunked.prompt_ids)
    assert torch.allclose(full.old_logp, chunked.old_logp, atol=1e-5)


def test_tiny_top_p_is_greedy(spiky):
    """top_p -> 0 keeps only the most likely token, so sampling equals greedy decoding."""
    model, tok = spiky
    greedy = sample(model, tok, PROMPTS, temperature=0.0, max_new_tokens=10)
    nucleus = sample(model, tok, PROMPTS, temperature=1.0, top_p=1e-6, max_new_tokens=10, generator=0)
    assert torch.equal(greedy.response_ids, nucleus.response_ids)


def test_sample_next_token_top_p_support():
    # probs 0.5, 0.3, 0.15, 0.05: top_p = 0.7 keeps {0, 1} (0.5 < 0.7, 0.5 + 0.3 >= 0.7), never 2 or 3
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(4000, 1)
    gen = torch.Generator().manual_seed(0)
    token, logp = sample_next_token(logits, temperature=1.0, top_p=0.7, generator=gen)
    assert set(token.tolist()) == {0, 1}
    # renormalised: P(0) = 0.5 / 0.8 = 0.625
    assert abs((token == 0).float().mean().item() - 0.625) < 0.03
    # logp is before top-p: log 0.5 for token 0, log 0.3 for token 1
    assert torch.allclose(logp[token == 0], torch.log(torch.tensor(0.5)))
    assert torch.allclose(logp[token == 1], torch.log(torch.tensor(0.3)))


def test_training_mode_restored_and_bad_input(spiky):
    model, tok = spiky
    model.train()
    sample(model, tok, PROMPTS[:1], max_new_tokens=2, generator=0)
    assert model.training
    model.eval()
    with pytest.raises(ValueError, match="top_p"):
        sample(model, tok, PROMPTS, top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        sample(model, tok, PROMPTS, temperature=-1)
    with pytest.raises(ValueError, match=r"^n .*\b0$"):
        sample(model, tok, PROMPTS, n=0)
    with pytest.raises(TypeError, match=r"^prompts\b"):
        sample(model, tok, "1+1=")
    with pytest.raises(ValueError, match=r"^prompt 1 "):
        sample(model, tok, ["1", ""])


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.8, 0.9)])
def test_per_prompt_generators_make_rows_independent_of_the_batch(spiky, temperature, top_p):
    """With ``generators`` (one per prompt, what ``ebpo eval --limit`` relies on), prompt b's rows equal sampling
    prompt b alone with a generator seeded the same, whichever prompts share the call, in which order, and
    however batch_size chunks them. Rows stop at different steps, so prompts drop rows mid-call."""
    model, tok = spiky
    stop_ids = frequent_tokens(model, tok, 2)
    seeds = {p: 100 + i for i, p in enumerate(PROMPTS)}
    kw = dict(n=3, temperature=temperature, top_p=top_p, max_new_tokens=12, eos_token_id=stop_ids)
    # the reference: each prompt alone, the single-generator path (one draw over that prompt's rows)
    alone = {
        p: sample(model, tok, [p], generator=torch.Generator().manual_seed(seeds[p]), **kw) for p in PROMPTS
    }
    for prompts, batch_size in [
        (PROMPTS, None),
        (PROMPTS, 3),
        (PROMPTS, 6),
        (PROMPTS[::-1], None),
        (PROMPTS[1:], 4),
    ]:
        generators = [torch.Generator().manual_seed(seeds[p]) for p in prompts]
        together = sample(model, tok, prompts, generators=generators, batch_size=batch_size, **kw)
        for b, p in enumerate(prompts):
            rows = slice(3 * b, 3 * b + 3)
            assert as_lists(together)[rows] == as_lists(alone[p]), (prompts, batch_size, p)
            assert together.texts[rows] == alone[p].texts
            width = int(alone[p].lengths.max())
            assert torch.allclose(together.old_logp[rows, :width], alone[p].old_logp, atol=1e-5)
    # the rows really differ between prompts and seeds, so the equalities above are not vacuous
    assert len({tuple(t) for t in as_lists(alone[PROMPTS[0]])}) > 1
    other = sample(model, tok, PROMPTS[:1], generators=[torch.Generator().manual_seed(999)], **kw)
    assert as_lists(other) != as_lists(alone[PROMPTS[0]])
    # int seeds work like generators seeded with them
    by_int = sample(model, tok, PROMPTS, generators=[seeds[p] for p in PROMPTS], **kw)
    assert by_int.texts == [t for p in PROMPTS for t in alone[p].texts]


def test_generators_argument_errors(spiky):
    model, tok = spiky
    with pytest.raises(ValueError, match="3 prompts, 2 generators"):
        sample(model, tok, PROMPTS, generators=[1, 2])
    with pytest.raises(ValueError, match=r"generator= .*generators="):
        sample(model, tok, PROMPTS, generator=0, generators=[1, 2, 3])


def test_non_text_prompt_names_the_prompt(spiky):
    """A prompt that is neither a string nor token ids (a number from a data file) fails with its index,
    not inside the tokenizer."""
    model, tok = spiky
    with pytest.raises(TypeError, match=r"^prompt 1 .*\bint\b"):
        sample(model, tok, ["1+1=", 7], max_new_tokens=2)


@pytest.mark.gpu
def test_cuda_matches_cpu_greedy(spiky):
    model, tok = spiky
    cpu = sample(model, tok, PROMPTS, temperature=0.0, max_new_tokens=12)
    cuda_model = model.to("cuda")
    try:
        gpu = sample(cuda_model, tok, PROMPTS, temperature=0.0, max_new_tokens=12)
        sampled = sample(
            cuda_model,
            tok,
            PROMPTS,
            n=4,
            max_new_tokens=12,
            generator=torch.Generator(device="cuda").manual_seed(0),
        )
        again = sample(
            cuda_model,
            tok,
            PROMPTS,
            n=4,
            max_new_tokens=12,
            generator=torch.Generator(device="cuda").manual_seed(0),
        )
        per_prompt = [
            sample(
                cuda_model,
                tok,
                PROMPTS,
                n=4,
                max_new_tokens=12,
                generators=[torch.Generator(device="cuda").manual_seed(s) for s in (1, 2, 3)],
            )
            for _ in range(2)
        ]
    finally:
        model.to("cpu")
    assert torch.equal(cpu.response_ids, gpu.response_ids)
    assert torch.equal(sampled.response_ids, again.response_ids)
    assert torch.equal(per_prompt[0].response_ids, per_prompt[1].response_ids)


def test_sample_next_token_full_vocab_frequencies():
    # top_p = 1, T = 2: probs proportional to exp(logits / 2) = [1, e, e^2] / (1 + e + e^2)
    logits = torch.tensor([[0.0, 2.0, 4.0]]).repeat(6000, 1)
    token, logp = sample_next_token(
        logits, temperature=2.0, top_p=1.0, generator=torch.Generator().manual_seed(1)
    )
    e = math.e
    expected = torch.tensor([1, e, e * e]) / (1 + e + e * e)
    freq = torch.bincount(token, minlength=3).float() / len(token)
    assert torch.allclose(freq, expected, atol=0.02)
    assert torch.allclose(logp, expected.log()[token])


def _spiky_copy(spiky, attn_implementation="sdpa"):
    """A fresh copy of the spiky model (the module's fixture stays as it is)."""
    import copy

    model = copy.deepcopy(spiky[0])
    model.set_attn_implementation(attn_implementation)
    return model


COPIED_KV = "test_sdpa_copied_kv"


def _sdpa_on_copied_kv(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The reference for in-kernel GQA: ``sdpa`` on keys and values copied once per query head (query head
    h reads key/value head h // groups), at every step. Transformers' own ``sdpa`` did that copy whenever a
    padding mask was given until 5.22; from 5.23 it packs a decoding step's query heads per key/value head
    instead, which sums in another order."""
    groups = module.num_key_value_groups
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    causal = query.shape[2] > 1 and attention_mask is None and getattr(module, "is_causal", True)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal
    )
    return out.transpose(1, 2).contiguous(), None


@pytest.mark.parametrize("n,temperature,top_p,seed", [(8, 1.0, 1.0, 0), (6, 0.7, 0.9, 1), (5, 0.0, 1.0, 2)])
def test_in_kernel_gqa_samples_the_same_to_the_bit(spiky, n, temperature, top_p, seed):
    """in_kernel_gqa hands a grouped-query model's keys and values to the attention kernel per key/value head
    instead of copied per query head: draws, log-probs and entropies equal those of sdpa on the copies to the
    bit, so a run samples the same on every transformers release of the range."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from ebpo.generation import IN_KERNEL_GQA, in_kernel_gqa

    spiky_model, tok = spiky
    assert spiky_model.config.num_attention_heads > spiky_model.config.num_key_value_heads  # 2 per key head
    AttentionInterface.register(COPIED_KV, _sdpa_on_copied_kv)
    AttentionMaskInterface.register(COPIED_KV, sdpa_mask)
    copied = _spiky_copy(spiky, COPIED_KV)
    fast = _spiky_copy(spiky)
    assert in_kernel_gqa(fast) and fast.config._attn_implementation == IN_KERNEL_GQA
    stop_ids = frequent_tokens(copied, tok, 3)
    settings = dict(n=n, temperature=temperature, top_p=top_p, max_new_tokens=12, eos_token_id=stop_ids)
    ours = sample(fast, tok, PROMPTS, generator=seed, with_entropy=True, **settings)
    reference = sample(copied, tok, PROMPTS, generator=seed, with_entropy=True, **settings)
    assert torch.equal(ours.response_ids, reference.response_ids)
    assert torch.equal(ours.old_logp, reference.old_logp)
    assert torch.equal(ours.entropy, reference.entropy)


def test_in_kernel_gqa_forwards_equal_sdpa_with_and_without_gradient(spiky, tmp_path):
    """A padded batch's logits equal sdpa's to the bit without gradient; with gradient the attention is sdpa
    itself, so the weight gradients are the same too. Another attention is left alone, and the choice is not
    saved with the model."""
    from ebpo.generation import in_kernel_gqa

    _, tok = spiky
    plain, fast = _spiky_copy(spiky), _spiky_copy(spiky)
    in_kernel_gqa(fast)
    ids_BP, mask_BP = left_pad([tok(p)["input_ids"] for p in [*PROMPTS, "12*(3+4)=", "x"]], tok.pad_token_id)
    inputs = dict(input_ids=ids_BP, attention_mask=mask_BP, position_ids=prompt_position_ids(mask_BP))
    with torch.no_grad():
        assert torch.equal(fast(**inputs).logits, plain(**inputs).logits)
    grads = []
    for model in (plain, fast):
        (model(**inputs).logits[mask_BP.bool()].logsumexp(-1).sum()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.equal(grads[0], grads[1])
    assert not in_kernel_gqa(_spiky_copy(spiky, "eager"))
    fast.save_pretrained(tmp_path / "saved")
    assert "ebpo" not in (tmp_path / "saved" / "config.json").read_text()


class NextTokenTable(torch.nn.Module):
    """A model's forward (its KV cache fills as usual) with the logits replaced: after token t the next token
    is ``table[t]``, 100 logits above every other token, so greedy decoding follows the table exactly."""

    def __init__(self, inner, table: dict[int, int]) -> None:
        super().__init__()
        self.inner, self.table = inner, table
        self.config, self.generation_config = inner.config, inner.generation_config

    def forward(self, input_ids, cache=None, **kwargs):  # ``cache``: the name ebpo.generation then passes
        out = self.inner(input_ids=input_ids, **{cache_argument(self.inner): cache}, **kwargs)
        logits_BLV = torch.zeros_like(out.logits)
        following_B = torch.tensor([self.table[int(t)] for t in input_ids[:, -1]])
        logits_BLV[torch.arange(len(following_B)), -1, following_B] = 100.0
        out.logits = logits_BLV
        return out


def test_generation_stops_at_either_eos_id(chat_model_dir):
    """The chat model's generation config lists two EOS ids, <|im_end|> (2) and <|endoftext|> (0), as Qwen's
    do. Scripted by hand: prompt ...x answers 7 then <|im_end|>; ...y answers 8 then <|endoftext|>; ...z
    answers 9 for ever. Each EOS ends its row, is the last masked token, and is not in the text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ebpo.generation import stop_token_ids

    tok = AutoTokenizer.from_pretrained(chat_model_dir)
    inner = AutoModelForCausalLM.from_pretrained(chat_model_dir).eval()
    x, y, z, seven, eight, nine = tok.convert_tokens_to_ids(["x", "y", "z", "7", "8", "9"])
    im_end, endoftext = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert (im_end, endoftext) == (2, 0) and tok.pad_token_id == endoftext
    table = {x: seven, seven: im_end, y: eight, eight: endoftext, endoftext: nine, z: nine, nine: nine}
    model = NextTokenTable(inner, table)
    assert stop_token_ids(model, tok) == [im_end, endoftext]  # the tokenizer's EOS, then the config's list

    head = tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    out = sample(model, tok, [head + [x], head + [y], head + [z]], n=1, temperature=0.0, max_new_tokens=4)
    assert out.response_ids.tolist() == [
        [seven, im_end, 0, 0],
        [eight, endoftext, 0, 0],
        [nine, nine, nine, nine],
    ]
    assert out.response_mask.tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    assert out.lengths.tolist() == [2, 2, 4] and out.truncated.tolist() == [False, False, True]
    assert out.texts == ["7", "8", "9999"]
    # told of one EOS id only, the row runs on past <|endoftext|> (which the table follows with 9)
    one_eos = sample(model, tok, [head + [y]], temperature=0.0, max_new_tokens=4, eos_token_id=im_end)
    assert one_eos.response_ids.tolist() == [[eight, endoftext, nine, nine]]
    assert one_eos.truncated.tolist() == [True] and one_eos.texts == ["899"]  # <|endoftext|> is not text
