"""The ``mlflow`` tracker (``ebpo.trackers.mlflow``): metric names MLflow takes, a tracking server's limits per
call, and its default store in the run's own folder. MLflow runs on a local store in ``tmp_path``."""

from __future__ import annotations

import pytest

from ebpo.trackers import MetricsLogger, check_trackers, mlflow_metric_name
from helpers.trackers import (
    mlflow_history,
    offline_trackers,
    saved_runs,
)

pytest.importorskip("mlflow", reason="the mlflow extra is not installed (pip install 'ebpo[mlflow]')")


@pytest.fixture
def offline(monkeypatch, tmp_path):
    yield from offline_trackers(monkeypatch, tmp_path)


def test_mlflow_metric_names():
    # MLflow refuses "@" (and anything but letters, digits, _ - . : / and spaces); verl writes "@" as "_at_".
    # Its file store makes folders of the parts between slashes: eval/pass@1 and eval/pass@1/word would need
    # eval/pass_at_1 as a file and a folder, so slashes after the first become dots.
    assert mlflow_metric_name("reward/mean") == "reward/mean"
    assert mlflow_metric_name("eval/maj@8") == "eval/maj_at_8"
    assert mlflow_metric_name("eval/pass@1/word problems") == "eval/pass_at_1.word problems"
    assert mlflow_metric_name("nonfinite/actor/pg_loss") == "nonfinite/actor.pg_loss"
    assert mlflow_metric_name("eval/pass@1/x+y=?") == "eval/pass_at_1.x_y__"


def test_mlflow_calls_keep_a_tracking_servers_limits():
    # a tracking server takes at most 1000 metrics and 100 parameters a call: 2500 -> 1000 + 1000 + 500,
    # 250 -> 100 + 100 + 50, each written through
    from ebpo.trackers.mlflow import _log_batches

    calls = []

    class Client:
        def log_batch(self, run_id, metrics=(), params=(), synchronous=None):
            calls.append((run_id, len(metrics), len(params), synchronous))

    _log_batches(Client(), "r", metrics=list(range(2500)), params=list(range(250)))
    assert calls == [("r", n, 0, True) for n in (1000, 1000, 500)] + [
        ("r", 0, n, True) for n in (100, 100, 50)
    ]


def test_mlflows_default_store_takes_a_run(tmp_path, monkeypatch, offline):
    # what `pip install 'ebpo[mlflow]'` adds to mlflow-skinny: a SQLite store, ours without MLFLOW_TRACKING_URI
    # in the run's own folder, its artifacts beside it: nothing lands in the working directory (the other tests
    # use the file store, which needs nothing more)
    for module in ("sqlalchemy", "alembic"):
        pytest.importorskip(module, reason=f"needs the mlflow extra's {module} (pip install 'ebpo[mlflow]')")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    check_trackers(["mlflow"])
    logger = MetricsLogger(tmp_path / "run", ["mlflow"], config={"run": {"steps": 2}})
    logger.log(0, {"eval/pass@1": 0.25})
    logger.log(1, {"reward/mean": 0.5, "eval/pass@1": 0.375})
    logger.close()
    saved = saved_runs(tmp_path / "run")["mlflow"]
    assert saved["tracking_uri"] == f"sqlite:///{tmp_path}/run/mlflow.db"
    assert list((tmp_path / "cwd").iterdir()) == []
    assert (tmp_path / "run" / "mlflow.db").is_file()
    expected = {0: {"eval/pass_at_1": 0.25}, 1: {"reward/mean": 0.5, "eval/pass_at_1": 0.375}}
    assert mlflow_history(saved["tracking_uri"], saved["run_id"]) == expected
