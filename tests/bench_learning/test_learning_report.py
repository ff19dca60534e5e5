"""The learning benchmark's results page, CSV and plots, from synthetic results with hand-derived figures."""

from __future__ import annotations

import csv
from types import SimpleNamespace

import pytest
from benchmarks import pages
from benchmarks.learning import matrix, report
from benchmarks.learning.methods import ESTIMATORS, PUBLISHED
from benchmarks.learning.spec import FIXED_PROMPTS, Budget
from learning_helpers import fake_result


def _rows(configs_dir, pass1, val=None, **design):
    """Rows of a plan whose results get test Pass@1 ``pass1(cell)`` and validation curve ``val(cell)``."""
    budget = Budget(steps=10, responses=32, test_size=9).resolve(configs_dir)
    plan = matrix.plan(matrix.Design(**design), budget, model_path="/m", configs=configs_dir)
    results = {}
    for cell, spec in zip(plan.cells, plan.specs):
        results.setdefault(spec.key, fake_result(spec, pass1(cell), val(cell) if val else None))
    return [report.Row(cell, results[spec.key]) for cell, spec in zip(plan.cells, plan.specs)], plan


def test_sensitivity_check_pass_and_fail_by_hand(configs_dir):
    design = dict(
        arms=(PUBLISHED,), methods=("grpo",), groups=(4, 16), variants=(FIXED_PROMPTS,), seeds=(0, 1, 2)
    )
    # G = 16 minus G = 4 in test Pass@1: 0.10, 0.11, 0.12 per seed -> +11.0 ± 2.5 points (s = 0.01,
    # half = 4.303 * 0.01 / sqrt(3) = 0.0248): the interval excludes 0 -> PASS
    rows, _ = _rows(configs_dir, lambda c: 0.2 + (0.1 + 0.01 * c.seed) * (c.group_size == 16), **design)
    table, verdict = report.sensitivity(rows, (4, 16))
    assert verdict == "PASS" and "| **+11.0 ± 2.5** | yes |" in table
    # no difference on either metric: differences 0.01, -0.01, 0 -> an interval around 0 -> FAIL
    rows, _ = _rows(configs_dir, lambda c: 0.2 + 0.01 * (c.group_size == 16) * (1 - c.seed), **design)
    table, verdict = report.sensitivity(rows, (4, 16))
    assert verdict == "FAIL" and "| no |" in table
    # only validation AUC differs: still PASS (either metric). AUC: curve 0.2, 0.2+d, 0.2+d over 10 steps =
    # (5 * (0.4 + d) / 2 + 5 * (0.4 + 2d) / 2) / 10 = 0.2 + 0.75 d; d = 0.1, 0.12, 0.14 -> +9.0 ± 3.7 points
    rows, _ = _rows(
        configs_dir,
        lambda c: 0.3,
        lambda c: [0.2] + [0.2 + (0.1 + 0.02 * c.seed) * (c.group_size == 16)] * 2,
        **design,
    )
    table, verdict = report.sensitivity(rows, (4, 16))
    assert verdict == "PASS" and "| **+9.0 ± 3.7** | yes |" in table
    rows, _ = _rows(
        configs_dir, lambda c: 0.2, arms=(ESTIMATORS,), methods=("ebpo",), sensitivity=None, seeds=(0,)
    )
    assert report.sensitivity(rows, (4, 16)) == ("", "NOT RUN")


