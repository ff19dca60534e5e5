"""Metrics on disk and in experiment trackers: one JSON line per step in ``metrics.jsonl`` (an
:class:`ebpo.persist.Journal`), the same values in each tracker of ``run.report_to`` (:class:`Tracker`:
TensorBoard, Weights & Biases, MLflow); and the wall-time metrics, ``timing_s/...`` (:class:`StepClock`).

A kill can tear the line being written: readers leave it out with a warning, and on ``--resume`` the run
directory rewinds the journal to the checkpoint's step (:meth:`ebpo.persist.RunDirectory.start`), so the
resumed run appends to a history that ends where its checkpoint does. The trackers follow the journal, so
that each tracker's run holds every step of ``metrics.jsonl`` once, with its value:

- a resume continues each tracker's run: their ids are in the run directory's ``trackers.json``;
- a run stopped without a checkpoint at its last step (killed, crashed, or resumed from
  ``checkpoints/best``) had sent the steps the journal drops to its trackers too. TensorBoard hides them
  (``purge_step``). wandb and MLflow cannot delete logged steps, so each starts a new run instead, the
  journal's history up to the checkpoint is replayed into it, and the old run is left as it was (a line
  names both);
- a tracker's run started on a resume (a tracker added to ``run.report_to``, or a new run as above) gets the
  history replayed the same way;
- wandb's service writes a run's log, and uploads, in blocks, so a killed process may take its last steps with
  it: a wandb run that its process did not end (``trackers.json`` marks each run closed when it ends) is
  replaced the same way, even when the resume drops nothing.

The trackers' packages are imported when a run starts (wandb and MLflow are extras: ``pip install
'ebpo[wandb]'``); :func:`check_trackers` names the missing extra before anything runs. Each reads its own
environment variables as it always does (``WANDB_MODE``, ``WANDB_PROJECT``, ``WANDB_DIR``,
``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``, ...). A write the disk refuses (full, read-only, ...)
is one :class:`ebpo.persist.WriteError` naming the file or the TensorBoard folder; a tracker that cannot
start a run or log to it is one :class:`TrackerError` naming the tracker, the reason and the fix.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import threading
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from ebpo.errors import ConfigError
from ebpo.persist import RunDirectory, WriteError, write_text_atomic, writing
from ebpo.registry import Registry

EXCLUDED_FROM_REPRODUCIBILITY = ("timing_s/", "perf/")
"""Metric prefixes that measure wall time and so differ between otherwise identical runs."""

PROJECT = "ebpo"
"""The wandb project and MLflow experiment a run reports to unless ``WANDB_PROJECT`` /
``MLFLOW_EXPERIMENT_NAME`` name another."""

Status = Literal["finished", "failed", "killed"]
"""How a tracker's run ends: the run returned; an error stopped it; Ctrl-C or SIGTERM stopped it."""


def read_metrics(run_dir: str | Path) -> list[dict[str, float]]:
    """The rows of a run's ``metrics.jsonl`` (a torn last line is left out, with a warning)."""
    return RunDirectory(run_dir).metrics.read()


def finite_metrics(step: int, metrics: dict[str, float]) -> dict[str, float]:
    """``metrics`` with every NaN or inf value replaced by a ``nonfinite/<name>`` = 1 marker (warned)."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if math.isfinite(value):
            out[name] = value
        else:
            warnings.warn(
                f"step {step}: metric {name!r} is {value}; not stored (logged as nonfinite/{name})",
                RuntimeWarning,
                3,
            )
            out[f"nonfinite/{name}"] = 1.0
    return out


# ---------------------------------------------------------------------------------------------------
# the tracker interface


class TrackerError(RuntimeError):
    """A tracker could not start a run or log to it; the message names the tracker, the reason and the fix."""


@dataclass
class TrackerStart:
    """What a tracker starts, or continues, a run with."""

    directory: Path
    """The run's own folder (``ebpo train``: the run directory; ``ebpo diagnose``: ``--out-dir``);
    TensorBoard writes into ``<directory>/tensorboard``."""
    name: str
    """The run's name in the tracker (the run directory's name)."""
    config: dict[str, Any]
    """The options the run was started with (nested sections), the tracker's config or parameters."""
    saved: dict[str, Any] | None = None
    """What :meth:`Tracker.state` returned for the run to continue; None starts a new run."""
    resumed_at: int | None = None
    """The checkpoint's step when resuming (TensorBoard hides its events after it); None for a new run."""


