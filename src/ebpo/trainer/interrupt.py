"""Stopping a training run at a step boundary on Ctrl-C (SIGINT) or a scheduler's SIGTERM.

A signal in the middle of a step would otherwise raise wherever the interpreter happens to be (inside the
model's forward, say): a traceback, and every step since the last periodic checkpoint lost. Inside
:func:`stop_at_step_boundary` the first SIGINT or SIGTERM only sets a flag and prints one notice; the loop
checks the flag between steps, writes a checkpoint there and raises :class:`Interrupted`, so a resume
continues exactly as after a planned stop. A second signal stops at once (:class:`StoppedAtOnce`): the
newest checkpoint is then the one a resume uses. While a checkpoint is being written
(:meth:`StopRequest.deferred`) a second signal waits until the write is done, so that it never cuts a save
short inside the serialiser (where torch turns the interrupt into an error of its own).

Signal handlers can only be installed from the main thread; elsewhere (a trainer run in a worker thread)
the context does nothing and signals keep their usual effect.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def signal_name(signum: int) -> str:
    """``Ctrl-C (SIGINT)`` or ``SIGTERM``: how the messages name a signal."""
    name = signal.Signals(signum).name
    return f"Ctrl-C ({name})" if signum == signal.SIGINT else name


class Interrupted(KeyboardInterrupt):
    """Training stopped on a signal at a step boundary, after writing ``checkpoint`` at ``step``.

    A ``KeyboardInterrupt``, so that code catching ``Exception`` lets it through; ``exit_code`` is the
    shell's convention for the signal (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, signum: int, step: int, checkpoint: Path) -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        super().__init__(
            f"stopped by {signal_name(signum)} after step {step}; checkpoint written to {checkpoint}"
        )

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StoppedAtOnce(KeyboardInterrupt):
    """A second signal: training stopped in the middle of a step, without a checkpoint of its own."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped at once by a second {signal_name(signum)}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StopRequest:
    """What :func:`stop_at_step_boundary` yields: ``signum`` is the first signal received (None until one
    is); :meth:`interrupted` builds the error the loop raises once it has written its checkpoint."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.pending: int | None = None  # a second signal that came inside deferred()
        self._held = 0

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def holding(self) -> bool:
        return self._held > 0

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """A block a second signal does not cut short (a checkpoint write): it raises :class:`StoppedAtOnce`
        when the block ends instead, unless the block raised."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
        if self.pending is not None and not self._held:
            raise StoppedAtOnce(self.pending)

    def interrupted(self, step: int, checkpoint: Path) -> Interrupted:
        assert self.signum is not None  # only called once requested
        return Interrupted(self.signum, step, checkpoint)


@contextmanager
def stop_at_step_boundary() -> Iterator[StopRequest]:
    """Within the block, the first SIGINT or SIGTERM sets the request (and logs one warning line); a
    second raises :class:`StoppedAtOnce` wherever the program is. The previous handlers come back at the
    end of the block."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        if request.signum is not None and request.holding:
            if request.pending is None:
                request.pending = signum
                logger.warning(
                    f"\n{signal_name(signum)}: stopping once the checkpoint being written is complete"
                )
            return
        if request.signum is not None:
            raise StoppedAtOnce(signum)
        request.signum = signum
        again = "Ctrl-C again" if signum == signal.SIGINT else "send it again"
        logger.warning(
            f"\n{signal_name(signum)}: stopping after this step, with a checkpoint ({again} to stop now)"
        )

    previous = {signum: signal.signal(signum, handle) for signum in SIGNALS}
    try:
        yield request
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
