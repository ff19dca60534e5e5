"""The one process-wide hook ebpo installs: a ``threading.excepthook`` that leaves out the traceback TensorBoard's
writer thread prints when a write fails (the main thread reports that failure as one ``WriteError``)."""

from __future__ import annotations

import threading
from typing import Any


def quiet_tensorboard_thread() -> None:
    """TensorBoard writes its events from a thread of its own, which prints a traceback when a write fails
    and hands the error on to the next ``add_scalar`` or ``flush`` of the main thread: there it becomes
    one ``WriteError`` (:meth:`ebpo.trackers.tensorboard.TensorBoardTracker.log`), so the thread's own traceback is left out. Other
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
