"""``ebpo diagnose``'s results in the experiment trackers of ``--report-to``: one new run each, holding the options,
the tables and the files."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ebpo.trackers import TRACKERS, TrackerRuns, TrackerStart


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
