"""The ``ebpo`` command line.

Each subcommand lives in its own module, which exposes ``add_parser(subparsers)``: it adds one
``argparse`` sub-parser, documents every flag (``--help``), and sets ``func`` to the function that runs
it. Modules keep heavy imports (transformers, datasets) inside their run functions so that ``ebpo --help``
stays fast.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import select
import signal
import sys
import threading
from types import FrameType
from typing import NoReturn

DEBUG_HELP = (
    "show the traceback behind a one-line error (on stderr, before the line; also EBPO_DEBUG=1); also after "
    "the command: ebpo train --debug ..."
)

# subcommand -> module that defines add_parser(subparsers)
SUBCOMMANDS: dict[str, str] = {
    "simulate": "ebpo.simulate.cli",
    "diagnose": "ebpo.diagnostics.cli",
    "base-model": "ebpo.models.cli",
    "train": "ebpo.trainer.cli",
    "eval": "ebpo.eval.cli",
    "annotate": "ebpo.annotate.cli",
}


def build_parser() -> argparse.ArgumentParser:
    from ebpo import __version__

    parser = argparse.ArgumentParser(
        prog="ebpo",
        description="Empirical Bayes Policy Optimization (EBPO) for RL with verifiable rewards.",
    )
    parser.add_argument("--version", action="version", version=f"ebpo {__version__}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMANDS.values():
        importlib.import_module(module_name).add_parser(subparsers)
    return parser


RESEND_S = 0.05
RESEND_AT_MOST = 200
"""A Ctrl-C during an import is sent again every ``RESEND_S`` seconds, ``RESEND_AT_MOST`` times at most (10 s)."""


def _importing(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs inside an import (a module's top-level code, or what it calls)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


class InterruptOutsideImports:
    """SIGINT's handler while ``ebpo`` runs: Python's own ``KeyboardInterrupt``, except during an import.

    torch's C++ calls back into Python while it is imported; a ``KeyboardInterrupt`` raised in such a callback
    cannot unwind through the C++ frames and aborts the process (``terminate called after throwing an
    instance of 'pybind11::error_already_set'``, SIGABRT). So a Ctrl-C that lands inside an import is sent to
    the process again a moment later, until it arrives outside one and raises there."""

    def __init__(self) -> None:
        self.resent = 0
        self._timer: threading.Timer | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.resent < RESEND_AT_MOST and _importing(frame):
            self.resent += 1
            self._timer = threading.Timer(RESEND_S, os.kill, (os.getpid(), signum))
            self._timer.daemon = True
            self._timer.start()
            return
        self.resent = 0
        raise KeyboardInterrupt

    def cancel(self) -> None:
        """Drop a Ctrl-C not yet sent again: once ``main`` has returned, nothing is left for it to stop."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def main(argv: list[str] | None = None) -> int:
    """Run ``ebpo`` with ``argv`` (default: the process's arguments) and return its exit code.

    Ctrl-C at any moment, while a command imports torch as much as during its work, ends the process with
    one line and exit code 130; a command that keeps something on Ctrl-C (``ebpo train``'s checkpoint)
    catches it first and says what it kept. The library's messages show as :func:`ebpo.console.setup` shows
    them; ``--debug`` (or ``EBPO_DEBUG=1``) adds the traceback behind each one-line error."""
    from ebpo import console

    words = sys.argv[1:] if argv is None else argv
    console.setup()
    # Python's own Ctrl-C handler only (not an ignored SIGINT, nor a handler of the program calling main)
    interrupts = threading.current_thread() is threading.main_thread()
    interrupts = interrupts and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    handler = InterruptOutsideImports()
    if interrupts:
        signal.signal(signal.SIGINT, handler)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        # ebpo --debug COMMAND; after the command's name, ebpo.settings' add_command turns it on
        console.set_debug(getattr(args, "debug", False))
        if getattr(args, "func", None) is None:
            parser.print_help()
            return 0 if args.command is None else 2
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        command = f"ebpo {words[0]}" if words and words[0] in SUBCOMMANDS else "ebpo"
        print(f"{command}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    except BrokenPipeError:
        if not _stdout_closed():
            raise
        # Python flushes stdout again at exit: point it at /dev/null, so that the flush cannot fail too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print("ebpo: standard output was closed (its reader exited); stopped", file=sys.stderr)
        return 141  # the status of a process that SIGPIPE ended (`ebpo train --help-config | head`)
    finally:
        if interrupts:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            handler.cancel()


def run(argv: list[str] | None = None) -> NoReturn:
    """The ``ebpo`` console script: :func:`main`, then the process's exit with its code.

    A Ctrl-C that arrives once ``main`` has returned (a second press while the command stops) would raise
    inside Python's exit handlers (torch's, a tracker's) and print their traceback. From then on it ends the
    process at once instead, with the command's exit code, its output flushed."""
    code = main(argv)
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ):
        signal.signal(signal.SIGINT, functools.partial(_exit_at_once, code))
    sys.exit(code)


def _exit_at_once(code: int, signum: int, frame: FrameType | None) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or file: nothing more can reach it
            pass
    os._exit(code)


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has exited (its write end polls as an error)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll on this platform, or stdout is not a file
        return False


if __name__ == "__main__":
    run()
