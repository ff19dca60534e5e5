"""A run's metrics: one JSON line per step in ``metrics.jsonl`` (an :class:`ebpo.persist.Journal`), the same
values in each tracker of ``run.report_to`` (:class:`ebpo.trackers.base.Tracker`: TensorBoard, Weights & Biases,
MLflow), and which tracker runs a resume continues (``trackers.json``) or replaces with the history replayed.

A kill can tear the line being written: readers leave it out with a warning, and on ``--resume`` the run
directory rewinds the journal to the checkpoint's step (:meth:`ebpo.run_directory.RunDirectory.start`), so the
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
'ebpo[wandb]'``); :func:`ebpo.trackers.base.check_trackers` names the missing extra before anything runs. Each reads its own
environment variables as it always does (``WANDB_MODE``, ``WANDB_PROJECT``, ``WANDB_DIR``,
``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``, ...). A write the disk refuses (full, read-only, ...)
is one :class:`ebpo.persist.WriteError` naming the file or the TensorBoard folder; a tracker that cannot
start a run or log to it is one :class:`ebpo.trackers.base.TrackerError` naming the tracker, the reason and the fix.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ebpo.persist import WriteError, write_text_atomic
from ebpo.run_directory import RunDirectory
from ebpo.trackers.base import TRACKERS, Status, TrackerStart
from ebpo.trackers.runs import TrackerRuns

EXCLUDED_FROM_REPRODUCIBILITY = ("timing_s/", "perf/")
"""Metric prefixes that measure wall time and so differ between otherwise identical runs."""


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
