"""Tests for ebpo.eval.harness: the tiny model on arith against sampling by hand, resuming from the cache,
limits and chunk sizes that do not change a response, chat templates, the summary by hand."""

from __future__ import annotations

import json

import pytest
import torch

from ebpo.data.records import Record
from ebpo.eval.harness import SamplingConfig, cache_file, evaluate, problem_seed
from helpers.evaluation import ExactReward, SeededGenerator, synthetic_records


def test_tiny_model_on_arith_matches_direct_sampling(tiny_model_dir):
    """The harness's numbers equal sampling each problem alone, by hand, with its problem seed (whatever
    chunk it was sampled in) and verifying."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ebpo.generation import sample
    from ebpo.tasks import get_task

    task = get_task("arith")
    records = task.generate("test", 5, seed=0)
    sampling = SamplingConfig(n=3, temperature=1.0, top_p=1.0, max_new_tokens=6, batch_size=6, seed=4)
    result = evaluate(str(tiny_model_dir), records, "arith", sampling, ks=(1, 2), maj_ks=(3,), device="cpu")
    assert [p.id for p in result.problems] == [r.id for r in records]

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert sampling.problems_per_chunk == 2  # 6 // 3: the harness samples problems two at a time
    expected_rewards = []
    for i, rec in enumerate(records):
        gen = torch.Generator().manual_seed(problem_seed(4, rec.id))
        out = sample(model, tok, [rec.prompt], n=3, temperature=1.0, max_new_tokens=6, generator=gen)
        expected_rewards.append([task.verify(t, rec.answer) for t in out.texts])
        assert result.problems[i].lengths == out.lengths.tolist()
    assert [p.rewards for p in result.problems] == expected_rewards
    flat = [r for rs in expected_rewards for r in rs]
    assert result.summary["pass@1"] == pytest.approx(sum(flat) / len(flat))
    assert {"pass@1", "pass@2", "maj@3", "response_length/mean", "response/clip_ratio"} <= set(result.summary)
    # determinism: the same call again gives the same responses
    again = evaluate(str(tiny_model_dir), records, "arith", sampling, ks=(1, 2), maj_ks=(3,), device="cpu")
    assert [p.to_dict() for p in again.problems] == [p.to_dict() for p in result.problems]


def test_resume_after_crash_equals_uninterrupted_run(tmp_path):
    records = synthetic_records(10)
    sampling = SamplingConfig(n=4, batch_size=8, seed=3)  # 2 problems per chunk -> 5 chunks
    reference = evaluate(None, records, ExactReward(), sampling, generate_fn=SeededGenerator(), maj_ks=(4,))

    cache = tmp_path / "run.jsonl"
    crashing = SeededGenerator(fail_after=3)
    with pytest.raises(RuntimeError, match="simulated crash"):
        evaluate(None, records, ExactReward(), sampling, generate_fn=crashing, cache_path=cache)
    assert len(cache.read_text().splitlines()) == 6  # 3 chunks x 2 problems were written

    resumed_gen = SeededGenerator()
    resumed = evaluate(
        None, records, ExactReward(), sampling, generate_fn=resumed_gen, cache_path=cache, maj_ks=(4,)
    )
    assert resumed.num_cached == 6
    assert resumed_gen.calls == [
        ["question 6", "question 7"],
        ["question 8", "question 9"],
    ]  # only chunks 3, 4
    assert [p.to_dict() for p in resumed.problems] == [p.to_dict() for p in reference.problems]
    assert resumed.summary == reference.summary

    # a third run samples nothing
    idle = SeededGenerator()
    again = evaluate(None, records, ExactReward(), sampling, generate_fn=idle, cache_path=cache, maj_ks=(4,))
    assert idle.calls == [] and again.summary == reference.summary


def test_torn_last_line_is_dropped_and_redone(tmp_path):
    records = synthetic_records(4)
    sampling = SamplingConfig(n=2, batch_size=2, seed=0)  # one problem per chunk
    cache = tmp_path / "run.jsonl"
    full = evaluate(None, records, ExactReward(), sampling, generate_fn=SeededGenerator(), cache_path=cache)
    lines = cache.read_text().splitlines(keepends=True)
    cache.write_text("".join(lines[:2]) + lines[2][: len(lines[2]) // 2])  # killed while writing problem 2
    gen = SeededGenerator()
    with pytest.warns(RuntimeWarning, match=r"run\.jsonl, line 3: dropped a torn last line"):
        redone = evaluate(None, records, ExactReward(), sampling, generate_fn=gen, cache_path=cache)
    assert gen.calls == [["question 2"], ["question 3"]]
    assert [p.to_dict() for p in redone.problems] == [p.to_dict() for p in full.problems]
    assert len(cache.read_text().splitlines()) == 4


def test_limit_does_not_change_responses():
    records = synthetic_records(9)
    sampling = SamplingConfig(n=3, batch_size=6, seed=1)
    full = evaluate(None, records, ExactReward(), sampling, generate_fn=SeededGenerator())
    head = evaluate(None, records, ExactReward(), sampling, generate_fn=SeededGenerator(), limit=3)
    assert [p.to_dict() for p in head.problems] == [p.to_dict() for p in full.problems[:3]]


def test_limit_batch_size_and_cache_mixing_do_not_change_real_samples(tiny_model_dir, tmp_path):
    """With the real sampler (a scripted generator that draws row by row cannot tell): each problem has its
    own generator, so a problem's samples do not depend on --limit, the chunk size or the cache. One
    multinomial call over a whole chunk would sample the last partial chunk of --limit 5 (problems 3, 4
    with 3 per chunk) differently from --limit 16."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ebpo.tasks import get_task

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    records = get_task("arith").generate("test", 16, seed=0)

    def run(limit, batch_size, cache=None):
        sampling = SamplingConfig(n=4, temperature=1.0, top_p=0.95, max_new_tokens=8, batch_size=batch_size)
        result = evaluate(
            model, records, "arith", sampling, tokenizer=tok, limit=limit, cache_path=cache, keep_texts=True
        )
        return [p.texts for p in result.problems]

    full = run(16, 12)  # 3 problems per chunk
    assert len({t for texts in full for t in texts}) > 40  # 64 random responses, nearly all distinct
    assert run(5, 12) == full[:5]  # problems 3 and 4 form a partial chunk here, not in the full run
    assert run(5, 4) == full[:5]  # one problem per chunk
    assert run(7, 40) == full[:7]  # ten problems per chunk
    # mixing limits against one cache gives what a fresh run gives
    cache = tmp_path / "mixed.jsonl"
    assert run(5, 12, cache) == full[:5]
    assert len(cache.read_text().splitlines()) == 6  # the whole second chunk (problems 3, 4, 5) is kept
    assert run(16, 12, cache) == full


