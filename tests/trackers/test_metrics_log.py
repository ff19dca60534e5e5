"""``ebpo.trackers.metrics_log`` under ``run.report_to``: TensorBoard, wandb and MLflow hold what ``metrics.jsonl`` holds, step by step, across a
resume and across a kill, read back through each library's own reader (``helpers.trackers``).

wandb runs offline and MLflow on a local file store, both in ``tmp_path``; no test contacts a server.
"""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from ebpo.errors import ConfigError
from ebpo.trackers import check_trackers, mlflow_metric_name
from ebpo.trainer.setup import check_setup
from ebpo.trainer.trainer import Trainer
from helpers.trackers import (
    mlflow_artifact,
    mlflow_history,
    offline_trackers,
    saved_runs,
    tensorboard_plugins,
    tensorboard_scalars,
    tensorboard_texts,
    wandb_history,
    wandb_segments,
)
from helpers.trainer import tiny_config

pytest.importorskip("wandb", reason="the wandb extra is not installed (pip install 'ebpo[wandb]')")
pytest.importorskip("mlflow", reason="the mlflow extra is not installed (pip install 'ebpo[mlflow]')")

ALL = "run.report_to=[tensorboard,wandb,mlflow]"


@pytest.fixture
def offline(monkeypatch, tmp_path):
    yield from offline_trackers(monkeypatch, tmp_path)


class Killed(BaseException):
    """Stands in for SIGKILL: a BaseException, so no ``except Exception`` on the way can swallow it."""


def killed_in_step(step: int, trainer: Trainer, monkeypatch) -> None:
    """Train until ``Killed`` is raised at the start of step ``step``."""
    train_step = trainer._train_step

    def dies():
        if trainer.step == step - 1:
            raise Killed
        return train_step()

    monkeypatch.setattr(trainer, "_train_step", dies)
    trainer.train()


def jsonl(run_dir) -> dict[int, dict[str, float]]:
    """step -> metrics of ``metrics.jsonl``."""
    from ebpo.trackers import read_metrics

    return {int(row.pop("step")): row for row in read_metrics(run_dir)}