class Tracker(ABC):
    """One experiment tracker's run: what ``metrics.jsonl`` holds, step by step, plus the run's options, its
    summary, its files and tables. Registered in :data:`TRACKERS` by the name ``run.report_to`` lists.

    :meth:`open` starts a run or continues the one :meth:`state` described (``continued`` says which); the
    values :meth:`log` gets are finite floats. Calls that fail raise; :class:`TrackerRuns` turns the error into
    one :class:`TrackerError` line naming the tracker."""

    name: ClassVar[str]
    module: ClassVar[str]
    """The package it imports."""
    extra: ClassVar[str | None] = None
    """ebpo's extra that installs :attr:`module` (None: a dependency of ebpo itself)."""
    rewinds: ClassVar[bool] = False
    """Whether a continued run can drop the steps logged after the checkpoint it resumes from."""
    buffered: ClassVar[bool] = False
    """Whether what it was sent can be lost when its process is killed (it writes, or uploads, in batches
    later): a run that its process did not close is then not continued."""
    continued: bool
    """Whether :meth:`open` continued the saved run (False: a new run, into which history is replayed)."""

    @classmethod
    def check(cls) -> None:
        """Raise ``ConfigError`` (one line, the fix included) where this tracker cannot run: its package is not
        installed."""
        if not _importable(cls.module):
            raise ConfigError(f"{cls.name} is not installed: pip install 'ebpo[{cls.extra}]'")

    @classmethod
    @abstractmethod
    def open(cls, start: TrackerStart) -> Tracker:
        """Start a run (``start.saved`` None) or continue the saved one, with the run's options."""

    @abstractmethod
    def state(self) -> dict[str, Any]:
        """What continues this run later (its id), JSON-serialisable; kept in ``trackers.json``."""

    @classmethod
    def saved_run(cls, state: dict[str, Any]) -> str:
        """The run a saved :meth:`state` names, in a line to the user."""
        return json.dumps(state, sort_keys=True)

    def describe(self) -> str | None:
        """One line saying where the run is, printed when it starts; None prints nothing."""
        return None

    @abstractmethod
    def log(self, step: int, metrics: dict[str, float]) -> None:
        """The metrics of one step."""

    def log_history(self, rows: Sequence[dict[str, float]]) -> None:
        """Earlier steps, replayed into a new run: rows of ``metrics.jsonl`` (``step`` and the metrics)."""
        for row in rows:
            self.log(int(row["step"]), {name: value for name, value in row.items() if name != "step"})

    @abstractmethod
    def log_summary(self, summary: dict[str, Any], files: Sequence[Path]) -> None:
        """The run's summary (``summary.json``) and its files: a PNG as an image where the tracker shows
        images, every file as an artifact where it keeps files."""

    @abstractmethod
    def log_table(self, name: str, rows: Sequence[dict[str, Any]]) -> None:
        """A table, one dict per row (the same keys in each)."""

    @abstractmethod
    def close(self, status: Status) -> None:
        """End this process's part of the run (a later resume may continue it)."""


TRACKERS: Registry[type[Tracker]] = Registry("tracker")
"""``run.report_to``'s names: ``tensorboard``, ``wandb``, ``mlflow``."""


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails, a module without a spec
        return False


