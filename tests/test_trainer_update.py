"""The typed rollout batch and the update: what ``optim.micro_batch_size`` changes and what it does not."""

from __future__ import annotations

import math

import pytest
import torch

from ebpo.trainer.rollout import RolloutBatch
from ebpo.trainer.trainer import Trainer
from test_trainer import final_params, tiny_config


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _batch(prompt_ids, response_ids, score):
    prompt_ids_BP, response_ids_BT = torch.tensor(prompt_ids), torch.tensor(response_ids)
    num = prompt_ids_BP.shape[0]
    return RolloutBatch(
        prompt_ids_BP=prompt_ids_BP,
        prompt_mask_BP=(prompt_ids_BP > 0).long(),
        response_ids_BT=response_ids_BT,
        response_mask_BT=(response_ids_BT > 0).long(),
        lengths_B=(response_ids_BT > 0).sum(1),
        truncated_B=torch.zeros(num, dtype=torch.bool),
        score_B=torch.tensor(score, dtype=torch.float64),
        reward_B=torch.tensor(score, dtype=torch.float64),
        valid_B=torch.ones(num, dtype=torch.bool),
    )


def test_rollout_batch_concat_pads_and_select_keeps_rows():
    # round a: P = 1, T = 2; round b: P = 2, T = 1 -> prompts left-padded to 2, responses right-padded to 2
    a = _batch([[5], [6]], [[7, 8], [9, 0]], [0.5, 1.0])
    b = _batch([[1, 2]], [[3]], [0.0])
    batch = RolloutBatch.concat([a, b], pad_id=0)
    assert batch.num_rows == 3
    assert batch.prompt_ids_BP.tolist() == [[0, 5], [0, 6], [1, 2]]
    assert batch.prompt_mask_BP.tolist() == [[0, 1], [0, 1], [1, 1]]
    assert batch.response_ids_BT.tolist() == [[7, 8], [9, 0], [3, 0]]
    assert batch.response_mask_BT.tolist() == [[1, 1], [1, 0], [1, 0]]
    assert batch.score_B.tolist() == [0.5, 1.0, 0.0] and batch.lengths_B.tolist() == [2, 1, 1]
    picked = batch.select(torch.tensor([2, 0]))
    assert picked.response_ids_BT.tolist() == [[3, 0], [7, 8]] and picked.score_B.tolist() == [0.0, 0.5]
    inputs = picked.model_inputs()
    assert sorted(inputs) == ["prompt_ids", "prompt_mask", "response_ids", "response_mask"]
    assert torch.equal(inputs["prompt_ids"], picked.prompt_ids_BP)


def _one_step(model_dir, run_dir, *overrides):
    # optim.eps=1: AdamW's first update is lr * g / (|g| + eps), about lr * g for these small gradients, so
    # the parameters move linearly in the gradient (with eps=1e-8 it is lr * sign(g), which turns rounding
    # noise in near-zero gradients into full-size differences)
    cfg = tiny_config(model_dir, "run.steps=1", "run.save_every=1", "optim.eps=1", *overrides)
    Trainer(cfg, run_dir=run_dir).train()
    return final_params(run_dir)


def _max_diff(a, b):
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def test_distinct_rows_by_hand():
    # rows 0 and 2 are equal; row 3 equals row 1 but for its response mask (a failed reward): 3 distinct rows
    inputs = {
        "prompt_ids": torch.tensor([[0, 5], [4, 5], [0, 5], [4, 5]]),
        "prompt_mask": torch.tensor([[0, 1], [1, 1], [0, 1], [1, 1]]),
        "response_ids": torch.tensor([[7, 2], [8, 2], [7, 2], [8, 2]]),
        "response_mask": torch.tensor([[1, 1], [1, 1], [1, 1], [0, 0]]),
    }
    from ebpo.trainer.rollout import distinct_rows

    first_U, inverse_B = distinct_rows(inputs)
    assert sorted(first_U.tolist()) == [0, 1, 3]
    assert [int(first_U[u]) for u in inverse_B] == [0, 1, 0, 3]
    assert distinct_rows({name: t[:2] for name, t in inputs.items()}) is None