def in_mlflow(rows: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
    return {step: {mlflow_metric_name(k): v for k, v in row.items()} for step, row in rows.items()}


def test_three_trackers_hold_metrics_jsonl_across_a_resume(tiny_model_dir, tmp_path, offline):
    wandb_dir, uri = offline
    run = tmp_path / "run"
    options = (ALL, "run.eval_every=1", "run.plot=true")
    Trainer(tiny_config(tiny_model_dir, "run.steps=2", *options), run_dir=run).train()
    first = saved_runs(run)
    Trainer(tiny_config(tiny_model_dir, "run.steps=3", *options), resume=run).train()
    assert saved_runs(run) == first  # the resume continued each tracker's run

    rows = jsonl(run)
    assert sorted(rows) == [0, 1, 2, 3] and "eval/maj@2" in rows[3]
    # TensorBoard: float64 scalars, every value of every step
    assert tensorboard_scalars(run / "tensorboard") == rows
    assert tensorboard_plugins(run / "tensorboard")["training"] == "images"
    texts = tensorboard_texts(run / "tensorboard")
    assert "steps: 3" in texts["config"][-1]
    assert json.loads(texts["summary"][-1].replace("    ", "")) == json.loads(
        (run / "summary.json").read_text()
    )

    # wandb: one run id, one offline folder per process, each step once
    segments = wandb_segments(wandb_dir)
    assert [s.run_id for s in segments] == [first["wandb"]["id"]] * 2
    assert wandb_history(segments, first["wandb"]["id"]) == rows
    assert [s.config["run"]["steps"] for s in segments] == [2, 3]  # the resume's options
    assert [s.exit_code for s in segments] == [0, 0]
    summary = json.loads((run / "summary.json").read_text())
    last = segments[-1].summary
    assert {key: last[key] for key in summary} == summary
    assert (segments[-1].folder / "files" / last["training"]["path"]).stat().st_size > 1000

    # MLflow: one run, the metrics under MLflow's spelling, each step once
    run_id = first["mlflow"]["run_id"]
    assert mlflow_history(uri, run_id) == in_mlflow(rows)
    from mlflow.tracking import MlflowClient

    logged = MlflowClient(uri).get_run(run_id)
    assert logged.info.status == "FINISHED" and logged.info.run_name == "run"
    assert logged.data.params["run.steps"] == "2"  # MLflow keeps a parameter's first value ...
    config = yaml.safe_load(mlflow_artifact(uri, run_id, "config.yaml", tmp_path / "a").read_text())
    assert config["run"]["steps"] == 3  # ... and config.yaml the latest
    assert json.loads(mlflow_artifact(uri, run_id, "summary.json", tmp_path / "b").read_text()) == summary
    assert mlflow_artifact(uri, run_id, "training.png", tmp_path / "c").stat().st_size > 1000


def test_a_kill_leaves_no_step_twice_and_every_value_as_metrics_jsonl(
    tiny_model_dir, tmp_path, monkeypatch, offline
):
    # Steps 0-3 logged, the checkpoint at step 2, killed in step 4: the resume drops step 3 from
    # metrics.jsonl and trains it again. TensorBoard hides the killed step 3; wandb and MLflow cannot delete
    # it, so they continue in new runs that get steps 0-2 replayed. Every tracker's run then holds each step
    # once with metrics.jsonl's value (the timings of the two step-3s differ, so a stale one would show).
    wandb_dir, uri = offline
    run = tmp_path / "run"
    with pytest.raises(Killed):
        killed_in_step(4, Trainer(tiny_config(tiny_model_dir, "run.steps=4", ALL), run_dir=run), monkeypatch)
    killed = saved_runs(run)
    killed_step_3 = jsonl(run)[3]

    resumed = Trainer(tiny_config(tiny_model_dir, "run.steps=4", ALL), resume=run)
    assert resumed.step == 2 and resumed.rewound
    resumed.train()
    rows = jsonl(run)
    assert sorted(rows) == [0, 1, 2, 3, 4]
    assert rows[3]["timing_s/step"] != killed_step_3["timing_s/step"]

    assert tensorboard_scalars(run / "tensorboard") == rows
    now = saved_runs(run)
    assert now["wandb"]["id"] != killed["wandb"]["id"]
    assert now["mlflow"]["run_id"] != killed["mlflow"]["run_id"]
    segments = wandb_segments(wandb_dir)
    assert wandb_history(segments, now["wandb"]["id"]) == rows
    # the killed process's runs are left as they were: steps 0-2 (as the checkpoint's history has them), its 3
    old = {0: rows[0], 1: rows[1], 2: rows[2], 3: killed_step_3}
    assert wandb_history(segments, killed["wandb"]["id"]) == old
    assert mlflow_history(uri, now["mlflow"]["run_id"]) == in_mlflow(rows)
    assert mlflow_history(uri, killed["mlflow"]["run_id"]) == in_mlflow(old)


def test_a_wandb_run_its_process_did_not_close_is_replaced(tiny_model_dir, tmp_path, monkeypatch, offline):
    # Killed in step 3, after the checkpoint at step 2: nothing to rewind, but the process died without ending
    # its tracker runs. wandb's service writes a run's log in blocks, so a run its process did not close may
    # lack the last steps: it is replaced (history replayed). MLflow writes each call through and TensorBoard
    # flushes each step, so their runs continue.
    from ebpo.trackers import runs

    wandb_dir, uri = offline
    run = tmp_path / "run"
    with monkeypatch.context() as killed_process, pytest.raises(Killed):
        # a killed process ends none of its tracker runs
        killed_process.setattr(runs.TrackerRuns, "close", lambda self, status="finished": None)
        killed_in_step(3, Trainer(tiny_config(tiny_model_dir, "run.steps=4", ALL), run_dir=run), monkeypatch)
    killed = saved_runs(run)
    assert not killed["wandb"]["closed"] and not killed["mlflow"]["closed"]

    resumed = Trainer(tiny_config(tiny_model_dir, "run.steps=4", ALL), resume=run)
    assert resumed.step == 2 and not resumed.rewound
    resumed.train()
    rows = jsonl(run)
    now = saved_runs(run)
    assert now["wandb"]["id"] != killed["wandb"]["id"] and now["wandb"]["closed"]
    assert now["mlflow"]["run_id"] == killed["mlflow"]["run_id"] and now["mlflow"]["closed"]
    assert wandb_history(wandb_segments(wandb_dir), now["wandb"]["id"]) == rows
    assert mlflow_history(uri, now["mlflow"]["run_id"]) == in_mlflow(rows)
    assert tensorboard_scalars(run / "tensorboard") == rows


def test_names_and_packages_are_checked_before_the_run(
    tiny_model_dir, tmp_path, monkeypatch, capsys, offline
):
    with pytest.raises(
        ConfigError, match=r"^run\.report_to: unknown tracker 'wandbb'; valid choices: mlflow, "
    ):
        check_setup(tiny_config(tiny_model_dir, "run.report_to=[wandbb]"))
    with pytest.raises(ConfigError, match=r"^run\.report_to: lists 'wandb' twice$"):
        check_setup(tiny_config(tiny_model_dir, "run.report_to=[wandb,mlflow,wandb]"))
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(
        ConfigError, match=r"^run\.report_to: wandb is not installed: pip install 'ebpo\[wandb\]'$"
    ):
        check_setup(tiny_config(tiny_model_dir, "run.report_to=[tensorboard,wandb]"))
    # MLflow's database stores need what mlflow-skinny leaves out
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.setitem(sys.modules, "sqlalchemy", None)
    with pytest.raises(ConfigError, match=r"needs sqlalchemy and alembic.*pip install 'ebpo\[mlflow\]'"):
        check_trackers(["mlflow"])

    from ebpo.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["train", f"model.path={tiny_model_dir}", "run.report_to=[wandb]", "run.device=cpu"]) == 2
    err = capsys.readouterr().err
    assert err == "ebpo train: error: run.report_to: wandb is not installed: pip install 'ebpo[wandb]'\n"
    assert not (tmp_path / "runs").exists()  # stopped before a run directory was made
