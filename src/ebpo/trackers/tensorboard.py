"""The ``tensorboard`` tracker: event files in ``<run directory>/tensorboard`` (TensorBoard is a dependency of
ebpo; no extra)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ebpo.persist import writing
from ebpo.run_directory import RunDirectory
from ebpo.tables import markdown_table
from ebpo.trackers.base import TRACKERS, Status, Tracker, TrackerStart
from ebpo.trackers.excepthook import quiet_tensorboard_thread


def _code_block(text: str) -> str:
    """``text`` as a markdown code block (TensorBoard's text tab renders markdown)."""
    return "\n".join("    " + line for line in text.splitlines())


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

        quiet_tensorboard_thread()
        self.folder = folder
        self.continued = any(folder.glob("events.out.tfevents.*"))
        self.step = resumed_at or 0
        _after_earlier_files(folder)
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
        columns = list(rows[0]) if rows else []
        table = markdown_table(columns, [[str(row.get(c, "")) for c in columns] for row in rows])
        self._text(name, table, self.step)

    def close(self, status: Status) -> None:
        with self._writing():
            self.writer.close()


def _after_earlier_files(folder: Path) -> None:
    """Wait, if need be, until the clock has passed the second of every events file in ``folder``.

    TensorBoard reads a folder's events files in the order of their names, ``events.out.tfevents.<second>.<host>.
    <pid>.<n>``: a writer opened in the same second and process as an earlier one (a resume in the process that
    was interrupted) can sort before it (``.10`` before ``.9``), and TensorBoard then reads the earlier steps as
    a restart and drops them."""
    import time

    seconds = []
    for path in folder.glob("events.out.tfevents.*"):
        part = path.name.split(".")[3:4]
        if part and part[0].isdigit():
            seconds.append(int(part[0]))
    if seconds:
        while int(time.time()) <= max(seconds):
            time.sleep(0.05)
