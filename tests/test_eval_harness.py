"""Tests for ebpo.eval.harness and ebpo eval: real benchmark files with a scripted generator, the tiny model
on arith, resuming from the cache, the table."""

from __future__ import annotations

import argparse
import builtins
import errno
import json
import os
import subprocess
import sys

import pytest
import torch

from ebpo import persist
from ebpo.data.records import Record
from ebpo.eval import cli as eval_cli
from ebpo.eval.harness import SamplingConfig, cache_file, evaluate, get_benchmark, problem_seed
from ebpo.registry import PLUGINS_HINT

PAPER_SETS = ["aime24", "aime25", "amc23", "math500", "olympiadbench"]


def parse_eval_args(argv: list[str]) -> argparse.Namespace:
    return eval_cli.build_parser().parse_args(argv)


class ExactReward:
    """Reward for synthetic records: 1 if the completion's text after 'ans=' equals the gold."""

    def extract(self, completion: str) -> str | None:
        return completion.split("ans=")[-1] if "ans=" in completion else None

    def batch(self, completions, answers):
        return [float(self.extract(c) == a) for c, a in zip(completions, answers)]


def synthetic_records(num: int) -> list[Record]:
    return [Record(id=f"p{i}", prompt=f"question {i}", answer=str(i)) for i in range(num)]


class SeededGenerator:
    """(prompts, n, seeds) -> texts; each prompt's answers drawn from its own seed. Counts calls and can
    raise ``error`` after ``fail_after`` calls (a simulated crash or Ctrl-C)."""

    def __init__(self, fail_after: int | None = None, error: BaseException | None = None):
        self.calls: list[list[str]] = []
        self.fail_after = fail_after
        self.error = error or RuntimeError("simulated crash")

    def __call__(self, prompts, n, seeds):
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise self.error
        self.calls.append(list(prompts))
        assert len(seeds) == len(prompts)
        out = []
        for prompt, seed in zip(prompts, seeds):
            gold = prompt.split()[-1]
            gen = torch.Generator().manual_seed(seed)
            draws = torch.randint(0, 3, (n,), generator=gen).tolist()  # 0: correct, 1: "x", 2: no answer
            out.append([f"ans={gold}" if d == 0 else ("ans=x" if d == 1 else "no idea") for d in draws])
        return out


# --- the real benchmark files, scripted answers ----------------------------------------------------------


def scripted_texts(index: int, gold: str, n: int) -> list[str]:
    """Problem index i: i even -> every sample correct; i % 4 == 1 -> correct, then wrong; i % 4 == 3 -> wrong."""
    right = f"so the answer is \\boxed{{{gold.strip().strip('$')}}}."
    wrong = "so the answer is \\boxed{-123456789}."
    if index % 2 == 0:
        return [right] * n
    if index % 4 == 1:
        return [right if j % 2 == 0 else wrong for j in range(n)]
    return [wrong] * n


def test_cli_on_real_benchmarks_with_scripted_generator(benchmark_dir, tmp_path):
    prompt_index: dict[str, tuple[int, str]] = {}
    for name in PAPER_SETS:
        records = get_benchmark(name).load(data_dir=benchmark_dir)
        rows = (benchmark_dir / f"{name}.jsonl").read_text().splitlines()
        assert len(records) == len(rows)  # the loader read the whole real file
        # --limit 8 with 3 problems per chunk: the third chunk (problems 6, 7, 8) is sampled whole
        for i, rec in enumerate(records[:9]):
            assert rec.answer == json.loads(rows[i])["answer"]
            prompt_index[rec.prompt] = (i, rec.answer)

    def scripted(prompts, n, seed):
        return [scripted_texts(*prompt_index[p], n) for p in prompts]

    def all_wrong(prompts, n, seed):
        return [["\\boxed{-123456789}"] * n for _ in prompts]

    args = parse_eval_args(
        [
            "scripted",
            "wrong",
            "--limit",
            "8",
            "--n",
            "2",
            "--ks",
            "1,2",
            "--maj-ks",
            "2",
            "--batch-size",
            "6",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out-dir",
            str(tmp_path / "out"),
            "--data-dir",
            str(benchmark_dir),
            "--quiet",
            "--reward-option",
            "num_workers=0",
        ]
    )
    assert eval_cli.run(args, generate_fns={"scripted": scripted, "wrong": all_wrong}) == 0
    out = json.loads((tmp_path / "out" / "results.json").read_text())
    assert out["benchmarks"] == PAPER_SETS
    for name in PAPER_SETS:
        s = out["results"]["scripted"][name]
        # first 8 problems: indices 0,2,4,6 pass 2/2; 1,5 pass 1/2; 3,7 pass 0/2
        assert s["pass@1"] == pytest.approx((4 * 1 + 2 * 0.5) / 8)  # 0.625
        assert s["pass@2"] == pytest.approx(6 / 8)  # one correct of two suffices
        # maj@2: 1 and 5 tie (right, wrong): the first answer, the right one, wins -> 6/8
        assert s["maj@2"] == pytest.approx(6 / 8)
        assert s["num_problems"] == 8 and s["num_samples"] == 2
        assert out["results"]["wrong"][name]["pass@1"] == 0.0
    table = (tmp_path / "out" / "results.md").read_text()
    assert "| Model | aime24 | aime25 | amc23 | math500 | olympiadbench | Average |" in table
    assert "| scripted | 62.50 | 62.50 | 62.50 | 62.50 | 62.50 | 62.50 |" in table
    assert "| wrong | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 |" in table
    csv_rows = (tmp_path / "out" / "results.csv").read_text().splitlines()
    assert len(csv_rows) == 1 + 2 * 5 and csv_rows[0].startswith("model,benchmark,")


