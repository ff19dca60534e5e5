"""The ``mlflow`` tracker: an MLflow run through ``MlflowClient`` (the ``ebpo[mlflow]`` extra)."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ebpo.errors import ConfigError, first_line
from ebpo.trackers.base import PROJECT, TRACKERS, Status, Tracker, TrackerError, TrackerStart, importable


def mlflow_metric_name(name: str) -> str:
    """A metric's name in MLflow, which takes letters, digits, ``_ - . : /`` and spaces: ``@`` is written
    ``_at_`` (as verl writes it: ``eval/pass_at_1``), a ``/`` after the first one ``.``
    (``eval/pass_at_1.word``: MLflow's file store keeps a metric as a file in folders named by its parts, so
    ``eval/pass@1`` and ``eval/pass@1/word`` could not both be stored), any other character ``_``."""
    section, slash, rest = name.replace("@", "_at_").partition("/")
    return re.sub(r"[^\w\-.:/ ]", "_", section + slash + rest.replace("/", "."))


def _flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested options as MLflow parameters: dotted keys (``algorithm.ebpo.prior_scope``), values as text (a
    string as it is, anything else as JSON)."""
    params: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            params.update(_flat_params(value, f"{prefix}{key}."))
        else:
            params[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(value)
    return params


_DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
"""MLflow tracking stores that need SQLAlchemy and Alembic (which the mlflow-skinny package leaves out)."""

_MLFLOW_METRICS_PER_CALL = 1000
_MLFLOW_PARAMS_PER_CALL = 100
"""The most metrics and parameters one ``log_batch`` takes (a tracking server's limits)."""


@TRACKERS.register("mlflow")
class MLflowTracker(Tracker):
    """An MLflow run (``MlflowClient``; no global active run), named after the run directory, in experiment
    ``MLFLOW_EXPERIMENT_NAME`` (default ``ebpo``) of the tracking store ``MLFLOW_TRACKING_URI`` (MLflow's
    default: ``sqlite:///mlflow.db`` in the working directory). The metrics at their step under
    :func:`mlflow_metric_name`, the options as parameters (dotted keys; MLflow refuses to change one, so a
    resume keeps their first values, and ``config.yaml`` among the artifacts holds the latest), the summary
    and the run's files as artifacts."""

    name = "mlflow"
    module = "mlflow"
    extra = "mlflow"

    def __init__(self, client: Any, run: Any, uri: str, continued: bool) -> None:
        self.client, self.uri, self.continued = client, uri, continued
        self.run_id: str = run.info.run_id
        self.experiment_id: str = run.info.experiment_id

    @classmethod
    def check(cls) -> None:
        """The package, and SQLAlchemy and Alembic where the tracking store is a database."""
        super().check()
        import mlflow

        uri = mlflow.get_tracking_uri()
        scheme = uri.split(":", 1)[0].split("+", 1)[0]
        if scheme in _DATABASE_SCHEMES and not (importable("sqlalchemy") and importable("alembic")):
            raise ConfigError(
                f"mlflow's tracking store {uri} needs sqlalchemy and alembic, which mlflow-skinny leaves out: "
                "pip install 'ebpo[mlflow]', or set MLFLOW_TRACKING_URI to a tracking server"
            )

    @classmethod
    def open(cls, start: TrackerStart) -> MLflowTracker:
        import yaml
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        uri, artifacts = mlflow_store(start.directory)
        saved = start.saved or {}
        try:
            client = MlflowClient(uri)
            run = None
            if saved.get("run_id") and saved.get("tracking_uri") == uri:
                try:
                    run = client.get_run(saved["run_id"])
                except MlflowException:  # deleted meanwhile: a new run
                    run = None
            if run is not None:
                client.update_run(run.info.run_id, status="RUNNING")
            else:
                run = client.create_run(_experiment_id(client, artifacts), run_name=start.name)
            params = {k: v for k, v in _flat_params(start.config).items() if k not in run.data.params}
            tracker = cls(client, run, uri, continued=run.info.run_id == saved.get("run_id"))
            _log_batches(client, run.info.run_id, params=_params(params))
            client.log_text(run.info.run_id, yaml.safe_dump(start.config, sort_keys=False), "config.yaml")
        except MlflowException as err:
            raise TrackerError(f"mlflow: cannot start a run in {uri}: {first_line(err)}") from err
        return tracker

    def state(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "experiment_id": self.experiment_id, "tracking_uri": self.uri}

    @classmethod
    def saved_run(cls, state: dict[str, Any]) -> str:
        return str(state.get("run_id"))

    def describe(self) -> str:
        new = "continued" if self.continued else "new"
        ui = (
            "" if importable("flask") else " (the UI needs `pip install mlflow`; ebpo[mlflow] has the client)"
        )
        return (
            f"mlflow: run {self.run_id} ({new}), experiment {self.experiment_id} in {self.uri}; watch it with "
            f"`mlflow ui --backend-store-uri {self.uri}`{ui}"
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.log_history([{"step": step, **metrics}])

    def log_history(self, rows: Sequence[dict[str, float]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(mlflow_metric_name(name), value, now, int(row["step"]))
            for row in rows
            for name, value in row.items()
            if name != "step"
        ]
        _log_batches(self.client, self.run_id, metrics=metrics)

    def log_summary(self, summary: dict[str, Any], files: Sequence[Path]) -> None:
        self.client.log_dict(self.run_id, summary, "summary.json")
        for path in files:
            self.client.log_artifact(self.run_id, str(path))

    def log_table(self, name: str, rows: Sequence[dict[str, Any]]) -> None:
        columns = list(rows[0]) if rows else []
        table = {"columns": columns, "data": [[row.get(c) for c in columns] for row in rows]}
        self.client.log_dict(self.run_id, table, f"{name}.json")

    def close(self, status: Status) -> None:
        self.client.set_terminated(self.run_id, status=status.upper())


def mlflow_store(directory: Path) -> tuple[str, str | None]:
    """The tracking store a run logs to and, for a store of ours, where its artifacts go: the store
    ``MLFLOW_TRACKING_URI`` names (a server, or a database shared by runs) with MLflow's own artifact place;
    without it a SQLite database in the run's own folder, ``<directory>/mlflow.db``, its artifacts in
    ``<directory>/mlruns`` (MLflow's defaults, ``./mlflow.db`` and ``./mlruns``, would land in the working
    directory)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"], None
    folder = Path(directory).resolve()
    return f"sqlite:///{folder / 'mlflow.db'}", (folder / "mlruns").as_uri()


def _experiment_id(client: Any, artifacts: str | None = None) -> str:
    """``MLFLOW_EXPERIMENT_ID``, else the experiment named ``MLFLOW_EXPERIMENT_NAME`` (default ``ebpo``),
    created if missing (its artifacts in ``artifacts``, or MLflow's default place when None)."""
    from mlflow.exceptions import MlflowException

    if os.environ.get("MLFLOW_EXPERIMENT_ID"):
        return os.environ["MLFLOW_EXPERIMENT_ID"]
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or PROJECT
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifacts)
    except MlflowException:  # another process created it meanwhile
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def _params(params: dict[str, str]) -> list[Any]:
    from mlflow.entities import Param

    return [Param(key, value) for key, value in params.items()]


def _log_batches(
    client: Any, run_id: str, *, metrics: Sequence[Any] = (), params: Sequence[Any] = ()
) -> None:
    """``client.log_batch`` in calls a tracking server takes, each written through (not queued, whatever
    ``MLFLOW_ENABLE_ASYNC_LOGGING`` says): a step logged is in the store."""
    for items, size, key in (
        (metrics, _MLFLOW_METRICS_PER_CALL, "metrics"),
        (params, _MLFLOW_PARAMS_PER_CALL, "params"),
    ):
        for start in range(0, len(items), size):
            client.log_batch(run_id, **{key: list(items[start : start + size])}, synchronous=True)