def test_results_page_csv_and_plots(configs_dir, tmp_path):
    # EBPO 0.1 above GRPO on seeds 0 and 1, 0.3 above on seed 2: paired +16.7 ± 28.7 points
    # (differences 0.1, 0.1, 0.3: mean 0.1667, s = 0.1155, half = 4.303 * 0.1155 / sqrt(3) = 0.2868)
    def pass1(cell):
        lift = (0.3 if cell.seed == 2 else 0.1) if cell.method == "ebpo" else 0.0
        return 0.2 + lift + 0.05 * (cell.group_size == 16)

    rows, plan = _rows(
        configs_dir,
        pass1,
        lambda c: [0.2, 0.3 if c.method == "ebpo" else 0.2, 0.4 if c.method == "ebpo" else 0.25],
        methods=("grpo", "ebpo", "entropymech-clip-cov"),
        sweep=("grpo",),
        groups=(4, 16),
        seeds=(0, 1, 2),
    )
    for row in rows:  # test samples by kind: right as often as Pass@1 says, every other sample a run-on
        right = row.result["test"]["pass@1"]  # keys sorted, as a result.json read back has them
        row.result["test"]["answer_kinds"] = {"near miss": 0.0, "right": right, "run-on": 1 - right}
    sessions = [{"wall_s": 90.0, "jobs": 2}, {"wall_s": 30.0, "jobs": 2}]
    written = report.write_report(
        rows,
        tmp_path,
        "unit",
        command="python -m benchmarks.learning --unit --report-only",
        missing=0,
        headline=4,
        sensitivity_pair=(4, 16),
        threshold=0.1,
        sessions=sessions,
        best_how="",
    )
    names = sorted(p.name for p in written)
    assert names == sorted(
        [
            "learning_unit.md",
            "learning_unit_cells.csv",
            "learning_unit_sensitivity.png",
            "learning_unit_estimators_curves.png",
            "learning_unit_estimators_vs_G.png",
            "learning_unit_published_curves.png",
            "learning_unit_published_vs_G.png",
        ]
    )
    assert all(p.stat().st_size > 0 for p in written)
    text = (tmp_path / "learning_unit.md").read_text()
    # the sensitivity check comes first: +5 points on every seed (no spread) -> an interval of width 0
    assert text.index("Sensitivity check") < text.index("arm (a)") < text.index("arm (b)")
    assert "GRPO at G = 4 vs G = 16 — **FAIL**" not in text and "— **PASS**" in text
    assert "| ebpo | 3 | 36.7 ± 28.7 |" in text and "| **+16.7 ± 28.7** |" not in text
    assert "| +16.7 ± 28.7 |" in text  # paired against GRPO, not bold: the interval holds 0
    # steps to +10 points: EBPO's validation 0.2 -> 0.3 at step 5; GRPO never (0.25 at most)
    assert "| 5 (3/3) |" in text and "| > 10 (0/3) |" in text
    # run time: 3 runs x (10 + 2) s of run clocks per distinct run, beside the sessions' 120 s of wall time
    distinct = len({r.result["key"] for r in rows})
    assert f"{distinct * 12 / 60:.1f} min; their CPU time {distinct * 9 / 60:.1f} min" in text
    assert "**Matrix wall time** (sum over the 2 invocations" in text and "2.0 min" in text
    assert "Runs produced by: `python -m benchmarks.learning --unit`" in text
    # answer kinds: GRPO 0.2 right at G = 4, 0.25 at G = 16 on every seed; EBPO (0.3, 0.3, 0.5) as above
    assert "| runs | right | near miss | run-on |\n" in text
    assert "| GRPO G=4 | 20.0 ± 0.0 | 0.0 ± 0.0 | 80.0 ± 0.0 |" in text
    assert "| GRPO G=16 | 25.0 ± 0.0 | 0.0 ± 0.0 | 75.0 ± 0.0 |" in text
    assert "| ebpo | 36.7 ± 28.7 | 0.0 ± 0.0 | 63.3 ± 28.7 |" in text  # the headline cell's kinds, arm (a)
    with open(tmp_path / "learning_unit_cells.csv") as handle:
        table = list(csv.DictReader(handle))
    assert len(table) == len(plan.cells)  # one row per cell, runs shared between cells repeated
    ebpo = [r for r in table if r["method"] == "ebpo" and r["seed"] == "2"][0]
    assert float(ebpo["pass1"]) == pytest.approx(0.5) and ebpo["steps_to_threshold"] == "5"
    answer_columns = [c for c in table[0] if c.startswith("test_answers_")]  # in arith.ANSWER_KINDS order
    assert answer_columns == ["test_answers_right", "test_answers_near_miss", "test_answers_run_on"]
    assert float(ebpo["test_answers_right"]) == pytest.approx(0.5)
    assert float(ebpo["test_answers_run_on"]) == pytest.approx(0.5)
    assert float(ebpo["auc"]) == pytest.approx((5 * 0.5 / 2 + 5 * 0.7 / 2) / 10)  # 0.2-0.3-0.4 over 10 steps
    assert "No finished runs yet" in report.report_markdown(
        [], tag="x", command="c", missing=3, headline=4, sensitivity_pair=None, threshold=0.1
    )


