"""Tests for ebpo.eval.cli (``ebpo eval``): real benchmark files with a scripted generator, the tiny model on
arith and its cache, gym benchmarks, the results table, one-line errors, Ctrl-C, skipped metrics,
truncation."""

from __future__ import annotations

import argparse
import builtins
import errno
import json
import os
import subprocess
import sys

import pytest

from ebpo import persist
from ebpo.eval import cli as eval_cli
from ebpo.eval.benchmarks import get_benchmark
from ebpo.registry import PLUGINS_HINT
from helpers.evaluation import SeededGenerator
from helpers.gym import needs_gym

PAPER_SETS = ["aime24", "aime25", "amc23", "math500", "olympiadbench"]


def parse_eval_args(argv: list[str]) -> argparse.Namespace:
    return eval_cli.build_parser().parse_args(argv)


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


@needs_gym
def test_ebpo_eval_on_gym_benchmarks(tiny_model_dir, tmp_path, capsys):
    from ebpo.cli import main
    from ebpo.eval.benchmarks import get_benchmark, split_benchmarks

    assert split_benchmarks("gym:chain_sum,gcd,arith") == ["gym:chain_sum,gcd", "arith"]
    assert split_benchmarks("gym:chain_sum,gym:gcd") == ["gym:chain_sum", "gym:gcd"]
    assert get_benchmark("gym:gcd").reward == "gym"
    common = ["--n", "2", "--limit", "4", "--max-new-tokens", "4", "--ks", "1,2", "--maj-ks", "2", "--quiet"]
    common += ["--device", "cpu", "--cache-dir", str(tmp_path / "cache")]
    code = main(
        ["eval", str(tiny_model_dir), "--benchmarks", "gym:chain_sum,spell_backward,gym:gcd", *common,
         "--task-options", "{chain_sum: {max_terms: 2}}", "--out-dir", str(tmp_path / "out")]
    )  # fmt: skip
    assert code == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["benchmarks"] == ["gym:chain_sum,spell_backward", "gym:gcd"]
    assert results["settings"]["task_options"] == {"chain_sum": {"max_terms": 2}}
    for bench in results["benchmarks"]:  # a random model writes no <answer> tags
        assert results["results"][str(tiny_model_dir)][bench]["pass@1"] == 0.0
    capsys.readouterr()
    bad = main(
        ["eval", str(tiny_model_dir), "--benchmarks", "gym:gcd", "--task-options", "{gcd: {x: 1}}", *common]
    )
    assert bad == 2
    assert "--benchmarks: gym dataset 'gcd': unknown setting 'x'" in capsys.readouterr().err
    assert (
        main(["eval", str(tiny_model_dir), "--benchmarks", "gym:gcd", "--task-options", "{lcm: {}}", *common])
        == 2
    )
    assert "--task-options: 'lcm' is not a dataset of any gym benchmark" in capsys.readouterr().err
