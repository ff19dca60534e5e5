"""``ebpo annotate difficulty``: pass rates with the tiny model, resume after interruption, row handling."""

from __future__ import annotations

import json
import re

import pytest

from ebpo.annotate import read_rows, row_answer, row_prompt
from ebpo.annotate.difficulty import DifficultyConfig, annotate_difficulty, partial_path
from ebpo.cli import main
from ebpo.tasks.arith import generate

K = 4


@pytest.fixture(scope="module")
def arith_jsonl(tmp_path_factory):
    path = tmp_path_factory.mktemp("difficulty") / "arith.jsonl"
    records = generate("train", 5, seed=0)
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))
    return path


def _cfg(model_dir, **kw):
    return DifficultyConfig(
        model=str(model_dir), reward="arith", k=K, max_new_tokens=6, prompts_per_call=2, **kw
    )


def _even_first(completion: str) -> float:
    return float(bool(completion) and ord(completion[0]) % 2 == 0)


class CountingReward:
    """Scores a completion 1 iff its first character has an even code point (about half of a random
    model's samples, so pass rates vary), counting batch calls;
    raises KeyboardInterrupt on call number ``interrupt_at`` to simulate a killed run."""

    def __init__(self, interrupt_at=None):
        self.calls = 0
        self.interrupt_at = interrupt_at

    def batch(self, completions, answers):
        self.calls += 1
        if self.calls == self.interrupt_at:
            raise KeyboardInterrupt
        return [_even_first(c) for c in completions]


