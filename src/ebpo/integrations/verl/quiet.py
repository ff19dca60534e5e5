"""The quiet log of ``python -m ebpo.integrations.verl``: framework messages that repeat, once.

verl's agent loop builds a Continuous Token builder for every request it sends and, for a model family it has
no builder for (Llama, the tiny test models), warns each time: 256 identical lines per step of the CPU
quickstart; TransferQueue warns at every client call that its default thread count exceeds the cores of a
small machine. verl's engine registry warns in every process that the engines whose packages are not installed
(megatron, veomni, torchtitan, ...) are unavailable. Under our launcher each distinct message of the first
kind is shown once per process and the second kind is not shown; ``VERBOSE=1`` in the environment shows
everything. Under verl's own launcher nothing is filtered.

The launcher sets :data:`QUIET_ENV` for every Ray process; :mod:`.registration` (imported in every verl
process) calls :func:`install` where it is set.
"""

from __future__ import annotations

import logging
import os
import warnings

__all__ = ["QUIET_ENV", "VERBOSE_ENV", "install", "quiet_requested", "verbose_requested"]

QUIET_ENV = "EBPO_VERL_QUIET"
VERBOSE_ENV = "VERBOSE"

#: loggers whose repeated messages are shown once per process
ONCE_LOGGERS = ("verl.utils.tokenizer.continuous_token_wiring", "transfer_queue.utils.common")
#: Python warnings not shown (UserWarning message patterns)
HIDDEN_WARNINGS = (r"\w+ engine is not available",)


def verbose_requested() -> bool:
    """``VERBOSE=1`` (or ``true``/``yes``) in the environment: show every framework message."""
    return os.environ.get(VERBOSE_ENV, "").strip().lower() in ("1", "true", "yes")


def quiet_requested() -> bool:
    """Whether this process belongs to a quiet run of our launcher."""
    return os.environ.get(QUIET_ENV) == "1" and not verbose_requested()


class _Once(logging.Filter):
    """Passes each distinct message (its format string and arguments) once."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = f"{record.msg}|{record.args!r}"
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def install() -> None:
    """Show each repeated message of :data:`ONCE_LOGGERS` once and hide :data:`HIDDEN_WARNINGS` in this
    process (idempotent)."""
    for name in ONCE_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Once) for f in logger.filters):
            logger.addFilter(_Once())
    for pattern in HIDDEN_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=UserWarning)