def test_a_forward_without_gradient_computes_each_distinct_row_once_to_the_bit(tiny_model_dir):
    """Without gradient, forward_logp runs the model on the distinct rows (topped up to MIN_FORWARD_ROWS) and
    copies: log-probs and entropies equal, to the bit, a forward over every row."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ebpo.generation import MIN_FORWARD_ROWS, sample
    from ebpo.trainer.rollout import _forward_logp, forward_logp

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = ["1+1=", "area 12x13=", "max(3,9,47)=", "7*8="]
    rollouts = sample(model, tokenizer, prompts, n=3, temperature=1.0, max_new_tokens=7, generator=0)
    names = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")
    rows = torch.tensor([0, 5, 5, 11, 0, 3, 3, 3, 7, 1, 2, 4, 6, 8, 9, 10, 0, 5, 11, 2, 2, 9, 1, 1, 0])
    inputs = {name: getattr(rollouts, name)[rows] for name in names}
    inputs["response_mask"][-1] = 0  # a failed reward's row: another row than row 0
    seen = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    with torch.no_grad():
        logp_BT, entropy_BT = forward_logp(model, inputs, 1.0, with_entropy=True, response_logits_only=True)
    hook.remove()
    with torch.no_grad():
        every_logp_BT, every_entropy_BT = _forward_logp(model, inputs, 1.0, True, True, False)
    assert torch.equal(logp_BT, every_logp_BT) and torch.equal(entropy_BT, every_entropy_BT)
    assert seen == [MIN_FORWARD_ROWS]  # 13 distinct rows of 25, topped up to 16


def test_micro_batches_leave_the_vanilla_update_alone_but_change_kl_cov(tiny_model_dir, tmp_path):
    # 2 prompts x G = 4, one prompt per update: two mini-batches of 4 rows, split into micro-batches of 2.
    # Each part's loss is weighted by its share of the tokens (token-mean), so the vanilla gradient is the
    # whole mini-batch's up to float rounding. KL-Cov picks max(1, floor(2e-3 * n)) tokens by covariance
    # within each part: one token per micro-batch instead of one per mini-batch, so the update differs.
    whole = _one_step(tiny_model_dir, tmp_path / "whole")
    split = _one_step(tiny_model_dir, tmp_path / "split", "optim.micro_batch_size=2")
    assert _max_diff(whole, split) < 1e-7  # measured 3.7e-9

    kl_cov = ["algorithm.policy_loss=kl_cov"]
    whole = _one_step(tiny_model_dir, tmp_path / "kl_whole", *kl_cov)
    split = _one_step(tiny_model_dir, tmp_path / "kl_split", *kl_cov, "optim.micro_batch_size=2")
    assert _max_diff(whole, split) > 1e-5  # measured 1.7e-4


@pytest.mark.parametrize("extra", [(), ("optim.micro_batch_size=2", "optim.epochs=2")])
def test_first_update_serves_its_rows_old_logprobs_to_the_bit(tiny_model_dir, tmp_path, extra):
    """The step's first update runs at the sampling policy, so its forward gives its rows' old log-probs and
    entropies; with the pass over the other rows they equal, to the bit, one forward of the sampling policy
    over the whole batch (what the trainer computed before it reused that forward)."""
    import copy

    from ebpo.losses import masked_mean
    from ebpo.trainer.rollout import forward_logp

    # 4 prompts x G = 4, one prompt per update: the first update holds 4 of the 16 rows
    cfg = tiny_config(tiny_model_dir, "run.steps=1", "data.batch_size=4", *extra)
    trainer = Trainer(cfg, run_dir=tmp_path / "run")
    seen = {}
    step_kl = trainer._step_kl

    def spy(batch, old_logp_BT, stride):
        seen.update(batch=batch, old_logp_BT=old_logp_BT.clone())
        return step_kl(batch, old_logp_BT, stride)

    trainer._step_kl = spy
    sampling_policy = copy.deepcopy(trainer.model)
    metrics = trainer._train_step()
    batch = seen["batch"]
    with torch.no_grad():
        logp_BT, entropy_BT = forward_logp(
            sampling_policy, batch.model_inputs(), cfg.rollout.temperature, with_entropy=True
        )
    mask_BT = batch.response_mask_BT.bool()
    assert batch.num_rows == 16 and int(mask_BT.sum()) > 16
    assert torch.equal(seen["old_logp_BT"][mask_BT], logp_BT[mask_BT])
    assert metrics["actor/entropy"] == float(masked_mean(entropy_BT, batch.response_mask_BT))
    trainer.run.release()


def test_step_kl_scope_changes_that_metric_and_nothing_else(tiny_model_dir, tmp_path):
    """run.step_kl=subset estimates actor/step_kl from every U-th row, none skips it; training is the same to
    the bit (the pass after the updates reads the model and draws nothing)."""
    from test_trainer import training_rows

    runs = {}
    for scope in ("all", "subset", "none"):
        cfg = tiny_config(tiny_model_dir, "run.steps=2", "data.batch_size=4", f"run.step_kl={scope}")
        Trainer(cfg, run_dir=tmp_path / scope).train()
        runs[scope] = (final_params(tmp_path / scope), training_rows(tmp_path / scope))
    params, rows = runs["all"]
    for scope in ("subset", "none"):
        other_params, other_rows = runs[scope]
        assert all(torch.equal(params[name], other_params[name]) for name in params), scope
        drop = {"actor/step_kl"}
        assert [{k: v for k, v in r.items() if k not in drop} for r in other_rows] == [
            {k: v for k, v in r.items() if k not in drop} for r in rows
        ]
    steps = rows[1:]  # step 0 is the validation before training
    assert all(row["actor/step_kl"] > 0 for row in steps)
    assert all(row["actor/step_kl"] >= 0 for row in runs["subset"][1][1:])
    assert [row["actor/step_kl"] for row in runs["subset"][1][1:]] != [row["actor/step_kl"] for row in steps]
    assert all("actor/step_kl" not in row for row in runs["none"][1])


def test_shared_prompts_of_one_token_run_without_a_cache(tiny_model_dir):
    """Prompts of one token leave nothing to cache: one forward over each row's prompt token and response,
    equal to the full forward within rounding."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ebpo.generation import sample
    from ebpo.trainer.rollout import forward_logp

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rollouts = sample(model, tokenizer, ["7", "8", "9"], n=3, max_new_tokens=5, generator=0)
    inputs = {
        name: getattr(rollouts, name)
        for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")
    }
    assert inputs["prompt_ids"].shape[1] == 1
    calls: list[tuple[int, ...]] = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    with torch.no_grad():
        shared_BT, _ = forward_logp(model, inputs, 1.0, shared_prompts=True)
    hook.remove()
    with torch.no_grad():
        full_BT, _ = forward_logp(model, inputs, 1.0)
    mask_BT = inputs["response_mask"].bool()
    assert calls == [(9, inputs["response_ids"].shape[1])]
    assert float((shared_BT - full_BT).abs()[mask_BT].max()) < 1e-5


