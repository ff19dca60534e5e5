"""The experiment trackers offline, and what they hold read back through each library's own reader.

:func:`offline_trackers` points wandb at its offline mode and MLflow at a local file store, both under a test's
``tmp_path``, and clears the variables that would send a run anywhere else: no test contacts a server. The
readers: the accumulator behind TensorBoard's server (which hides the steps a restart redoes), wandb's
``wandb leet inspect --json`` (the records of a run's ``.wandb`` transaction log, as ``wandb sync`` uploads
them) and ``MlflowClient``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVER_VARIABLES = (
    "WANDB_API_KEY",
    "WANDB_BASE_URL",
    "WANDB_ENTITY",
    "WANDB_PROJECT",
    "WANDB_NAME",
    "WANDB_RUN_ID",
    "WANDB_RESUME",
    "MLFLOW_EXPERIMENT_ID",
    "MLFLOW_EXPERIMENT_NAME",
    "MLFLOW_RUN_ID",
)


def offline_trackers(monkeypatch, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A fixture's body (``yield from``): wandb offline into ``tmp_path/wandb`` and MLflow's file store in
    ``tmp_path/mlruns``; gives the wandb folder and the MLflow tracking URI. wandb reads its environment once
    per process (``wandb.setup``), so its setup is torn down before and after (where wandb is installed)."""
    teardown = (
        importlib.import_module("wandb").teardown if importlib.util.find_spec("wandb") else lambda: None
    )
    teardown()
    for name in SERVER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")  # leave pytest's capture of stdout alone
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store behind this switch
    yield tmp_path / "wandb", uri
    teardown()


# ---------------------------------------------------------------------------------------------------
# TensorBoard


def tensorboard_events(folder: Path) -> Any:
    """The events TensorBoard's server shows (its plugin accumulator: restarts hide later steps)."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    events.Reload()
    return events


def tensorboard_scalars(folder: Path) -> dict[int, dict[str, float]]:
    """step -> {metric: value} of every scalar TensorBoard shows in ``folder``; a (metric, step) seen twice
    fails."""
    from tensorboard.util import tensor_util

    events = tensorboard_events(folder)
    rows: dict[int, dict[str, float]] = defaultdict(dict)
    for tag in events.Tags()["tensors"]:
        if events.SummaryMetadata(tag).plugin_data.plugin_name != "scalars":
            continue
        for event in events.Tensors(tag):
            assert tag not in rows[event.step], (tag, event.step)
            rows[event.step][tag] = float(tensor_util.make_ndarray(event.tensor_proto))
    return dict(rows)


def tensorboard_plugins(folder: Path) -> dict[str, str]:
    """tag -> the TensorBoard plugin that shows it (``scalars``, ``text``, ``images``)."""
    events = tensorboard_events(folder)
    return {tag: events.SummaryMetadata(tag).plugin_data.plugin_name for tag in events.Tags()["tensors"]}


def tensorboard_texts(folder: Path) -> dict[str, list[str]]:
    """tag -> the texts logged under it (``config``, ``summary``, tables), in step order."""
    from tensorboard.util import tensor_util

    events = tensorboard_events(folder)
    texts = {}
    for tag in events.Tags()["tensors"]:
        if events.SummaryMetadata(tag).plugin_data.plugin_name == "text":
            texts[tag.split("/")[0]] = [
                tensor_util.make_ndarray(event.tensor_proto).item().decode() for event in events.Tensors(tag)
            ]
    return texts


# ---------------------------------------------------------------------------------------------------
# wandb


@dataclass
class WandbSegment:
    """What one process logged to a wandb run: one offline run folder, one ``.wandb`` file."""

    folder: Path
    run_id: str
    history: dict[int, dict[str, Any]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None


def wandb_segments(wandb_dir: Path) -> list[WandbSegment]:
    """Every offline run folder under ``wandb_dir``, oldest first, read with ``wandb leet inspect --json``;
    a step logged twice in one folder fails."""
    segments = []
    for folder in sorted(wandb_dir.glob("offline-run-*")):
        (log,) = folder.glob("run-*.wandb")
        out = subprocess.run(
            [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        segment = WandbSegment(folder, log.stem.removeprefix("run-"))
        for line in out.splitlines():
            record = json.loads(line)
            kind = record["type"]
            if kind == "run":
                segment.config.update(record["run"].get("config", {}).get("update", {}))
            elif kind == "config":
                segment.config.update(record["config"].get("update", {}))
            elif kind == "history":
                step = int(record["history"]["step"]["num"])
                assert step not in segment.history, (folder, step)
                item = record["history"]["item"]
                segment.history[step] = {k: v for k, v in item.items() if not k.startswith("_")}
            elif kind == "summary":
                segment.summary.update(record["summary"].get("update", {}))
            elif kind == "exit":
                segment.exit_code = record["exit"].get("exit_code", 0)
        segment.config.pop("_wandb", None)
        segments.append(segment)
    return segments


def wandb_history(segments: list[WandbSegment], run_id: str) -> dict[int, dict[str, Any]]:
    """step -> metrics of the run ``run_id`` over its segments, as ``wandb sync`` joins them; a step in two
    segments fails."""
    history: dict[int, dict[str, Any]] = {}
    for segment in segments:
        if segment.run_id == run_id:
            assert not set(segment.history) & set(history), sorted(set(segment.history) & set(history))
            history.update(segment.history)
    return history


# ---------------------------------------------------------------------------------------------------
# MLflow


def mlflow_history(uri: str, run_id: str) -> dict[int, dict[str, float]]:
    """step -> {metric: value} of an MLflow run, read with ``MlflowClient``; a (metric, step) logged twice
    fails."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    rows: dict[int, dict[str, float]] = defaultdict(dict)
    for key in client.get_run(run_id).data.metrics:
        for metric in client.get_metric_history(run_id, key):
            assert key not in rows[metric.step], (key, metric.step)
            rows[metric.step][key] = metric.value
    return dict(rows)


def mlflow_artifact(uri: str, run_id: str, path: str, into: Path) -> Path:
    from mlflow.tracking import MlflowClient

    return Path(MlflowClient(uri).download_artifacts(run_id, path, str(into)))


def saved_runs(run_dir: Path) -> dict[str, Any]:
    """The tracker runs a run directory's ``trackers.json`` records, by tracker name."""
    return json.loads((run_dir / "trackers.json").read_text())
