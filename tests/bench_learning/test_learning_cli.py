"""The learning benchmark's command line: modes that must build nothing, one-line errors, the report from
finished runs, and the disjointness of the selection seeds."""

from __future__ import annotations

import json

import pytest
from benchmarks.learning import cli, matrix
from benchmarks.learning.run import RESULT_FILE, run_dir, write_json_atomic
from learning_helpers import fake_result


@pytest.fixture
def no_build(monkeypatch, tmp_path):
    """Fail the test if anything builds the base model (every command reaches it through
    ``ebpo.models.names.resolve_model``); an empty model cache."""
    import ebpo.models.build as build

    def fail(*args, **kwargs):
        pytest.fail("the base model was built")

    monkeypatch.setattr(build, "build_base_model", fail)
    monkeypatch.setenv("EBPO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _args(configs_dir, tmp_path, *extra):
    return [
        "--quick",
        "--configs-dir",
        str(configs_dir),
        "--runs-dir",
        str(tmp_path / "runs"),
        "--results-dir",
        str(tmp_path / "results"),
        *extra,
    ]


def test_dry_run_plan_estimate_and_report_only_build_nothing(configs_dir, tmp_path, no_build, capsys):
    assert cli.main(_args(configs_dir, tmp_path, "--dry-run")) == 0
    out = capsys.readouterr().out
    assert "to run  published/grpo/fixed-prompts/G4/seed0" in out and "distinct runs (0 finished" in out
    assert cli.main(_args(configs_dir, tmp_path, "--plan")) == 0
    assert "projected time: no finished runs" in capsys.readouterr().out
    assert cli.main(_args(configs_dir, tmp_path, "--estimate")) == 2  # nothing to estimate from: one line
    err = capsys.readouterr().err
    assert err.startswith("error: no finished runs") and len(err.strip().splitlines()) == 1
    assert cli.main(_args(configs_dir, tmp_path, "--report-only")) == 0
    assert "No finished runs yet" in (tmp_path / "results" / "learning_quick.md").read_text()
    assert not no_build.exists() and not (tmp_path / "runs").exists()  # no model, no run directory


def test_report_only_and_estimate_from_finished_runs(configs_dir, tmp_path, no_build, capsys):
    args = cli.build_parser().parse_args(_args(configs_dir, tmp_path))
    budget = cli.budget_from(args).resolve(configs_dir)
    design = cli.design_from(args)
    assert design.seeds == (0, 1) and design.groups == (4, 16) and budget.steps == 6  # --quick's sizes
    model = str(no_build / "base_models" / "x")  # --model-path: any directory name, nothing is built
    plan = matrix.plan(design, budget, model_path=model, configs=configs_dir)
    for spec in plan.runs:
        directory = run_dir(tmp_path / "runs", spec)
        directory.mkdir(parents=True)
        write_json_atomic(directory / RESULT_FILE, fake_result(spec, 0.25))
    assert cli.main(_args(configs_dir, tmp_path, "--model-path", model, "--report-only")) == 0
    text = (tmp_path / "results" / "learning_quick.md").read_text()
    assert (
        text.index("## Sensitivity check") < text.index("## arm (a)")
        and "| entropymech-clip-cov | 2 |" in text
    )
    capsys.readouterr()
    assert cli.main(_args(configs_dir, tmp_path, "--model-path", model, "--plan")) == 0
    out = capsys.readouterr().out
    assert f"{len(plan.runs)} distinct runs ({len(plan.runs)} finished, 0 to run)" in out
    assert f"all planned runs: {len(plan.runs)} runs:" in out and "still to run:     0 runs" in out
    assert not no_build.exists()


def test_errors_are_one_line(configs_dir, tmp_path, no_build, capsys):
    assert cli.main(_args(configs_dir, tmp_path, "--methods", "ppo", "--dry-run")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown method 'ppo'") and len(err.strip().splitlines()) == 1
    assert cli.main(_args(configs_dir, tmp_path, "--groups", "4", "6", "--dry-run")) == 2
    assert "not a multiple of G=6" in capsys.readouterr().err


def test_rows_on_your_own_estimators_with_their_options(
    configs_dir, tmp_path, no_build, capsys, plugin_pkg_dir, plugin_sandbox, monkeypatch
):
    from helpers.plugins import FILE_ESTIMATOR, MY_ESTIMATORS, PKG_ESTIMATOR

    # a lone file's estimator (--plugins) and an installed package's (its entry point), as arm (a) rows
    monkeypatch.syspath_prepend(str(plugin_pkg_dir))
    rows = [f"{FILE_ESTIMATOR}:q=0.25", f"estimators/{PKG_ESTIMATOR}:trim=1", "grpo"]
    given = ["--plugins", str(MY_ESTIMATORS), "--methods", *rows, "--sweep", "--no-sensitivity", "--dry-run"]
    assert cli.main(_args(configs_dir, tmp_path, *given)) == 0
    out = capsys.readouterr().out
    for row in (f"estimators/{FILE_ESTIMATOR}:q=0.25", f"estimators/{PKG_ESTIMATOR}:trim=1"):
        assert f"to run  {row}/fixed-prompts/G4/seed0" in out
    args = cli.build_parser().parse_args(_args(configs_dir, tmp_path, *given))
    cli.load_plugins(args.plugins)
    plan = matrix.plan(cli.design_from(args), cli.budget_from(args), model_path="m", configs=configs_dir)
    (spec, *_) = [s for c, s in zip(plan.cells, plan.specs) if c.method.startswith(FILE_ESTIMATOR)]
    config = spec.load_config()
    assert (config.algorithm.estimator, config.algorithm.estimator_options) == (FILE_ESTIMATOR, {"q": 0.25})
    assert config.algorithm.loss_agg_mode == "seq-mean-token-mean"  # GRPO's loss, as every arm (a) row
    # a row's options are checked by its estimator, in one line naming the row
    bad = ["--plugins", str(MY_ESTIMATORS), "--methods", f"{FILE_ESTIMATOR}:p=1", "--dry-run"]
    assert cli.main(_args(configs_dir, tmp_path, *bad)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: method {FILE_ESTIMATOR}:p=1: advantage estimator {FILE_ESTIMATOR!r} got")
    assert len(err.strip().splitlines()) == 1


def test_selection_seeds_are_kept_apart_from_the_reported_seeds(configs_dir, tmp_path, no_build, capsys):
    # --select-options on a reported (default) seed is refused before anything runs
    assert cli.main(_args(configs_dir, tmp_path, "--select-options", "--seeds", "0", "100", "--dry-run")) == 2
    assert "seeds [0] were used to select ebpo-best" in capsys.readouterr().err
    assert cli.main(_args(configs_dir, tmp_path, "--select-options", "--dry-run")) == 0  # 100 101 102
    assert "estimators/ebpo-latent/fixed-prompts/G4/seed100" in capsys.readouterr().out
    # a matrix with ebpo-best on the seeds the selection used is refused
    best = tmp_path / "best.json"
    model = str(no_build / "m")
    best.write_text(
        json.dumps(
            {"method": "ebpo-prior", "chosen_by": "t", "seeds": [1], "model_path": model, "command": "c"}
            | {"resolved": True}
        )
    )
    matrix_args = ["--methods", "ebpo-best", "--best-file", str(best), "--model-path", model, "--dry-run"]
    assert cli.main(_args(configs_dir, tmp_path, *matrix_args)) == 2
    assert "seeds [1] were used to select ebpo-best" in capsys.readouterr().err
    assert cli.main(_args(configs_dir, tmp_path, *matrix_args, "--seeds", "2", "3")) == 0


def test_ctrl_c_is_one_line_and_exit_130(configs_dir, tmp_path, no_build, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(matrix, "run_matrix", interrupted)
    assert cli.main(_args(configs_dir, tmp_path, "--model-path", str(tmp_path))) == 130
    err = capsys.readouterr().err
    assert err.startswith("interrupted: finished runs are kept") and len(err.strip().splitlines()) == 1


def test_select_options_names_ebpo_best_only_for_a_resolved_lead(configs_dir, tmp_path, no_build, capsys):
    """The selection from finished runs (--report-only): its file, its page and the matrix that reads it. A
    run's validation AUC here is 0.05 + 0.75 x (its curve is 0.2, x, x over 10 steps); ebpo and every other
    candidate have x = 0.3 (AUC 0.275) on seeds 100-102."""
    model, best = str(no_build / "base_models" / "x"), tmp_path / "best.json"
    select = _args(configs_dir, tmp_path, "--select-options", "--model-path", model, "--best-file", str(best))
    plan = matrix.plan(
        cli.design_from(cli.build_parser().parse_args(select)),
        cli.budget_from(cli.build_parser().parse_args(select)).resolve(configs_dir),
        model_path=model,
        configs=configs_dir,
    )
    matrix_args = ["--model-path", model, "--best-file", str(best), "--dry-run"]

    def select_with(pooled: dict[int, float]) -> dict:
        for cell, spec in zip(plan.cells, plan.specs):
            x = pooled[cell.seed] if cell.method == "ebpo-pooled" else 0.3
            directory = run_dir(tmp_path / "runs", spec)
            directory.mkdir(parents=True, exist_ok=True)
            write_json_atomic(directory / RESULT_FILE, fake_result(spec, 0.25, [0.2, x, x], command="c"))
        assert cli.main([*select, "--report-only"]) == 0
        return json.loads(best.read_text())

    # ebpo-pooled leads by +0.15, -0.075, +0.15 (x = 0.5, 0.2, 0.5): +7.50 ± 32.3 points, not resolved
    chosen = select_with({100: 0.5, 101: 0.2, 102: 0.5})
    assert (chosen["method"], chosen["resolved"], chosen["seeds"]) == ("ebpo-pooled", False, [100, 101, 102])
    assert "ebpo-pooled 0.3500 (n=3)" in chosen["chosen_by"] and "[-24.77, +39.77]" in chosen["chosen_by"]
    assert "--runs-dir <runs-dir>" in chosen["command"] and str(tmp_path) not in chosen["command"]
    assert chosen["model_path"] == "~/.cache/ebpo/base_models/x"  # in the cache ($EBPO_CACHE here)
    assert capsys.readouterr().out.startswith("no resolved winner (no ebpo-best row): highest mean")
    page = (tmp_path / "results" / "learning_options.md").read_text()
    assert "- **Selection**: highest mean validation AUC: ebpo-pooled 0.3500 (n=3)" in page
    assert "not resolved: no resolved winner" in page
    assert (
        cli.main(_args(configs_dir, tmp_path, "--methods", "grpo", "estimators/ebpo-best", *matrix_args)) == 2
    )
    assert (
        "estimators/ebpo-best was asked for, but the selection found no resolved winner"
        in capsys.readouterr().err
    )
    # a lead of +0.075, +0.075, +0.09 (x = 0.4, 0.4, 0.42): +8.00 ± 2.15 points, resolved
    chosen = select_with({100: 0.4, 101: 0.4, 102: 0.42})
    assert (chosen["method"], chosen["resolved"]) == (
        "ebpo-pooled",
        True,
    ) and "resolved: ebpo-best" in chosen["chosen_by"]
    capsys.readouterr()
    assert (
        cli.main(_args(configs_dir, tmp_path, "--methods", "grpo", "estimators/ebpo-best", *matrix_args)) == 0
    )
    assert "estimators/ebpo-best/fixed-prompts/G4/seed0" in capsys.readouterr().out