def test_shared_prompts_with_eager_attention_and_a_refusal_for_others(tiny_model_dir):
    """With ``eager`` attention the packed prompts get an additive mask (``sdpa`` takes a boolean one): the same
    log-probs within rounding. An attention that takes no 4-D mask is refused by name."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ebpo.errors import ConfigError
    from ebpo.generation import sample
    from ebpo.trainer.rollout import forward_logp

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="eager")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rollouts = sample(model, tokenizer, ["1+1=", "area 12x13=", "7*8="], n=3, max_new_tokens=6, generator=0)
    inputs = {
        name: getattr(rollouts, name)
        for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask")
    }
    with torch.no_grad():
        shared_BT, _ = forward_logp(model, inputs, 1.0, shared_prompts=True)
        full_BT, _ = forward_logp(model, inputs, 1.0)
    assert float((shared_BT - full_BT).abs()[inputs["response_mask"].bool()].max()) < 1e-5
    model.config._attn_implementation = "flash_attention_2"  # as loaded with it (not installed here)
    with pytest.raises(
        ConfigError, match="optim.shared_prompts=true needs sdpa or eager attention; the model"
    ):
        forward_logp(model, inputs, 1.0, shared_prompts=True)


def _one_step_within_rounding(model_dir, tmp_path, setting):
    """One step with the defaults and with ``setting`` (an opt-in that changes float rounding only): the same
    responses, the update within rounding, the entropy within 1e-5; returns both runs' metric rows."""
    from test_trainer import training_rows

    default = _one_step(model_dir, tmp_path / "default")
    changed = _one_step(model_dir, tmp_path / "changed", setting)
    assert _max_diff(default, changed) < 1e-6  # measured 3.7e-9 for both settings
    (a,) = training_rows(tmp_path / "default")[1:]
    (b,) = training_rows(tmp_path / "changed")[1:]
    assert a["reward/mean"] == b["reward/mean"] and a["response_length/mean"] == b["response_length/mean"]
    assert math.isclose(a["actor/entropy"], b["actor/entropy"], abs_tol=1e-5)
    return a, b