def check_trackers(names: Sequence[str]) -> None:
    """``ConfigError`` naming the fix unless every name is a tracker (an unknown one lists the valid ones),
    named once, whose package is installed (:meth:`Tracker.check`: a missing one names its extra)."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ConfigError(f"lists {name!r} twice")
        seen.add(name)
        try:
            tracker = TRACKERS.get(name)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        tracker.check()


def _first_line(err: BaseException) -> str:
    text = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _unless_set(variable: str, value: str) -> str | None:
    """``value``, or None where the environment variable is set (the library then reads it itself)."""
    return None if os.environ.get(variable) else value


def _markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    columns = list(rows[0]) if rows else []
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def _code_block(text: str) -> str:
    """``text`` as a markdown code block (TensorBoard's text tab renders markdown)."""
    return "\n".join("    " + line for line in text.splitlines())


# ---------------------------------------------------------------------------------------------------
# TensorBoard


@TRACKERS.register("tensorboard")
class TensorBoardTracker(Tracker):
    """TensorBoard event files in ``<directory>/tensorboard``: every metric as a float64 scalar, the options,
    the summary and the figure (``tensorboard --logdir <run directory>``). A resume continues the folder and
    hides the events after the checkpoint's step (``purge_step``), so it rewinds in place."""

    name = "tensorboard"
    module = "tensorboard"
    rewinds = True

    def __init__(self, folder: Path, resumed_at: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only when a run starts

        _quiet_tensorboard_thread()
        self.folder = folder
        self.continued = any(folder.glob("events.out.tfevents.*"))
        self.step = resumed_at or 0
        # a session start in every process: TensorBoard takes each one after the first as a restart, and hides
        # the earlier events from its step on (the steps a resume redoes); a new run's, at 0, hides nothing
        with self._writing():
            self.writer = SummaryWriter(str(folder), purge_step=0 if resumed_at is None else resumed_at + 1)

    @classmethod
    def check(cls) -> None:
        """TensorBoard is a dependency of ebpo: nothing to check."""

    @classmethod
    def open(cls, start: TrackerStart) -> TensorBoardTracker:
        import yaml

        tracker = cls(start.directory / RunDirectory.TENSORBOARD, start.resumed_at)
        config = yaml.safe_dump(start.config, sort_keys=False)
        tracker._text("config", _code_block(config), tracker.step)
        return tracker

    def _writing(self) -> Any:
        """Turns a refused write of TensorBoard's into one ``WriteError`` naming its folder."""
        return writing(self.folder, kept="the events before are kept")

    def _text(self, tag: str, text: str, step: int) -> None:
        with self._writing():
            self.writer.add_text(tag, text, step)
            self.writer.flush()

    def state(self) -> dict[str, Any]:
        return {"folder": self.folder.name}

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.step = step
        with self._writing():
            for name, value in metrics.items():
                self.writer.add_scalar(name, value, step, new_style=True, double_precision=True)
            self.writer.flush()

    def log_summary(self, summary: dict[str, Any], files: Sequence[Path]) -> None:
        self._text("summary", _code_block(json.dumps(summary, indent=2, sort_keys=True)), self.step)
        for path in files:
            if path.suffix == ".png":
                import matplotlib.image

                image_HWC = matplotlib.image.imread(path)
                with self._writing():
                    self.writer.add_image(path.stem, image_HWC, self.step, dataformats="HWC")
                    self.writer.flush()

    def log_table(self, name: str, rows: Sequence[dict[str, Any]]) -> None:
        self._text(name, _markdown_table(rows), self.step)

    def close(self, status: Status) -> None:
        with self._writing():
            self.writer.close()


# ---------------------------------------------------------------------------------------------------
# Weights & Biases


@TRACKERS.register("wandb")
class WandbTracker(Tracker):
    """A Weights & Biases run (``wandb.init``), named after the run directory, in project ``WANDB_PROJECT``
    (default ``ebpo``): the metrics at their step, the options as its config, the summary in its summary,
    the figure as an image and other files saved with the run. wandb's own settings apply: ``WANDB_MODE=offline``
    logs to ``WANDB_DIR`` (default: ``wandb/`` in the run's own folder, not ``./wandb``) for ``wandb sync`` to
    upload later."""

    name = "wandb"
    module = "wandb"
    extra = "wandb"
    buffered = True  # its service process writes the run's log, and uploads, in blocks

    def __init__(self, run: Any, continued: bool) -> None:
        self.run, self.continued = run, continued

    @classmethod
    def open(cls, start: TrackerStart) -> WandbTracker:
        import wandb

        run_id = (start.saved or {}).get("id")
        try:
            run = wandb.init(
                project=_unless_set("WANDB_PROJECT", PROJECT),
                name=_unless_set("WANDB_NAME", start.name),
                id=run_id,
                dir=_unless_set(
                    "WANDB_DIR", str(start.directory)
                ),  # its files in the run's folder, not ./wandb
                resume="allow" if run_id else None,
                config=None if run_id else start.config,
                reinit="create_new",  # the trainer's own run, beside any run of the caller's
            )
            if run_id:  # a resume may change options (run.steps=200)
                run.config.update(start.config, allow_val_change=True)
        except Exception as err:
            raise TrackerError(
                f"wandb: cannot start a run: {_first_line(err)}; log in with `wandb login`, or set "
                "WANDB_MODE=offline to log locally (`wandb sync` uploads it later)"
            ) from err
        # offline, wandb cannot ask whether the run exists: the id continues it when `wandb sync` uploads
        return cls(run, continued=run_id is not None and (run.offline or run.resumed))

    def state(self) -> dict[str, Any]:
        return {"id": self.run.id, "project": self.run.project}

    @classmethod
    def saved_run(cls, state: dict[str, Any]) -> str:
        return str(state.get("id"))

    def describe(self) -> str:
        where = (
            f"offline in {Path(self.run.dir).parent}"
            if self.run.offline
            else (self.run.url or self.run.project)
        )
        return f"wandb: run {self.run.id} ({'continued' if self.continued else 'new'}), {where}"

    def log(self, step: int, metrics: dict[str, float]) -> None:
        # committed at once: the step is the tracker's only when it is sent
        self.run.log(metrics, step=step, commit=True)

    def log_summary(self, summary: dict[str, Any], files: Sequence[Path]) -> None:
        import wandb

        self.run.summary.update(summary)
        for path in files:
            if path.suffix == ".png":
                self.run.summary[path.stem] = wandb.Image(str(path))
            else:
                self.run.save(str(path), base_path=str(path.parent), policy="now")

    def log_table(self, name: str, rows: Sequence[dict[str, Any]]) -> None:
        import wandb

        columns: list[str | int] = list(rows[0]) if rows else []
        table = wandb.Table(columns=columns, data=[[row.get(str(c)) for c in columns] for row in rows])
        self.run.log({name: table}, commit=True)

    def close(self, status: Status) -> None:
        self.run.finish(exit_code=0 if status == "finished" else 1)


# ---------------------------------------------------------------------------------------------------
# MLflow


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
        if scheme in _DATABASE_SCHEMES and not (_importable("sqlalchemy") and _importable("alembic")):
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
            raise TrackerError(f"mlflow: cannot start a run in {uri}: {_first_line(err)}") from err
        return tracker

    def state(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "experiment_id": self.experiment_id, "tracking_uri": self.uri}

    @classmethod
    def saved_run(cls, state: dict[str, Any]) -> str:
        return str(state.get("run_id"))

    def describe(self) -> str:
        new = "continued" if self.continued else "new"
        ui = (
            ""
            if _importable("flask")
            else " (the UI needs `pip install mlflow`; ebpo[mlflow] has the client)"
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


# ---------------------------------------------------------------------------------------------------
# metrics.jsonl and the trackers together


class TrackerRuns:
    """The runs of several trackers, called together: an error of one (other than a refused write) is one
    :class:`TrackerError` naming it and what it was doing."""

    def __init__(self) -> None:
        self.trackers: list[Tracker] = []
        self.failed = False
        """Whether a call failed: :meth:`close` is then quiet, as the first error is on its way."""
        self.closed: list[Tracker] = []
        """The trackers whose runs :meth:`close` ended."""

    def add(self, tracker: Tracker, note: str | None = None) -> None:
        """Keep ``tracker`` and print where its run is (after ``note``, if any)."""
        self.trackers.append(tracker)
        line = " ".join(part for part in (note, tracker.describe()) if part)
        if line:
            print(line, flush=True)

    def send(self, tracker: Tracker, what: str, call: Callable[..., Any], *args: Any) -> None:
        """``call(*args)``, a method of ``tracker``, doing ``what`` (for the message)."""
        try:
            call(*args)
        except BaseException as err:
            self.failed = True
            if isinstance(err, (WriteError, TrackerError)) or not isinstance(err, Exception):
                raise
            raise TrackerError(f"{tracker.name}: cannot {what}: {_first_line(err)}") from err

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for tracker in self.trackers:
            self.send(tracker, f"log step {step}", tracker.log, step, metrics)

    def log_summary(self, summary: dict[str, Any], files: Sequence[Path]) -> None:
        for tracker in self.trackers:
            self.send(tracker, "log the run's summary", tracker.log_summary, summary, list(files))

    def log_table(self, name: str, rows: Sequence[dict[str, Any]]) -> None:
        for tracker in self.trackers:
            self.send(tracker, f"log the table {name}", tracker.log_table, name, rows)

    def close(self, status: Status = "finished") -> None:
        """End every run. After a failure (a failed call, or ``status`` other than finished: an error is on
        its way) their errors are left out, so that the first error is the one reported."""
        quiet = self.failed or status != "finished"
        first: BaseException | None = None
        for tracker in self.trackers:
            try:
                self.send(tracker, "end its run", tracker.close, status)
                self.closed.append(tracker)
            except Exception as err:
                first = first or err
        self.trackers = []
        if first is not None and not quiet:
            raise first


class MetricsLogger:
    """Appends one JSON line per step to ``metrics.jsonl`` and sends the same values to each tracker of
    ``report_to``, whose runs it starts or continues (module docstring).

    ``config``: the run's options (the trackers' config). ``resumed_at``: the checkpoint's step when resuming.
    ``rewound``: the resume dropped steps past it from the journal, which the trackers had been sent (a
    tracker that cannot drop them starts a new run, the history replayed).
    """

    def __init__(
        self,
        run_dir: Path,
        report_to: Sequence[str] = ("tensorboard",),
        *,
        config: dict[str, Any] | None = None,
        resumed_at: int | None = None,
        rewound: bool = False,
    ) -> None:
        run = RunDirectory(run_dir)
        self.journal = run.metrics
        self.runs = TrackerRuns()
        self.saved_path = run.path / RunDirectory.TRACKERS
        # the runs to continue: a resume's (a new run starts new tracker runs, whatever an earlier one left)
        saved = {}
        if resumed_at is not None and self.saved_path.is_file():
            saved = json.loads(self.saved_path.read_text())
        history: list[dict[str, float]] | None = None
        try:
            for name in report_to:
                kind = TRACKERS.get(name)
                state = saved.get(name)
                why = None
                if state is not None and rewound and not kind.rewinds:
                    why = f"holds steps after the checkpoint's step {resumed_at}, which {name} cannot delete"
                elif state is not None and kind.buffered and not state.get("closed"):
                    why = f"was not closed (its process was killed): it may lack the last steps {name} had not written"
                start = TrackerStart(
                    run.path, run.path.name, config or {}, None if why else state, resumed_at
                )
                tracker = kind.open(start)
                note = None
                if why is not None and state is not None:
                    note = (
                        f"{name}: run {kind.saved_run(state)} {why}; it is left as it is, and a new run gets the "
                        f"history up to step {resumed_at}:"
                    )
                self.runs.add(tracker, note)
                if not tracker.continued:
                    history = self.journal.read() if history is None else history
                    self.runs.send(tracker, "replay the run's history", tracker.log_history, history)
        except BaseException:
            self.runs.close("failed")
            raise
        # exactly the trackers of this run (one dropped now starts a new run when it comes back), each marked
        # closed when this process ends its run
        self.states = {tracker.name: {**tracker.state(), "closed": False} for tracker in self.runs.trackers}
        self._save()

    def _save(self) -> None:
        write_text_atomic(self.saved_path, json.dumps(self.states, indent=2, sort_keys=True))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Append one row and send it to every tracker. A non-finite value is never stored: it is left out,
        ``nonfinite/<name>`` = 1 is logged in its place, and a warning names the metric and the step."""
        metrics = finite_metrics(step, metrics)
        try:
            self.journal.append([{"step": step, **metrics}])
        except BaseException:
            self.runs.failed = True
            raise
        # after the journal: a kill between the two costs a tracker the step, never metrics.jsonl
        self.runs.log(step, metrics)

    def log_summary(self, summary: dict[str, Any], files: Sequence[Path] = ()) -> None:
        """The run's summary and its files (``training.png``), to every tracker."""
        self.runs.log_summary(summary, files)

    def close(self, status: Status = "finished") -> None:
        """End the trackers' runs (quietly after a failure: :meth:`TrackerRuns.close`), and mark them closed in
        ``trackers.json``."""
        quiet = self.runs.failed or status != "finished"
        try:
            self.runs.close(status)
        finally:
            if self.runs.closed:
                for tracker in self.runs.closed:
                    self.states[tracker.name]["closed"] = True
                try:
                    self._save()
                except WriteError:
                    if not quiet:
                        raise


def report(
    report_to: Sequence[str],
    directory: Path,
    *,
    name: str,
    config: dict[str, Any],
    tables: dict[str, Sequence[dict[str, Any]]],
    files: Sequence[Path],
) -> None:
    """A new run of each tracker of ``report_to`` holding the options, ``tables`` and ``files``, for a
    command that measures once (``ebpo diagnose``) rather than step by step."""
    runs = TrackerRuns()
    try:
        for tracker_name in report_to:
            runs.add(TRACKERS.get(tracker_name).open(TrackerStart(directory, name, config)))
        for table_name, rows in tables.items():
            runs.log_table(table_name, rows)
        runs.log_summary({}, files)
    except BaseException:
        runs.close("failed")
        raise
    runs.close("finished")


class StepClock:
    """Wall seconds of a step and of its phases: the step's ``timing_s/...`` and ``perf/tokens_per_s``."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.seconds[phase] = time.perf_counter() - start

    def metrics(self, tokens: int) -> dict[str, float]:
        """``timing_s/<phase>``, ``timing_s/step`` (so far) and the step's ``tokens`` per second."""
        step = time.perf_counter() - self.start
        timing = {f"timing_s/{phase}": seconds for phase, seconds in self.seconds.items()}
        return {**timing, "timing_s/step": step, "perf/tokens_per_s": tokens / max(step, 1e-9)}


def _quiet_tensorboard_thread() -> None:
    """TensorBoard writes its events from a thread of its own, which prints a traceback when a write fails
    and hands the error on to the next ``add_scalar`` or ``flush`` of the main thread: there it becomes
    one ``WriteError`` (:meth:`TensorBoardTracker.log`), so the thread's own traceback is left out. Other
    threads' errors are printed as before."""
    if getattr(threading.excepthook, "ebpo_quiet_tensorboard", False):
        return
    previous = threading.excepthook

    def excepthook(args: Any) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and isinstance(args.exc_value, OSError):
            return
        previous(args)

    excepthook.ebpo_quiet_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = excepthook
