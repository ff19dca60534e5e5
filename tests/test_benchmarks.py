"""The benchmark scripts' own logic: the GPU check's CPU fallback end to end (tiny sizes), the throughput
benchmark's round bookkeeping, and the estimator benchmark without verl."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import bench_advantages  # noqa: E402
import gpu_check  # noqa: E402
import throughput  # noqa: E402


def test_gpu_check_cpu_fallback_writes_every_check(tmp_path):
    """Without CUDA every check runs on the CPU and the table says so; float32 on the CPU against the CPU
    reference is the same run, so its first steps agree exactly."""
    out, rows_file = tmp_path / "gpu.md", tmp_path / "rows.json"
    code = gpu_check.main(["--quick", "--device", "cpu", "--out", str(out), "--json", str(rows_file)])
    text, rows = out.read_text(), json.loads(rows_file.read_text())
    assert code == 0, text
    assert "CUDA NOT available: every check ran on the CPU" in text
    # the page's command runs in any checkout: the machine's folders are placeholders
    assert "`python3 benchmarks/gpu_check.py --quick --device cpu --out <out> --json <json>`" in text
    assert str(tmp_path) not in text
    checks = [row["check"] for row in rows]
    assert checks.count("ebpo train (the ebpo preset, S1)") == 2
    assert checks.count("ebpo train (the gym preset, S2)") == 2  # the Qwen3 chat model on its gym mixture
    assert checks.count("sample vs model.generate (bench_eval)") == 2
    assert any(c.startswith("estimator") for c in checks) and any(c.startswith("EBPOTrainer") for c in checks)
    assert checks.count("ebpo diagnose (shipped model)") == 1 and "## ebpo diagnose: builtin" in text
    for model in ("S1", "S2"):
        float32, bfloat16 = [
            row for row in rows if row["check"].startswith("ebpo train") and model in row["check"]
        ]
        assert "float32, sdpa attention" in float32["setting"] and float32["verdict"] == "PASS"
        assert "largest relative difference 0 (all equal)" in float32["measured"]
        assert "bfloat16, sdpa attention" in bfloat16["setting"] and "not bounded" in bfloat16["measured"]
    assert all(row["verdict"] in ("PASS", "n/a") for row in rows), rows
    check_table = text.split("## ebpo diagnose")[0]
    assert check_table.count("\n| ") == len(rows) + 1  # header row + one line per row


def test_metric_comparison_bounds_and_names_what_is_out():
    reference = [{"step": 0}, {"step": 1, "reward/mean": 0.5, "actor/grad_norm": 1.0, "actor/entropy": 0.8}]
    # float32: 0.5 vs 0.5004 is within 1e-4 + 1e-3 * 0.5 = 6e-4; grad norm 1.0 vs 1.01 is not (1.1e-3)
    same, line = gpu_check.compare_metrics(
        [{"step": 1, "reward/mean": 0.5004, "actor/grad_norm": 1.01, "actor/entropy": 0.8}],
        reference,
        1,
        "float32",
    )
    assert not same and "actor/grad_norm@1: 1.01 vs 1" in line and "reward/mean@1" not in line
    # bfloat16 bounds what the responses decide (0.05 + 0.25 * 0.8 = 0.25 for the entropy), reports the rest
    ok, line = gpu_check.compare_metrics(
        [{"step": 1, "reward/mean": 0.52, "actor/grad_norm": 3.0, "actor/entropy": 1.04}],
        reference,
        1,
        "bfloat16",
    )
    assert ok and "of the update's metrics (not bounded) 2 (actor/grad_norm at step 1)" in line
    missing, line = gpu_check.compare_metrics([{"step": 0}], reference, 1, "float32")
    assert not missing and line == "step 1 missing"


def test_throughput_alternates_runs_and_drops_each_runs_first_round():
    assert throughput.run_order(3) == ["ours", "trl", "trl", "ours", "ours", "trl"]
    assert throughput.rounds_from_update_times([1.0, 2.0, 3.0, 4.0], 2) == [3.0, 7.0]
    with pytest.raises(ValueError, match=r"^3 .*\b2\b"):
        throughput.rounds_from_update_times([1.0, 2.0, 3.0], 2)
    calls = []

    def fake(side, wall, cpu):
        def run(work: Path):
            calls.append(side)
            return wall, cpu

        return run

    setting = throughput.Setting("model", prompts=4, group_size=2, updates=2, steps=3)
    runners = {
        "ours": fake("ours", [9.0, 1.0, 1.0], [9.0, 0.5, 0.5]),
        "trl": fake("trl", [9.0, 2.0, 4.0], [9.0, 1.0, 1.0]),
    }
    ours, trl = throughput.measure(setting, 2, runners=runners)
    assert calls == ["ours", "trl", "trl", "ours"]
    # the first round of each run (9.0) is dropped; 8 rollouts per step
    assert ours.wall_s == [1.0, 1.0, 1.0, 1.0] and trl.median_wall_s == 3.0
    assert ours.rollouts_per_s == 8.0 and trl.rollouts_per_cpu_s == 8.0
    # wall: ours 8 / 1 = 8 rollouts/s, TRL 8 / median(2, 4, 2, 4) = 8 / 3 -> 3x; CPU: 8 / 0.5 = 16 vs 8 -> 2x
    assert "**3.00x** from wall time, **2.00x** from CPU time" in throughput.format_table(
        setting, ours, trl, 2, "m"
    )


def test_estimator_benchmark_times_ours_alone_without_verl(monkeypatch):
    monkeypatch.setattr(bench_advantages, "verl_grpo", lambda: None)
    args = argparse.Namespace(device="cpu", threads=1, length=8, repeats=1, loop_repeats=1, seed=0)
    header, rule, row = bench_advantages.table([(4, 2)], args)
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[0] == "4 x 2" and cells[1:3] == ["n/a", "n/a"] and cells[6:] == ["n/a", "n/a"]
    assert all(cell.endswith(" ms") for cell in cells[3:6])


def test_throughput_times_each_built_in_model_on_its_own_task():
    """S2 (``builtin:gym``) is timed on its reasoning-gym mixture with the recipe's generator settings, which
    survive the trip through our trainer's config overrides unchanged (int level keys included); every other
    model on ``arith``."""
    from ebpo.models.names import builtin_recipe
    from ebpo.trainer import load_config

    recipe = builtin_recipe("builtin:gym")
    task, options = throughput.model_task("builtin:gym")
    assert task == recipe.task and task.startswith("gym:")
    setting = throughput.Setting("builtin:gym", task=task, task_options=options)
    cfg = load_config("ebpo", throughput.ours_overrides(setting))
    assert cfg.data.task == recipe.task and cfg.data.task_options == recipe.task_options
    assert cfg.data.chat_template == "auto"
    for model in (None, "builtin", "builtin:arith", "random", "/some/model/dir"):
        assert throughput.model_task(model) == ("arith", "{}")


def test_throughput_runs_both_trainers_on_s2(tmp_path, capsys):
    """A tiny end-to-end run of the script on S2: both trainers train on the gym mixture, and the table names
    the model and the task."""
    out = tmp_path / "times.json"
    args = ["--model", "builtin:gym", "--prompts", "2", "--group-size", "2", "--updates", "1", "--steps", "2"]
    assert throughput.main([*args, "--max-new-tokens", "8", "--repeats", "1", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "gym base model S2" in table and "task gym (the 8-dataset mixture)" in table
    times = json.loads(out.read_text())
    assert times["setting"]["task"].startswith("gym:") and len(times["ours"]["wall_s"]) == 1
    assert len(times["trl"]["cpu_s"]) == 1