def test_sampler_old_logprobs_train_as_recomputed_ones_up_to_rounding(tiny_model_dir, tmp_path):
    """rollout.old_logp=sampler takes the PPO ratio's old log-probs and the entropy from the sampler, which
    differ from a full forward's by float rounding only."""
    a, b = _one_step_within_rounding(tiny_model_dir, tmp_path, "rollout.old_logp=sampler")
    assert math.isclose(a["actor/ppo_kl"], b["actor/ppo_kl"], abs_tol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shared_prompt_forward_equals_the_full_forward_up_to_rounding(tiny_model_dir, seed):
    """forward_logp(shared_prompts=True) runs the distinct prompts once, packed with little padding, then the
    responses on the cached prompts: the same log-probs, entropies and weight gradients as a forward over
    every row's prompt and response, within float rounding, over random rows (repeated prompts, responses
    of every length, a failed reward's row with no tokens)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ebpo.generation import sample
    from ebpo.trainer.rollout import forward_logp

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = ["1+1=", "area 12x13=", "max(3,9,47) is=", "7*8="]
    rollouts = sample(model, tokenizer, prompts, n=4, max_new_tokens=6 + 3 * seed, generator=seed)
    generator = torch.Generator().manual_seed(seed)
    num_rows = int(torch.randint(5, 16, (1,), generator=generator))
    rows = torch.randperm(16, generator=generator)[:num_rows]
    names = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")
    inputs = {name: getattr(rollouts, name)[rows] for name in names}
    inputs["response_mask"][0] = 0  # a failed reward's row
    mask_BT = inputs["response_mask"].bool()
    results = {}
    for shared in (False, True):
        calls: list[tuple[int, ...]] = []
        hook = model.register_forward_pre_hook(
            lambda module, args, kwargs, calls=calls: calls.append(tuple(kwargs["input_ids"].shape)),
            with_kwargs=True,
        )
        model.zero_grad(set_to_none=True)
        logp_BT, entropy_BT = forward_logp(model, inputs, 1.0, with_entropy=True, shared_prompts=shared)
        (logp_BT * mask_BT).sum().backward()
        hook.remove()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results[shared] = (logp_BT.detach(), entropy_BT, grads, calls)
    (logp, entropy, grads, calls), (s_logp, s_entropy, s_grads, s_calls) = results[False], results[True]
    assert float((logp - s_logp).abs()[mask_BT].max()) < 1e-5  # measured 4.8e-7 to 9.5e-7 (seeds 0-2)
    assert float((entropy - s_entropy).abs()[mask_BT].max()) < 1e-5
    assert float((grads - s_grads).norm() / grads.norm()) < 1e-5  # measured 1.9e-7 to 2.4e-7
    # one forward over (rows, P + T); shared: the distinct prompts less their last token, packed into rows as
    # long as the longest, then every row's last prompt token and response: (rows, 1 + T - 1)
    width_T = inputs["response_ids"].shape[1]
    distinct = {tuple(ids[m.bool()].tolist()) for ids, m in zip(inputs["prompt_ids"], inputs["prompt_mask"])}
    cached = [len(p) - 1 for p in distinct]
    assert calls == [(num_rows, inputs["prompt_ids"].shape[1] + width_T)]
    (bins, width), last = s_calls
    assert width == max(cached) and sum(cached) <= bins * width
    assert 2 * sum(cached) > (bins - 1) * width  # first fit: any two bins together hold more than one width
    assert last == (num_rows, width_T)


def test_shared_prompts_train_as_the_default_up_to_rounding(tiny_model_dir, tmp_path, monkeypatch):
    """optim.shared_prompts=true (updates, recompute and step-KL passes on cached prompts) trains as the default
    within rounding; a model whose attention takes no 4-D mask, or gradient checkpointing (which turns the
    cache off), is refused by name."""
    from ebpo.errors import ConfigError

    a, b = _one_step_within_rounding(tiny_model_dir, tmp_path, "optim.shared_prompts=true")
    assert math.isclose(a["actor/step_kl"], b["actor/step_kl"], rel_tol=1e-4)  # measured 3.7e-6
    monkeypatch.setattr(  # a model that loads with an attention taking no 4-D mask
        "ebpo.trainer.setup.in_kernel_gqa",
        lambda model: setattr(model.config, "_attn_implementation", "flash_attention_2"),
    )
    with pytest.raises(ConfigError, match="optim.shared_prompts=true needs sdpa or eager attention"):
        Trainer(tiny_config(tiny_model_dir, "optim.shared_prompts=true"), run_dir=tmp_path / "flash")
    with pytest.raises(ConfigError, match="optim.shared_prompts.*model.gradient_checkpointing"):
        tiny_config(tiny_model_dir, "optim.shared_prompts=true", "model.gradient_checkpointing=true")


def test_the_reference_pass_on_short_responses_equals_a_full_forward_to_the_bit(tiny_model_dir, tmp_path):
    """The passes without gradient compute the output layer at the response positions only
    (``logits_to_keep``). torch folds that (rows, T + 1, hidden) slice into one matrix product only when the
    weight requires gradient; otherwise it runs a product of T + 1 rows per response, which MKL sums in
    another order when T + 1 < 4. The trainer's frozen reference model therefore keeps its weights'
    ``requires_grad`` (it only ever runs without gradient), so its log-probs on responses of 1 and 2 tokens
    equal a full forward's to the bit."""
    from ebpo.generation import sample
    from ebpo.trainer.rollout import _forward_logp

    cfg = tiny_config(tiny_model_dir, "run.steps=1", "algorithm.kl_coef=0.01")
    trainer = Trainer(cfg, run_dir=tmp_path / "run")
    ref = trainer.ref_model
    assert ref is not None and not ref.training
    prompts = ["1+1=", "area 12x13=", "max(3,9,47)=", "7*8=", "12", "mod 5 of 91="]
    for width in (1, 2, 3):
        rollouts = sample(ref, trainer.tokenizer, prompts, n=4, max_new_tokens=width, generator=width)
        names = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")
        inputs = {name: getattr(rollouts, name) for name in names}
        with torch.no_grad():
            kept_BT, _ = _forward_logp(ref, inputs, 1.0, False, True, False)
            full_BT, _ = _forward_logp(ref, inputs, 1.0, False, False, False)
        assert torch.equal(kept_BT, full_BT), width
    trainer.run.release()