def test_scripted_summary_by_hand():
    # problem p0: answers ans=0 (right), ans=x, none -> pass@1 1/3; p1: all none -> 0
    def gen(prompts, n, seed):
        return {"question 0": [["ans=0", "ans=x", "no"]], "question 1": [["no", "no", "no"]]}[prompts[0]]

    result = evaluate(
        None,
        synthetic_records(2),
        ExactReward(),
        SamplingConfig(n=3, batch_size=3),
        generate_fn=gen,
        ks=(1, 2),
        maj_ks=(3, 1),
    )
    s = result.summary
    assert s["pass@1"] == pytest.approx((1 / 3 + 0) / 2)
    # pass@2 of p0: 1 - C(2,2)/C(3,2) = 2/3; p1: 0
    assert s["pass@2"] == pytest.approx(1 / 3)
    # maj@3 of p0: "0" and "x" tie with one vote each, "0" first -> 1; p1: nobody votes -> 0
    assert s["maj@3"] == pytest.approx(0.5)
    assert result.problems[0].clusters == [0, 1, -1]
    assert result.metrics("eval/val/")["eval/val/pass@1"] == s["pass@1"]


def test_cache_key_covers_settings(tmp_path):
    base = SamplingConfig(n=4)
    a = cache_file(tmp_path, "m", "aime24", base, reward="math")
    assert a == cache_file(tmp_path, "m", "aime24", SamplingConfig(n=4), reward="math")
    assert a != cache_file(tmp_path, "m", "aime24", SamplingConfig(n=4, seed=1), reward="math")
    assert a != cache_file(tmp_path, "m", "aime24", SamplingConfig(n=4, temperature=1.0), reward="math")
    assert a != cache_file(tmp_path, "m", "aime25", base, reward="math")
    assert a != cache_file(tmp_path, "m2", "aime24", base, reward="math")
    assert a != cache_file(tmp_path, "m", "aime24", base, reward="math_dapo")
    meta = json.loads(a.with_suffix(".meta.json").read_text())
    assert meta["sampling"]["n"] == 4 and meta["benchmark"] == "aime24"


def test_bad_input_errors():
    with pytest.raises(ValueError, match="'a'"):
        evaluate(
            None,
            [Record("a", "q", "1"), Record("a", "q2", "2")],
            ExactReward(),
            generate_fn=SeededGenerator(),
        )
    with pytest.raises(ValueError, match=r"generate_fn .*n=2\b"):
        evaluate(
            None,
            synthetic_records(1),
            ExactReward(),
            SamplingConfig(n=2),
            generate_fn=lambda p, n, s: [["x"]],
        )
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0)
    with pytest.raises(ValueError, match="model"):
        evaluate(None, synthetic_records(1), ExactReward())


def test_chat_template_renders_prompts(tiny_model_dir):
    """With a template that appends '=' to the user turn, chat_template=on (and auto: the tokenizer has a
    template) on prompt p equals sampling on the raw prompt p + '=' (chat_template=off; greedy, so the
    responses must match exactly)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}={% endif %}"
    )
    records = [Record(id=f"r{i}", prompt=f"{i}+{i}", answer=str(2 * i)) for i in range(3)]
    templated = evaluate(
        model,
        records,
        "arith",
        SamplingConfig(n=1, temperature=0.0, max_new_tokens=5, chat_template="on"),
        tokenizer=tok,
    )
    plain_records = [Record(id=r.id, prompt=r.prompt + "=", answer=r.answer) for r in records]
    plain = evaluate(
        model,
        plain_records,
        "arith",
        SamplingConfig(n=1, temperature=0.0, max_new_tokens=5, chat_template="off"),
        tokenizer=tok,
        keep_texts=True,
    )
    templated_texts = evaluate(
        model,
        records,
        "arith",
        SamplingConfig(n=1, temperature=0.0, max_new_tokens=5),  # auto
        tokenizer=tok,
        keep_texts=True,
    )
    assert [p.texts for p in templated_texts.problems] == [p.texts for p in plain.problems]
    assert [p.rewards for p in templated.problems] == [p.rewards for p in plain.problems]
    with pytest.raises(ValueError, match="tokenizer"):
        evaluate(
            None, records, ExactReward(), SamplingConfig(chat_template="on"), generate_fn=SeededGenerator()
        )
