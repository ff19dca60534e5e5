"""Tests for ebpo.simulate.cli: ``ebpo simulate`` end to end, its tables and files."""

from __future__ import annotations

import csv

import pytest

from ebpo.cli import main
from ebpo.simulate import estimator_specs


def test_cli_writes_csv_and_png(tmp_path, capsys):
    out_dir = tmp_path / "sim"
    argv = ["simulate", "--steps", "12", "--warmup", "2", "-M", "8", "--seeds", "0", "--theorem2-steps", "20"]
    assert main([*argv, "--topic-block", "2", "--out-dir", str(out_dir)]) == 0
    printed = capsys.readouterr().out
    assert "relative error" in printed and "## Stream topic/improving" in printed
    assert str(out_dir.resolve()) in printed
    with (out_dir / "simulate.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    stream_rows = [row for row in rows if row["study"] == "stream"]
    assert len(stream_rows) == 4 * len(estimator_specs(10.0))
    assert {row["scenario"] for row in stream_rows} == {
        "shuffled/stationary",
        "shuffled/improving",
        "topic/stationary",
        "topic/improving",
    }
    theorem_rows = {row["quantity"]: float(row["value"]) for row in rows if row["study"] == "theorem2"}
    assert theorem_rows["closed_form_ebpo"] == pytest.approx(0.005)
    assert all(float(row["baseline_mse"]) > 0 for row in stream_rows)
    png = (out_dir / "simulate.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_cli_staleness_study_prints_its_tables_and_writes_its_csv(tmp_path, capsys):
    out_dir = tmp_path / "stale"
    argv = ["simulate", "--study", "staleness", "--steps", "10", "--warmup", "2", "-M", "6", "--seeds", "0"]
    argv += ["--staleness-lags", "0", "2", "--staleness-drifts", "4", "--staleness-memories", "all"]
    assert main([*argv, "--out-dir", str(out_dir)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "## drift 4 logits over the run, prior_memory=all"
    assert "| option | L_max = 0 | L_max = 2 |" in printed and "|---|---|---|" in printed
    assert printed[-1] == f"wrote {out_dir / 'staleness.csv'}"
    with (out_dir / "staleness.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 * 6  # five options and the group mean, two lag distributions
    assert list(rows[0])[:4] == ["drift", "prior_memory", "option", "max_lag"]


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--group-size", "0"], "need: group_size >= 2 (got group_size=0)"),
        (["--steps", "0"], "need: steps > warmup >= 0 (got steps=0, warmup=20)"),
        (
            ["--study", "staleness", "--staleness-memories", "all", "soon"],
            "need: staleness_memories non-empty, each 'all' or a half-life > 0 "
            "(got staleness_memories=['all', 'soon'])",
        ),
    ],
)
def test_a_bad_setting_is_one_line_and_exit_2_before_anything_runs(tmp_path, capsys, flags, line):
    out_dir = tmp_path / "sim"
    assert main(["simulate", *flags, "--out-dir", str(out_dir)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"ebpo simulate: error: invalid simulate settings, {line}\n"
    assert not out_dir.exists()


def test_debug_shows_the_traceback_behind_a_bad_setting_then_the_same_line(capsys):
    assert main(["--debug", "simulate", "--group-size", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert "ebpo.errors.ConfigError: invalid simulate settings" in err
    assert err.endswith(
        "ebpo simulate: error: invalid simulate settings, need: group_size >= 2 (got group_size=1)\n"
    )