# --- the tiny model on arith -----------------------------------------------------------------------------


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


def test_cli_tiny_model_dir_on_arith(tiny_model_dir, tmp_path, monkeypatch):
    args = parse_eval_args(
        [
            str(tiny_model_dir),
            "--benchmarks",
            "arith",
            "--limit",
            "3",
            "--n",
            "2",
            "--max-new-tokens",
            "4",
            "--ks",
            "1,2",
            "--maj-ks",
            "2",
            "--cache-dir",
            str(tmp_path / "c"),
            "--out-dir",
            str(tmp_path / "o"),
            "--quiet",
            "--device",
            "cpu",
        ]
    )
    assert eval_cli.run(args) == 0
    out = json.loads((tmp_path / "o" / "results.json").read_text())
    summary = out["results"][str(tiny_model_dir)]["arith"]
    assert summary["num_problems"] == 3 and summary["num_samples"] == 2
    cached = list((tmp_path / "c").rglob("arith-*.jsonl"))
    # --limit 3 reports 3 problems; the chunk holding them (64 // 2 = 32 problems) is sampled and cached
    assert len(cached) == 1 and len(cached[0].read_text().splitlines()) == 32

    # a second run is answered from the cache: the model is never loaded, the numbers are the same
    import ebpo.eval.harness as harness

    def no_load(*a, **k):
        raise AssertionError("model loaded although every problem is cached")

    monkeypatch.setattr(harness, "load_model", no_load)
    assert eval_cli.run(args) == 0
    again = json.loads((tmp_path / "o" / "results.json").read_text())
    assert again["results"] == out["results"]


# --- resume from the cache -------------------------------------------------------------------------------


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
    with pytest.raises(
        ValueError,
        match=r"'aime2024'.*aime24, aime25, amc23, arith, gym:<dataset>\[,<dataset>\.\.\.\], math500, olympiadbench; .*--plugins",
    ):
        get_benchmark("aime2024")
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0)
    with pytest.raises(ValueError, match="model"):
        evaluate(None, synthetic_records(1), ExactReward())


def test_markdown_table_average_by_hand():
    results = {
        "A": {"b1": {"pass@1": 0.5}, "b2": {"pass@1": 0.25}},
        "B": {"b1": {"pass@1": 0.1}},
    }
    table = eval_cli.markdown_table(results, ["b1", "b2"], "pass@1")
    # A: (50 + 25) / 2 = 37.5; B lacks b2, so no average
    assert "| A | 50.00 | 25.00 | 37.50 |" in table
    assert "| B | 10.00 | - | - |" in table


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


def test_markdown_se_average_by_hand():
    # se 0.03 and 0.04: se of the mean of two independent estimates = sqrt(0.03^2 + 0.04^2) / 2 = 0.025
    results = {"A": {"b1": {"pass@1/se_problems": 0.03}, "b2": {"pass@1/se_problems": 0.04}}}
    assert "| A | 3.00 | 4.00 | 2.50 |" in eval_cli.markdown_table(
        results, ["b1", "b2"], "pass@1/se_problems"
    )


# --- CLI errors, Ctrl-C, skipped metrics, truncation ----------------------------------------------------


def _quick_args(tmp_path, *extra: str) -> argparse.Namespace:
    return parse_eval_args(
        ["scripted", "--benchmarks", "arith", "--limit", "6", "--n", "2", "--batch-size", "4", "--quiet"]
        + ["--cache-dir", str(tmp_path / "cache"), "--out-dir", str(tmp_path / "out"), *extra]
    )


