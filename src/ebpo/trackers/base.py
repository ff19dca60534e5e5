"""The tracker interface: :class:`Tracker` (one experiment tracker's run), the registry :data:`TRACKERS` of
``run.report_to``'s names, :func:`check_trackers` (a missing extra named before anything runs), and
:class:`TrackerError`."""

from __future__ import annotations

import importlib.util
import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from ebpo.errors import ConfigError
from ebpo.registry import Registry

PROJECT = "ebpo"
"""The wandb project and MLflow experiment a run reports to unless ``WANDB_PROJECT`` /
``MLFLOW_EXPERIMENT_NAME`` name another."""

Status = Literal["finished", "failed", "killed"]
"""How a tracker's run ends: the run returned; an error stopped it; Ctrl-C or SIGTERM stopped it."""


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
        if not importable(cls.module):
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


def importable(module: str) -> bool:
    """Whether ``module`` can be imported (found without importing it)."""
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