def test_each_method_is_one_row_even_where_the_arm_registers_ebpo_best():
    """The estimators arm registers ``ebpo-best`` itself; the report appended it again, so its tables printed
    the row twice. Rows here only need ``cell.arm`` and ``cell.method``."""
    from types import SimpleNamespace

    def row(arm, method):
        return SimpleNamespace(cell=SimpleNamespace(arm=arm, method=method))

    rows = [row("estimators", name) for name in ("grpo", "ebpo", report.BEST)] + [row("published", "grpo")]
    names = report._methods(rows, "estimators")
    assert names.count(report.BEST) == 1
    assert set(names) == {"grpo", "ebpo", report.BEST}
    assert report._methods(rows, "published") == ["grpo"]


def test_the_page_names_the_model_by_a_path_any_checkout_shares_and_its_recipe_key(tmp_path, monkeypatch):
    # an absolute path (`/work/main/src/ebpo/models/arith_base`) would be true in one checkout only
    repo, home = tmp_path / "repo", tmp_path / "home"
    shipped = repo / "src" / "ebpo" / "models" / "arith_base"
    shipped.mkdir(parents=True)
    (shipped / "build_info.json").write_text('{"key": "a33a8f87d156"}')
    cached = home / ".cache" / "ebpo" / "base_models" / "arith-30e4105233de"
    cached.mkdir(parents=True)
    monkeypatch.setattr(pages, "REPO", repo)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("EBPO_CACHE", raising=False)
    assert report.describe_model(str(shipped)) == (
        "`src/ebpo/models/arith_base` (base-model recipe key `a33a8f87d156`)"
    )
    # a build in the cache: under the cache's default root; no build_info.json (a model of one's own): no key
    assert report.describe_model(str(cached)) == "`~/.cache/ebpo/base_models/arith-30e4105233de`"
    (cached / "build_info.json").write_text("{not json")
    assert report.describe_model(str(cached)) == "`~/.cache/ebpo/base_models/arith-30e4105233de`"
    # a cache moved by $EBPO_CACHE is named by the default root all the same (where a reader's build goes)
    monkeypatch.setenv("EBPO_CACHE", str(tmp_path / "scratch"))
    moved = tmp_path / "scratch" / "base_models" / "arith-30e4105233de"
    assert report.describe_model(str(moved)) == "`~/.cache/ebpo/base_models/arith-30e4105233de`"
    # any other folder of this machine, in the home directory or not: the reader's own, a placeholder
    assert report.describe_model("/elsewhere/model") == "`<model-path>`"
    assert report.describe_model(str(home / "models" / "mine")) == "`<model-path>`"
    assert report.describe_model("Qwen/Qwen2.5-Math-1.5B") == "`Qwen/Qwen2.5-Math-1.5B`"  # a hub id
    # the shipped model of another checkout (runs made there, reported here): named as in this one
    elsewhere = tmp_path / "other-checkout" / "src" / "ebpo" / "models" / "arith_base"
    assert report.describe_model(str(elsewhere)) == "`src/ebpo/models/arith_base`"


def test_a_printed_command_names_paths_relative_to_the_repository_or_a_placeholder(tmp_path, monkeypatch):
    """Runs record the command as typed, absolute paths included; the page, the CSV and the selection file
    print it so that any checkout can run it."""
    repo = tmp_path / "repo"
    monkeypatch.setattr(pages, "REPO", repo)
    monkeypatch.setenv("EBPO_CACHE", str(tmp_path / "cache"))
    typed = (
        f"python -m benchmarks.learning --jobs 2 --runs-dir {repo}/runs/bench_learning/defaults "
        f"--results-dir=/scratch/results --model-path {tmp_path}/cache/base_models/arith-9ef01a0ba85f "
        "--best-file docs/results/ebpo_best_options.json --set 'model.path=/data/my model' --tag 'a b'"
    )
    assert pages.portable_command(typed) == (
        "python -m benchmarks.learning --jobs 2 --runs-dir runs/bench_learning/defaults "
        "--results-dir=<results-dir> --model-path ~/.cache/ebpo/base_models/arith-9ef01a0ba85f "
        "--best-file docs/results/ebpo_best_options.json --set model.path=<model.path> --tag 'a b'"
    )
    assert (
        pages.portable_command("python -m benchmarks.learning --quick")
        == "python -m benchmarks.learning --quick"
    )
    assert (
        pages.portable_path("/tmp/x") == "<path>" and pages.portable_path("~/x", "--runs-dir") == "<runs-dir>"
    )
    rows = [SimpleNamespace(result={"command": typed}), SimpleNamespace(result={})]
    assert report.commands_line(rows) == (  # one command per distinct run command, portable
        "Runs produced by: `not recorded`; `" + pages.portable_command(typed) + "`"
    )