def test_cli_a_full_cache_disk_is_one_line_and_keeps_what_is_cached(tmp_path, monkeypatch, capsys):
    args = _quick_args(tmp_path, "--ks", "1,2", "--maj-ks", "2")
    appends = [0]

    def opening(path, mode="r", *a, **k):  # the third append to the cache meets a full disk
        if str(path).endswith(".jsonl") and "a" in mode:
            appends[0] += 1
            if appends[0] == 3:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return builtins.open(path, mode, *a, **k)

    with monkeypatch.context() as patch:
        patch.setattr(persist, "open", opening, raising=False)
        assert eval_cli.run(args, generate_fns={"scripted": SeededGenerator()}) == 1
    err = capsys.readouterr().err.strip().splitlines()
    (cache,) = (tmp_path / "cache").rglob("arith-*.jsonl")
    assert err == [
        f"ebpo eval: error: cannot write {cache}: no space left on device; the problems finished so far are cached "
        f"under {tmp_path / 'cache'}: run the same command again to resume once you free some space"
    ]
    assert len(cache.read_text().splitlines()) == 4  # the two chunks before
    resumed = SeededGenerator()
    assert eval_cli.run(args, generate_fns={"scripted": resumed}) == 0
    assert len(resumed.calls) == 1  # only the chunk the disk refused


def arith_scripted(prompts, n, seeds):
    """Every response answers 0 (the arith reward reads the first integer)."""
    return [["0"] * n for _ in prompts]


