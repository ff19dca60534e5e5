"""``ebpo annotate topic`` (``ebpo.annotate.cli``): the keyword and judge backends on a file, a benchmark file
through the loaders, the agreement report, errors in one line, Ctrl-C and the resume."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ebpo.annotate import read_rows
from ebpo.annotate.topic import TOPICS, JudgeTopicClassifier
from ebpo.cli import main
from helpers.topic import CLEAR_CASES, HAND_LABELS


@pytest.mark.golden
def test_cli_evaluate_reads_the_sets_from_the_data_dir(benchmark_dir, capsys):
    from ebpo.cli import main

    assert main(["annotate", "topic", "--evaluate", str(HAND_LABELS), "--data-dir", str(benchmark_dir)]) == 0
    out = capsys.readouterr().out.splitlines()
    # 97 of 114 (docs/annotate.md), and 23 of the 30 held-out problems
    assert out[0] == "keyword: accuracy 0.851 on 114 hand-labelled problems"
    assert "  split heldout: accuracy 0.767 on 30" in out


def test_cli_topic_judge_writes_new_file_and_reports_failures(judge_server, tmp_path, capsys):
    judge, url = judge_server
    src = tmp_path / "in.jsonl"
    rows = [
        {"id": "a", "problem": "two dice are rolled", "answer": "1"},
        {"id": "b", "problem": "BANANA: what?", "answer": "2"},
        {"id": "c", "problem": "labelled already", "answer": "3", "topic": "Linear Algebra"},
    ]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.parquet"
    argv = ["annotate", "topic", "--input", str(src), "--output", str(out), "--backend", "judge"]
    argv += ["--base-url", url, "--judge-model", "m", "--max-reasks", "1", "--backoff", "0"]
    assert main(argv) == 1  # one row could not be labelled
    got = read_rows(out)
    assert [r["topic"] for r in got] == ["Probability & Statistics", None, "Linear Algebra"]
    assert [r["answer"] for r in got] == ["1", "2", "3"]  # input columns kept
    assert "b: no valid label after 2 answers" in capsys.readouterr().err
    assert (tmp_path / "out.parquet.judge_cache.jsonl").is_file()
    assert json.loads(src.read_text().splitlines()[0]) == rows[0]  # input untouched


def test_cli_topic_keyword_jsonl(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"problem": p, "answer": "0"}) + "\n" for p in CLEAR_CASES))
    out = tmp_path / "out.jsonl"
    assert main(["annotate", "topic", "--input", str(src), "--output", str(out)]) == 0
    assert [r["topic"] for r in read_rows(out)] == list(CLEAR_CASES.values())


def test_cli_topic_on_a_benchmark_file_through_the_loaders(benchmark_dir, tmp_path):
    from ebpo.data.loaders import load_records

    out = tmp_path / "aime24.topic.jsonl"
    argv = ["annotate", "topic", "--input", str(benchmark_dir / "aime24.jsonl"), "--output", str(out)]
    assert main(argv + ["--schema", "shared"]) == 0
    records = load_records(out, "records")  # our record format: `ebpo train` reads it as data.train_file
    assert len(records) == 30 and all(r.topic in TOPICS for r in records)
    assert records[0].prompt == read_rows(benchmark_dir / "aime24.jsonl")[0]["problem"]


def _topic_argv(src, out, url, *extra):
    return ["annotate", "topic", "--input", str(src), "--output", str(out), "--backend", "judge"] + (
        ["--base-url", url, "--judge-model", "m", "--backoff", "0", *extra] if url else list(extra)
    )


def test_cli_topic_errors_are_one_line(tmp_path, monkeypatch, capsys):
    """A missing --base-url, a missing input file and a bad byte each end in one line naming the flag, file
    or row, exit 2, no traceback."""
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("OPENAI_MODEL", "m")
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"problem": "p", "answer": "1"}) + "\n")
    assert main(_topic_argv(src, tmp_path / "o.jsonl", None)) == 2
    assert capsys.readouterr().err.strip() == (
        "ebpo annotate topic: error: judge backend: no endpoint; pass --base-url or set OPENAI_BASE_URL"
    )
    assert main(_topic_argv(tmp_path / "missing.jsonl", tmp_path / "o.jsonl", "http://127.0.0.1:9")) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"ebpo annotate topic: error: --input {tmp_path / 'missing.jsonl'}: no such file"
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"problem": "ok", "answer": "1"}\n{"problem": "caf\xe9", "answer": "1"}\n')
    for schema in ([], ["--schema", "shared"]):
        argv = ["annotate", "topic", "--input", str(bad), "--output", str(tmp_path / "o.jsonl"), *schema]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert (
            err.startswith(f"ebpo annotate topic: error: {bad}, line 2: not valid UTF-8") and "\n" not in err
        )


def test_judge_url_without_a_host_is_one_line(tmp_path, capsys):
    """``--base-url http:///v1`` has a scheme but no host: refused at once with one line giving an example,
    before any request or output."""
    with pytest.raises(ValueError, match="--base-url 'https:///v1'"):
        JudgeTopicClassifier(base_url="https:///v1", model="m")
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"problem": "p", "answer": "1"}) + "\n")
    assert main(_topic_argv(src, tmp_path / "o.jsonl", "http:///v1")) == 2
    assert capsys.readouterr().err.strip() == (
        "ebpo annotate topic: error: judge backend: --base-url 'http:///v1' is not an http(s) URL with a host, "
        "e.g. https://api.openai.com/v1"
    )
    assert not (tmp_path / "o.jsonl").exists()


def test_cli_topic_ctrl_c_keeps_finished_labels_and_resumes(raw_judge, tmp_path):
    """Ctrl-C keeps the answers received and says how to resume. A real SIGINT to a real
    `ebpo annotate topic` process: two problems are answered, two hang; the answered ones are in the cache,
    the message says how to resume, and the rerun asks only for the two that were missing."""
    import os
    import signal
    import subprocess
    import sys

    judge = raw_judge()
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    problems = ["plain: 1", "HANG: 2", "plain: 3", "HANG: 4"]
    src.write_text(
        "".join(json.dumps({"id": i, "problem": p, "answer": "0"}) + "\n" for i, p in enumerate(problems))
    )
    cache = tmp_path / "out.jsonl.judge_cache.jsonl"
    code = "import sys; from ebpo.cli import run; run(sys.argv[1:])"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    argv = [sys.executable, "-c", code, *_topic_argv(src, out, judge.url, "--concurrency", "4")]
    # SIGINT's default disposition in the child: a test run started as a background job (`make test &`) has
    # SIGINT ignored, the child would inherit that, and Python installs no KeyboardInterrupt handler then.
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while not (cache.is_file() and len(cache.read_text().splitlines()) == 2):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    while judge.requests.count("HANG: 2") + judge.requests.count("HANG: 4") < 2:
        time.sleep(0.05)  # both hanging requests are in flight
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("ebpo annotate topic: interrupted; 2 labels are saved in ")
    assert "run the same command again to resume" in last
    assert not out.exists()

    judge.release.set()  # now the hanging problems are answered
    before = len(judge.requests)
    resumed = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(judge.requests[before:]) == ["HANG: 2", "HANG: 4"]
    assert [r["topic"] for r in read_rows(out)] == [
        "Algebra & Number Theory",
        "Geometry & Trigonometry",
        "Algebra & Number Theory",
        "Geometry & Trigonometry",
    ]
