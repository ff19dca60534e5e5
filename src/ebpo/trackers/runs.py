"""Several trackers' runs called together (:class:`TrackerRuns`): one tracker's error is one
:class:`TrackerError` line naming it and what it was doing."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ebpo.errors import first_line
from ebpo.persist import WriteError
from ebpo.trackers.base import Status, Tracker, TrackerError

logger = logging.getLogger(__name__)


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
        """Keep ``tracker`` and log where its run is (after ``note``, if any)."""
        self.trackers.append(tracker)
        line = " ".join(part for part in (note, tracker.describe()) if part)
        if line:
            logger.info(line)

    def send(self, tracker: Tracker, what: str, call: Callable[..., Any], *args: Any) -> None:
        """``call(*args)``, a method of ``tracker``, doing ``what`` (for the message)."""
        try:
            call(*args)
        except BaseException as err:
            self.failed = True
            if isinstance(err, (WriteError, TrackerError)) or not isinstance(err, Exception):
                raise
            raise TrackerError(f"{tracker.name}: cannot {what}: {first_line(err)}") from err

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
