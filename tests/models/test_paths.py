"""Every path ``ebpo train`` prints is accepted by the command a user runs next: ``ebpo eval`` and
``ebpo train model.path=`` take a run directory, a checkpoint or a model directory (``ebpo.models.paths.find_model``)
and say which model they picked; a directory holding no model is one line saying what was expected. The built-in
models have one name on every command (``builtin:<recipe>``, ``ebpo.models.names.resolve_model``)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from ebpo.cli import main
from ebpo.errors import ConfigError
from ebpo.models.paths import find_model
from helpers.trainer import tiny_overrides

EVAL = ["eval", "--benchmarks", "arith", "--limit", "2", "--n", "1", "--ks", "1", "--maj-ks", "1", "--quiet"]


@pytest.fixture(scope="module")
def printed(tiny_model_dir, tmp_path_factory):
    """The paths a 3-step ``ebpo train`` prints (its stdout), run from a fresh directory; and that directory."""
    import contextlib
    import io
    import os

    where = tmp_path_factory.mktemp("user")
    cwd = os.getcwd()
    os.chdir(where)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            overrides = [*tiny_overrides(tiny_model_dir), "run.steps=3", "run.eval_every=1", "run.name=demo"]
            assert main(["train", *overrides]) == 0
    finally:
        os.chdir(cwd)
    text = out.getvalue()
    best = re.search(r"best checkpoint: step (\d+) .* in (\S+)$", text, re.M)
    run = re.search(r"^run directory: (\S+)$", text, re.M)
    assert best is not None and run is not None, text
    return where, run.group(1), best.group(2), int(best.group(1))


def test_find_model_takes_a_run_a_checkpoint_or_a_model_directory(printed):
    where, run, best, best_step = printed
    run_dir = where / run
    found = find_model(run_dir)  # a run directory: its best checkpoint, and the note names the other
    assert found.path == run_dir / "checkpoints" / "best" / "model"
    assert found.checkpoint == run_dir / "checkpoints" / "best"
    assert found.note == (
        f"{run_dir} is a run directory: using its best checkpoint (step {best_step}), {found.path}; its last "
        f"checkpoint (step 3) is {run_dir / 'checkpoints' / 'last'}"
    )
    assert find_model(run_dir / "checkpoints").path == found.path
    last = run_dir / "checkpoints" / "last"
    assert find_model(last) == (
        last / "model",
        last,
        f"{last} is a checkpoint (step 3): using its model, {last / 'model'}",
    )
    assert find_model(last / "model") == (last / "model", last, "")  # a model directory: no note
    with pytest.raises(ConfigError) as err:
        find_model(run_dir / "tensorboard")
    assert str(err.value) == (
        f"{run_dir / 'tensorboard'} holds no model: expected a model directory (config.json and weights), a "
        "checkpoint (model/ inside) or a run directory (checkpoints/best or checkpoints/last)"
    )
    with pytest.raises(ConfigError, match=r"nowhere does not exist; give a model directory, a checkpoint or"):
        find_model(run_dir / "nowhere")


@pytest.mark.parametrize("which", ["run", "best", "model"])
def test_ebpo_eval_takes_each_path_ebpo_train_prints(printed, capsys, monkeypatch, which):
    where, run, best, best_step = printed
    monkeypatch.chdir(where)
    model = {"run": run, "best": best, "model": f"{best}/model"}[which]
    capsys.readouterr()
    assert main([*EVAL, "--no-cache", "--out-dir", f"out-{which}", model]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    notes = [line for line in err.splitlines() if " using its " in line]
    if which == "run":
        assert notes == [
            f"ebpo eval: {run} is a run directory: using its best checkpoint (step {best_step}), {best}/model; "
            f"its last checkpoint (step 3) is {run}/checkpoints/last"
        ]
    elif which == "best":
        assert notes == [
            f"ebpo eval: {best} is a checkpoint (step {best_step}): using its model, {best}/model"
        ]
    else:
        assert notes == []
    results = json.loads((where / f"out-{which}" / "results.json").read_text())
    assert results["results"][model]["arith"]["num_problems"] == 2


def test_ebpo_eval_of_a_directory_without_a_model_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main([*EVAL, "--no-cache", "--out-dir", str(tmp_path / "o"), str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"ebpo eval: error: {tmp_path / 'empty'} holds no model: expected a model directory (config.json and "
        "weights), a checkpoint (model/ inside) or a run directory (checkpoints/best or checkpoints/last) "
        "(or builtin:<recipe> for a built-in model: builtin:arith, builtin:gym)"
    )


def test_ebpo_train_model_path_takes_a_run_directory(printed, tiny_model_dir, capsys, monkeypatch):
    where, run, best, best_step = printed
    monkeypatch.chdir(where)
    capsys.readouterr()
    overrides = [*tiny_overrides(tiny_model_dir), "run.steps=1", f"model.path={run}"]
    assert main(["train", "--run-dir", "next", *overrides]) == 0
    out = capsys.readouterr().out
    assert (
        f"model.path: {run} is a run directory: using its best checkpoint (step {best_step}), {best}/model; "
        f"its last checkpoint (step 3) is {run}/checkpoints/last"
    ) in out.splitlines()
    state = torch.load(where / "next" / "checkpoints" / "last" / "trainer_state.pt", weights_only=False)
    assert state["base_path"] == f"{best}/model"  # the initial weights (and the KL reference's)


def test_ebpo_train_model_path_without_a_model_is_one_line(tmp_path, tiny_model_dir, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes").mkdir()
    overrides = [*tiny_overrides(tiny_model_dir), "run.steps=1", "model.path=notes"]
    assert main(["train", "--run-dir", "run", *overrides]) == 2
    assert capsys.readouterr().err.strip() == (
        "ebpo train: error: model.path: notes holds no model: expected a model directory (config.json and "
        "weights), a checkpoint (model/ inside) or a run directory (checkpoints/best or checkpoints/last) "
        "(or builtin:<recipe> for a built-in model: builtin:arith, builtin:gym)"
    )


def test_ebpo_diagnose_model_takes_the_same_paths(printed, tmp_path, capsys, monkeypatch):
    from ebpo.diagnostics.study import DiagnoseConfig, _load_policy

    where, run, best, best_step = printed
    monkeypatch.chdir(where)
    model, _ = _load_policy(DiagnoseConfig(model=run), torch.device("cpu"))
    assert model.name_or_path == f"{best}/model"
    (tmp_path / "empty").mkdir()
    assert main(["diagnose", "--model", str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"ebpo diagnose: error: --model: {tmp_path / 'empty'} holds no model: expected a model directory (config.json "
        "and weights), a checkpoint (model/ inside) or a run directory (checkpoints/best or checkpoints/last) "
        "(or builtin:<recipe> for a built-in model: builtin:arith, builtin:gym)"
    )


# ---------------------------------------------------------------------------------------------------------
# the built-in models by name: builtin (= builtin:arith, = a null model.path) and builtin:gym on every command

UNKNOWN = (
    "unknown built-in model 'builtin:nope'; valid choices: builtin, builtin:arith, builtin:gym "
    "(builtin = builtin:arith)"
)


def test_builtin_names_resolve_to_the_shipped_models():
    from ebpo.models.names import builtin_recipe, resolve_model
    from ebpo.models.recipes.arith import SHIPPED_DIR
    from ebpo.models.recipes.gym import SHIPPED_DIR as GYM_SHIPPED_DIR

    for name in (None, "builtin", "builtin:arith"):
        assert resolve_model(name) == (SHIPPED_DIR, None, "")
        assert builtin_recipe(name).task == "arith"
    assert resolve_model("builtin:gym") == (GYM_SHIPPED_DIR, None, "")
    assert builtin_recipe("builtin:gym").task.startswith("gym:")
    assert builtin_recipe("runs/builtin") is None and builtin_recipe("builtinx:gym") is None  # paths
    for bad in ("builtin:nope", "builtin:"):
        with pytest.raises(ConfigError) as err:
            resolve_model(bad)
        assert str(err.value) == UNKNOWN.replace("'builtin:nope'", repr(bad))


@pytest.mark.parametrize(
    "argv, line",
    [
        (["train", "model.path=builtin:nope"], f"ebpo train: error: model.path: {UNKNOWN}"),
        (
            [*EVAL, "--no-cache", "builtin:nope"],
            f"ebpo eval: error: {UNKNOWN} (or builtin:<recipe> for a built-in model: builtin:arith, builtin:gym)",
        ),
        (["diagnose", "--model", "builtin:nope"], f"ebpo diagnose: error: --model: {UNKNOWN}"),
    ],
    ids=["train", "eval", "diagnose"],
)
def test_an_unknown_builtin_model_is_one_line_listing_the_valid_ones(
    argv, line, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == line
    assert not (tmp_path / "runs").exists()  # refused before a run directory was made


def test_ebpo_eval_of_builtin_gym_scores_s2_on_its_mixture_by_default(tmp_path, capsys):
    from ebpo.models.recipes.gym import MIXTURE, TASK

    argv = ["eval", "--limit", "2", "--n", "1", "--ks", "1", "--maj-ks", "1", "--quiet", "--no-cache"]
    assert main([*argv, "--out-dir", str(tmp_path), "builtin:gym"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["benchmarks"] == [TASK]
    assert results["settings"]["task_options"] == json.loads(json.dumps(MIXTURE))  # its settings (JSON keys)
    assert results["results"]["builtin:gym"][TASK]["num_problems"] == 2


def test_ebpo_diagnose_of_builtin_gym_draws_from_its_mixture_by_default():
    import yaml

    from ebpo.diagnostics.config import DiagnoseConfig, with_model_task
    from ebpo.models.recipes.gym import MIXTURE, TASK

    gym = with_model_task(DiagnoseConfig(model="builtin:gym"))
    assert gym.task == TASK and yaml.safe_load(gym.task_options) == MIXTURE
    assert with_model_task(DiagnoseConfig()).task == "arith" and DiagnoseConfig().task is None
    assert with_model_task(DiagnoseConfig(model="some/dir")).task == "arith"
    given = with_model_task(DiagnoseConfig(model="builtin:gym", task="gym:gcd", task_options="{gcd: {}}"))
    assert (given.task, given.task_options) == ("gym:gcd", "{gcd: {}}")


def test_the_summary_says_which_checkpoint_eval_scores_and_the_last_when_it_differs(tmp_path):
    from ebpo.trainer.cli import checkpoint_lines
    from ebpo.trainer.report import TrainResult

    run = tmp_path / "gym-demo"
    # the gym preset's shape: maj@8 peaks at step 50, the table's after column is step 150
    result = TrainResult(run, step=150, eval_after={"eval/maj@8": 0.483}, best_step=50, best_score=0.4896)
    assert checkpoint_lines(result, 8) == [
        f"best checkpoint: step 50 (the highest validation maj@8, 0.490; what `ebpo eval {run}` scores) in "
        f"{run}/checkpoints/best",
        f"last checkpoint: step 150 (maj@8 0.483, the table's after column) in {run}/checkpoints/last",
    ]
    result.best_step = 150  # the best is the final step: one line
    assert len(checkpoint_lines(result, 8)) == 1
    result.best_step = None  # no validation ran: nothing to say
    assert checkpoint_lines(result, 8) == []
