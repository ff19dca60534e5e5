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
    """Fail the test if anything builds the base model; an empty model cache."""
    import ebpo.models.base_model as base_model
    import ebpo.trainer.setup as setup

    def fail(*args, **kwargs):
        pytest.fail("the base model was built")

    monkeypatch.setattr(base_model, "build_base_model", fail)
    monkeypatch.setattr(setup, "build_base_model", fail)
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
