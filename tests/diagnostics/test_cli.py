"""``ebpo diagnose`` (``ebpo.diagnostics.cli``), end to end on the shipped model: the table, the CSV files, the
figure and the trackers."""

from __future__ import annotations

import csv
import importlib.util
import json

import pytest

from helpers.trackers import mlflow_artifact, offline_trackers, tensorboard_texts, wandb_segments

TRACKERS_HERE = ["tensorboard"] + [name for name in ("wandb", "mlflow") if importlib.util.find_spec(name)]
"""The trackers the command test reports to: TensorBoard, and wandb and MLflow where their extras are in."""


@pytest.fixture
def offline(monkeypatch, tmp_path):
    yield from offline_trackers(monkeypatch, tmp_path)


def test_command_on_the_shipped_model_writes_the_table_csv_and_figure(
    tmp_path, capsys, offline, plugin_pkg_dir, plugin_sandbox, monkeypatch
):
    from ebpo.cli import main
    from helpers.plugins import FILE_ESTIMATOR, MY_ESTIMATORS, PKG_ESTIMATOR

    # beside GRPO and EBPO, a lone file's estimator (--plugins) and an installed package's (its entry point)
    monkeypatch.syspath_prepend(str(plugin_pkg_dir))
    out = tmp_path / "diag"
    code = main(
        ["diagnose", "-M", "4", "-R", "2", "-W", "1", "-G", "2", "4", "--reference-samples", "4", "--quiet",
         "--plugins", str(MY_ESTIMATORS), "--estimators", "grpo", "ebpo", f"{FILE_ESTIMATOR}:q=0.25",
         PKG_ESTIMATOR, "--projection-dim", "256", "--out-dir", str(out), "--report-to", *TRACKERS_HERE]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert (
        "| ebpo | ebpo: vanilla, token-mean | 4 |" in printed
        and "| grpo | grpo: vanilla, seq-mean-token-mean | 2 |" in printed
        and f"| {FILE_ESTIMATOR}:q=0.25 | grpo: vanilla, seq-mean-token-mean | 4 |" in printed
        and f"| {PKG_ESTIMATOR} | grpo: vanilla, seq-mean-token-mean | 2 |" in printed
    )
    for name in ("diagnose.md", "diagnose.csv", "batches.csv", "diagnose.png"):
        assert (out / name).stat().st_size > 0
    rows = (out / "diagnose.csv").read_text().splitlines()
    assert len(rows) == 1 + 4 * 2  # header, 4 estimators x 2 group sizes
    assert len((out / "batches.csv").read_text().splitlines()) == 1 + 4 * 2 * 2
    assert "nan" not in (out / "batches.csv").read_text()
    # the trackers hold the table: the same estimators, group sizes and cosines as diagnose.csv
    table = [dict(row) for row in csv.DictReader((out / "diagnose.csv").open())]
    expected = [(row["estimator"], int(row["G"]), float(row["cosine"])) for row in table]
    text = tensorboard_texts(out / "tensorboard")["diagnose"][0]
    cells = [line.split(" | ") for line in text.splitlines()[2:]]
    header = text.splitlines()[0].strip("| ").split(" | ")
    column = {name: header.index(name) for name in ("estimator", "G", "cosine")}
    assert [
        (c[column["estimator"]].strip("| "), int(c[column["G"]]), float(c[column["cosine"]])) for c in cells
    ] == expected
    wandb_dir, uri = offline
    estimators = ["grpo", "ebpo", f"{FILE_ESTIMATOR}:q=0.25", PKG_ESTIMATOR]
    if "wandb" in TRACKERS_HERE:
        (segment,) = wandb_segments(wandb_dir)
        (logged,) = segment.history.values()  # wandb keeps a table as a file, its path in the history
        data = json.loads((segment.folder / "files" / logged["diagnose.path"]).read_text())
        got = [dict(zip(data["columns"], row)) for row in data["data"]]
        assert [(r["estimator"], r["G"], r["cosine"]) for r in got] == expected
        assert segment.config["estimators"] == estimators
    if "mlflow" in TRACKERS_HERE:
        from mlflow.tracking import MlflowClient

        (run,) = MlflowClient(uri).search_runs(
            [MlflowClient(uri).get_experiment_by_name("ebpo").experiment_id]
        )
        data = json.loads(mlflow_artifact(uri, run.info.run_id, "diagnose.json", tmp_path / "a").read_text())
        got = [dict(zip(data["columns"], row)) for row in data["data"]]
        assert [(r["estimator"], r["G"], r["cosine"]) for r in got] == expected
        assert run.data.params["estimators"] == json.dumps(estimators)
        artifacts = {a.path for a in MlflowClient(uri).list_artifacts(run.info.run_id)}
        assert artifacts >= {"diagnose.md", "diagnose.csv", "batches.csv", "diagnose.png", "diagnose.json"}
    assert main(["diagnose", "--estimators", "grpo", "nope", "--quiet"]) == 2
    assert "unknown advantage estimator 'nope'" in capsys.readouterr().err
