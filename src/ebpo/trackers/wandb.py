"""The ``wandb`` tracker: a Weights & Biases run (the ``ebpo[wandb]`` extra)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ebpo.errors import first_line
from ebpo.trackers.base import PROJECT, TRACKERS, Status, Tracker, TrackerError, TrackerStart


def _unless_set(variable: str, value: str) -> str | None:
    """``value``, or None where the environment variable is set (the library then reads it itself)."""
    return None if os.environ.get(variable) else value


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
                resume="allow" if run_id else None,
                config=None if run_id else start.config,
                dir=_unless_set(
                    "WANDB_DIR", str(start.directory)
                ),  # its files in the run's folder, not ./wandb
                reinit="create_new",  # the trainer's own run, beside any run of the caller's
            )
            if run_id:  # a resume may change options (run.steps=200)
                run.config.update(start.config, allow_val_change=True)
        except Exception as err:
            raise TrackerError(
                f"wandb: cannot start a run: {first_line(err)}; log in with `wandb login`, or set "
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
