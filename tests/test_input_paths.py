"""Every path a command names is checked before any slow work (a model load, a hub download): a path that
does not exist is one line naming it and what is expected there, exit 2."""

from __future__ import annotations

import pytest

from ebpo.cli import main
from ebpo.eval import benchmarks


@pytest.fixture
def no_hub(monkeypatch):
    """A hub download or a model load fails the test: the check must come before either."""

    def refuse(*args, **kwargs):
        raise AssertionError("slow work started before the paths were checked")

    monkeypatch.setattr(benchmarks, "load_hub_benchmark", refuse)
    import transformers

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


MISSING = "runs/nope/checkpoints/best"
WHAT = "does not exist; give a model directory, a checkpoint or a run directory"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        # the paper's sets load from the hub by default: the model is checked first
        (["eval", MISSING, "--n", "4", "--limit", "5"], f"ebpo eval: error: {MISSING} {WHAT}"),
        (["eval", "builtin:arith", MISSING, "--benchmarks", "arith"], f"ebpo eval: error: {MISSING} {WHAT}"),
        (
            ["eval", "builtin:arith", "--data-dir", "nope"],
            "ebpo eval: error: --data-dir nope does not exist;",
        ),
        (
            ["train", f"model.path={MISSING}", "run.steps=1"],
            f"ebpo train: error: model.path: {MISSING} {WHAT}",
        ),
        (
            ["train", "data.train_file=nope.jsonl"],
            "ebpo train: error: data.train_file: file not found: nope.jsonl",
        ),
        (["train", "--config", "nope.yaml"], "ebpo train: error: --config nope.yaml: no such file"),
        (["diagnose", "--model", MISSING], f"ebpo diagnose: error: --model: {MISSING} {WHAT}"),
        (
            [
                "annotate",
                "difficulty",
                "--input",
                "in.jsonl",
                "--output",
                "o.jsonl",
                "--model",
                "builtin:arith",
            ],
            "ebpo annotate difficulty: error: --input in.jsonl: no such file",
        ),
        (
            ["annotate", "difficulty", "--input", "rows.jsonl", "--output", "o.jsonl", "--model", MISSING],
            f"ebpo annotate difficulty: error: --model {MISSING} does not exist; give a model directory or a "
            "Hugging Face hub name (org/name)",
        ),
        (
            ["annotate", "topic", "--input", "in.jsonl", "--output", "o.jsonl"],
            "ebpo annotate topic: error: --input",
        ),
        (["diagnose", "--plugins", "nope.py"], "ebpo diagnose: error: plugin"),
    ],
    ids=lambda value: value[0] if isinstance(value, list) and len(value) else None,
)
def test_a_path_that_does_not_exist_is_one_line_before_any_slow_work(
    argv, line, tmp_path, monkeypatch, capsys, no_hub
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rows.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    monkeypatch.setenv("EBPO_DATA_DIR", "")
    assert main([*argv, "--out-dir", str(tmp_path / "out")] if argv[0] == "eval" else argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(line), err
    assert not (tmp_path / "out").exists()  # nothing written: no results, no run directory
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