def test_cli_unknown_benchmark_is_one_line_naming_the_flag(tmp_path, capsys):
    """An unknown benchmark name is one line naming --benchmarks and the valid names, not a traceback."""
    from ebpo.cli import main

    argv = ["eval", "builtin", "--benchmarks", "aime2024", "--out-dir", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "ebpo eval: error: --benchmarks: unknown benchmark 'aime2024'; valid choices: aime24, aime25, amc23, arith, "
        "gym:<dataset>[,<dataset>...], "
        f"math500, olympiadbench; {PLUGINS_HINT}"
    ]
    assert main(["eval", "builtin", "--limit", "-1", "--out-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "ebpo eval: error: --limit must be >= 0, got -1"


def test_cli_missing_benchmark_file_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EBPO_DATA_DIR", str(tmp_path))  # a folder without aime24.jsonl
    args = parse_eval_args(
        ["scripted", "--benchmarks", "aime24", "--out-dir", str(tmp_path / "o"), "--quiet"]
    )
    assert eval_cli.run(args, generate_fns={"scripted": arith_scripted}) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"ebpo eval: error: benchmark aime24: {tmp_path / 'aime24.jsonl'} not found; --data-dir (or $EBPO_DATA_DIR) "
        f"must name a folder holding aime24.jsonl, or leave both unset to load math-ai/aime24 from the "
        f"Hugging Face hub"
    )


def test_cli_unreachable_hub_is_one_line_naming_benchmark_dataset_and_flag(tmp_path):
    """No --data-dir, no $EBPO_DATA_DIR, the hub unreachable (offline mode, empty cache): the real
    ``datasets`` error becomes one line naming the benchmark, the hub dataset and the flag."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "EBPO_DATA_DIR"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    argv = ["eval", "builtin", "--benchmarks", "amc23", "--limit", "1", "--out-dir", str(tmp_path / "o")]
    code = "import sys; from ebpo.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(
        "ebpo eval: error: benchmark amc23: cannot load math-ai/amc23 (split test, revision 80815d37005f) from the "
        "Hugging Face hub ("
    )
    assert line.endswith(
        "; pass --data-dir DIR (or set $EBPO_DATA_DIR) to a folder holding amc23.jsonl (one JSON object "
        "with problem and answer per line)"
    )
    assert not (tmp_path / "o").exists()  # nothing evaluated, nothing written


def test_cli_ctrl_c_keeps_finished_chunks_and_says_how_to_resume(tmp_path, capsys):
    """Ctrl-C ends in one line and exit 130, no traceback. The scripted generator raises KeyboardInterrupt
    (what SIGINT raises in the main thread) while sampling the third chunk: the first two chunks stay cached."""
    args = _quick_args(tmp_path, "--ks", "1,2", "--maj-ks", "2")
    interrupted = SeededGenerator(fail_after=2, error=KeyboardInterrupt())
    assert eval_cli.run(args, generate_fns={"scripted": interrupted}) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "interrupted" in err[0] and "run the same command again to resume" in err[0]
    assert str(tmp_path / "cache") in err[0]
    (cache,) = (tmp_path / "cache").rglob("arith-*.jsonl")
    assert len(cache.read_text().splitlines()) == 4  # 2 chunks x 2 problems (4 // 2)

    resumed = SeededGenerator()
    assert eval_cli.run(args, generate_fns={"scripted": resumed}) == 0
    assert len(resumed.calls) == 1  # only the third chunk
    out = json.loads((tmp_path / "out" / "results.json").read_text())
    assert out["results"]["scripted"]["arith"]["num_problems"] == 6

    no_cache = SeededGenerator(fail_after=1, error=KeyboardInterrupt())
    assert eval_cli.run(_quick_args(tmp_path, "--no-cache"), generate_fns={"scripted": no_cache}) == 130
    assert "--no-cache" in capsys.readouterr().err


def test_cli_warns_when_n_is_below_k(tmp_path, capsys, recwarn):
    """With --n below 16 the default pass@16 and maj@16 cannot be computed: a warning says so."""
    assert eval_cli.run(_quick_args(tmp_path), generate_fns={"scripted": arith_scripted}) == 0
    err = capsys.readouterr().err
    assert (
        "ebpo eval: warning: --n 2 is below k, so pass@16, maj@16 are not reported; use --n 16 or more, "
        "or drop them from --ks / --maj-ks" in err
    )
    assert len(recwarn) == 0  # said once, by the CLI, not again by summarize
    out = json.loads((tmp_path / "out" / "results.json").read_text())
    assert out["settings"]["skipped_metrics"] == ["pass@16", "maj@16"]
    assert (
        "Not reported (n = 2 is below k): pass@16, maj@16." in (tmp_path / "out" / "results.md").read_text()
    )
    ok = _quick_args(tmp_path, "--ks", "1,2", "--maj-ks", "2")
    assert eval_cli.run(ok, generate_fns={"scripted": arith_scripted}) == 0
    assert "warning" not in capsys.readouterr().err


def test_cli_reports_truncation(tiny_model_dir, tmp_path, capsys):
    """ebpo eval reports the fraction of responses cut at --max-new-tokens (response/clip_ratio) in
    results.md and warns on stderr: with 2 new tokens the tiny model's responses are all cut."""
    args = parse_eval_args(
        [str(tiny_model_dir), "--benchmarks", "arith", "--limit", "2", "--n", "2", "--max-new-tokens", "2"]
        + [
            "--ks",
            "1",
            "--maj-ks",
            "1",
            "--no-cache",
            "--out-dir",
            str(tmp_path),
            "--quiet",
            "--device",
            "cpu",
        ]
    )
    assert eval_cli.run(args) == 0
    summary = json.loads((tmp_path / "results.json").read_text())["results"][str(tiny_model_dir)]["arith"]
    clip = summary["response/clip_ratio"]
    table = (tmp_path / "results.md").read_text()
    assert "Responses cut at max new tokens (response/clip_ratio, %):" in table
    assert f"| {tiny_model_dir} | {100 * clip:.2f} | {100 * clip:.2f} |" in table
    err = capsys.readouterr().err
    if clip >= 0.01:
        assert f"{100 * clip:.1f}% of the responses on arith hit --max-new-tokens 2" in err
    assert clip > 0.5  # a random tiny model rarely emits EOS within 2 tokens


def test_corrupt_cache_line_names_file_and_line(tmp_path, capsys):
    args = _quick_args(tmp_path, "--ks", "1,2", "--maj-ks", "2")
    assert eval_cli.run(args, generate_fns={"scripted": arith_scripted}) == 0
    capsys.readouterr()
    (cache,) = (tmp_path / "cache").rglob("arith-*.jsonl")
    lines = cache.read_bytes().split(b"\n")
    cache.write_bytes(b"\n".join([lines[0], b"\xff\xfe garbage", *lines[1:]]))
    assert eval_cli.run(args, generate_fns={"scripted": arith_scripted}) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"ebpo eval: error: {cache}, line 2: not a cached problem") and err.endswith(
        "delete the file to redo"
    )


def test_quiet_silences_the_loading_bars_of_transformers_too(tmp_path):
    # a real model load in a process of its own (the bars are process-wide switches): under --quiet stderr
    # holds only the line naming the files written, no "Loading weights" bar
    argv = ["eval", "builtin:arith", "--benchmarks", "arith", "--limit", "2", "--n", "2", "--ks", "1"]
    argv += ["--maj-ks", "2", "--no-cache", "--out-dir", str(tmp_path / "out"), "--quiet"]
    code = "import sys; from ebpo.cli import main; sys.exit(main())"
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    assert proc.stderr == f"wrote {out / 'results.md'}, results.csv, results.json\n", proc.stderr
    assert "| builtin:arith |" in proc.stdout