def test_pass_rate_matches_a_reference_and_columns_kept(arith_jsonl, tiny_model_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ebpo.annotate.difficulty import chunk_seed
    from ebpo.generation import sample

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    out = tmp_path / "out.jsonl"
    reward = CountingReward()
    cfg = _cfg(tiny_model_dir)
    rows = annotate_difficulty(
        arith_jsonl, out, cfg, model=model, tokenizer=tokenizer, reward=reward, progress=False
    )
    src = read_rows(arith_jsonl)
    assert reward.calls == 3  # 5 prompts in chunks of 2: [0,1] [2,3] [4]
    assert len(rows) == 5 and read_rows(out) == rows
    for row, original in zip(rows, src):
        assert {k: v for k, v in row.items() if k != "difficulty"} == {
            k: v for k, v in original.items() if k != "difficulty"
        }
    # reference: chunk by chunk with the documented seeds, count rewards > 0.5 per prompt, divide by k
    expected = []
    for chunk, start in enumerate(range(0, 5, 2)):
        prompts = [r["prompt"] for r in src[start : start + 2]]
        gen = torch.Generator().manual_seed(chunk_seed(cfg.seed, chunk))
        texts = sample(model, tokenizer, prompts, n=K, temperature=1.0, max_new_tokens=6, generator=gen).texts
        for j in range(len(prompts)):
            expected.append(sum(_even_first(t) for t in texts[j * K : (j + 1) * K]) / K)
    assert [r["difficulty"] for r in rows] == expected
    assert len(set(expected)) > 1  # the check is not vacuous: pass rates differ between prompts
    assert not partial_path(out).exists()


def test_interrupted_then_resumed_run_writes_the_same_file(arith_jsonl, tiny_model_dir, tmp_path):
    full = tmp_path / "full.jsonl"
    annotate_difficulty(arith_jsonl, full, _cfg(tiny_model_dir), reward=CountingReward(), progress=False)
    resumed = tmp_path / "resumed.jsonl"
    with pytest.raises(KeyboardInterrupt):  # killed while scoring chunk 2 (prompts 2, 3)
        annotate_difficulty(
            arith_jsonl, resumed, _cfg(tiny_model_dir), reward=CountingReward(2), progress=False
        )
    assert not resumed.exists()
    partial = [json.loads(line) for line in partial_path(resumed).read_text().splitlines()]
    ids = [r["id"] for r in read_rows(arith_jsonl)]
    assert [p["id"] for p in partial] == ids[:2]  # chunk 1 was appended before the crash
    # a torn last line (killed mid-write) is ignored on restart
    with open(partial_path(resumed), "a") as fh:
        fh.write('{"id": "half-writ')
    reward = CountingReward()
    with pytest.warns(RuntimeWarning, match=r"partial\.jsonl, line 3: dropped a torn last line"):
        annotate_difficulty(arith_jsonl, resumed, _cfg(tiny_model_dir), reward=reward, progress=False)
    assert reward.calls == 2  # chunks 2 and 3 only
    assert resumed.read_bytes() == full.read_bytes()
    assert not partial_path(resumed).exists()


def test_real_arith_reward_through_the_cli(arith_jsonl, tiny_model_dir, tmp_path, capsys):
    from ebpo.data.loaders import load_records

    out = tmp_path / "out.parquet"
    argv = "annotate difficulty --reward arith --k 2 --max-new-tokens 4 --prompts-per-call 5 --no-progress".split()
    argv += ["--input", str(arith_jsonl), "--output", str(out), "--model", str(tiny_model_dir)]
    argv += ["--schema", "records"]  # read and write through ebpo.data.loaders: output ready for training
    assert main(argv) == 0
    records = load_records(out, "records")
    assert [r.id for r in records] == [r["id"] for r in read_rows(arith_jsonl)]
    # a random tiny model is almost never right on arith, but the values must be c / 2
    assert all(r.difficulty in (0.0, 0.5, 1.0) for r in records)
    assert "wrote 5 rows" in capsys.readouterr().out


def test_row_helpers_and_errors(tmp_path):
    assert row_prompt({"problem": "p"}, 0) == "p"
    assert row_prompt({"question": "q"}, 0) == "q"
    messages = [{"role": "user", "content": "hi"}]
    assert row_prompt({"prompt": messages}, 0) == messages
    assert row_answer({"final_answer": ["3", "4"]}, 0) == "3"  # OlympiadBench keeps a list
    assert row_answer({"reward_model": {"ground_truth": "7"}}, 0) == "7"  # DAPO-Math-17k
    with pytest.raises(ValueError, match=r"^data\.jsonl, row 3:"):
        row_answer({"problem": "p"}, 3, "data.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "a", "answer": "1"}\n{"problem": \n')
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 2:"):
        read_rows(bad)
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": 1, "problem": "a", "answer": "1"}\n{"id": 1, "problem": "b", "answer": "2"}\n')
    with pytest.raises(ValueError, match=rf"^{re.escape(str(dup))}: id '1'"):
        annotate_difficulty(
            dup, tmp_path / "o.jsonl", DifficultyConfig(model="unused"), reward=CountingReward()
        )
    with pytest.raises(ValueError, match=rf"output {re.escape(str(dup))} "):
        annotate_difficulty(dup, dup, DifficultyConfig(model="unused"))
    with pytest.raises(ValueError, match=r"\bk .*\b0$"):
        DifficultyConfig(model="m", k=0)


def test_cli_difficulty_errors_and_ctrl_c_are_one_line(arith_jsonl, tmp_path, monkeypatch, capsys):
    """A missing input and Ctrl-C give one line and an exit code (2, 130), no traceback."""
    import ebpo.annotate.difficulty as difficulty

    out = tmp_path / "o.jsonl"
    argv = ["annotate", "difficulty", "--model", "unused", "--output", str(out), "--no-progress"]
    assert main(argv + ["--input", str(tmp_path / "none.jsonl")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"ebpo annotate difficulty: error: --input {tmp_path / 'none.jsonl'}: no such file"
    )

    def interrupted(input_path, output_path, cfg, **kw):  # two prompts finished, then Ctrl-C
        partial_path(output_path).write_text('{"id": "a"}\n{"id": "b"}\n')
        raise KeyboardInterrupt

    monkeypatch.setattr(difficulty, "annotate_difficulty", interrupted)
    assert main(argv + ["--input", str(arith_jsonl)]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"ebpo annotate difficulty: interrupted; 2 finished prompts are saved in {partial_path(out)}; "
        "run the same command again (same --prompts-per-call and --seed) to resume"
    ]
