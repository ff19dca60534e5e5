"""What a command shows of the library's messages, and the tracebacks behind its one-line errors.

The library logs through ``logging.getLogger(__name__)``, all under the ``ebpo`` logger, and prints nothing.
Without :func:`setup` (ebpo embedded in someone's program) Python's standard behaviour applies: the records
propagate to the root logger, warnings and errors reach ``logging.lastResort`` on stderr when no handler is
configured, information is hidden, and a user's own handlers and levels (``logging.getLogger("ebpo")``) decide.

A command (``ebpo``, ``python -m ebpo.integrations.verl`` and its task runners, ``python -m benchmarks.learning``)
calls :func:`setup` first: a record at INFO or above is shown as its message alone, INFO (and DEBUG) on
stdout, WARNING and above on stderr, and no longer propagates (a root handler, Hydra's for one, would show it
a second time). The streams are looked up when a record is shown, so that a redirected ``sys.stdout`` (pytest's
capture, ``contextlib.redirect_stdout``) gets it.

Debug (``ebpo --debug``, or ``EBPO_DEBUG=1`` in the environment): :func:`show_traceback`, which each command
calls where it turns an exception into one line, writes the exception's full traceback to stderr before that
line, and the console shows DEBUG records too.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback

__all__ = ["DEBUG_ENV", "debug_on", "set_debug", "setup", "show_traceback", "teardown"]

DEBUG_ENV = "EBPO_DEBUG"
"""Set to anything but empty or ``0``: debug on, as with ``--debug``."""

LOGGER = "ebpo"

_debug = False


class _Console(logging.Handler):
    """Writes each record's message, one line per record, to ``sys.<stream>`` as it is at that moment; errors
    of the stream (a closed pipe) propagate as they would from ``print``."""

    def __init__(self, stream: str, level: int, below: int | None = None) -> None:
        super().__init__(level)
        self.stream = stream
        self.below = below
        self.setFormatter(logging.Formatter("%(message)s"))

    def filter(self, record: logging.LogRecord) -> bool:
        return (self.below is None or record.levelno < self.below) and bool(super().filter(record))

    def emit(self, record: logging.LogRecord) -> None:
        stream = getattr(sys, self.stream)
        stream.write(self.format(record) + "\n")
        stream.flush()


def debug_on() -> bool:
    """Whether tracebacks are shown: :func:`set_debug` (``--debug``) or :data:`DEBUG_ENV` in the environment."""
    return _debug or os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")


def set_debug(on: bool) -> None:
    """Turn debug on or off for this process (the environment's :data:`DEBUG_ENV` still turns it on); with the
    console set up, its level follows (DEBUG records shown or not)."""
    global _debug
    _debug = on
    logger = logging.getLogger(LOGGER)
    if any(isinstance(handler, _Console) for handler in logger.handlers):
        logger.setLevel(logging.DEBUG if debug_on() else logging.INFO)


def setup(debug: bool = False) -> None:
    """Show the ``ebpo`` logger's records as a command's console does (the module docstring); ``debug``: also
    the tracebacks and DEBUG records. Idempotent: a second call adds no handler (and turns debug off only
    through :func:`set_debug`)."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(handler, _Console) for handler in logger.handlers):
        logger.addHandler(_Console("stdout", logging.DEBUG, below=logging.WARNING))
        logger.addHandler(_Console("stderr", logging.WARNING))
    logger.propagate = False
    set_debug(debug or _debug)


def teardown() -> None:
    """Undo :func:`setup` (and debug): the ``ebpo`` logger as Python leaves it, for tests."""
    global _debug
    _debug = False
    logger = logging.getLogger(LOGGER)
    for handler in [h for h in logger.handlers if isinstance(h, _Console)]:
        logger.removeHandler(handler)
    logger.propagate = True
    logger.setLevel(logging.NOTSET)


def show_traceback(err: BaseException) -> None:
    """With debug on, ``err``'s traceback on stderr, with every exception behind it, also one that ``raise ...
    from None`` hides from Python's own report (a plugin's error behind its one line); nothing otherwise."""
    if not debug_on():
        return
    chain: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    for index, exc in enumerate(reversed(chain)):
        if index:
            sys.stderr.write(
                "\nThe above exception was the direct cause of the following exception:\n\n"
                if exc.__cause__ is not None
                else "\nDuring handling of the above exception, another exception occurred:\n\n"
            )
        sys.stderr.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__, chain=False)))
    sys.stderr.flush()
