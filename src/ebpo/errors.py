"""The error every part of ebpo raises for a setting it cannot use, and the one-line form of any error."""

from __future__ import annotations

__all__ = ["ConfigError", "first_line"]


class ConfigError(ValueError):
    """A configuration value, key or combination that cannot be used (a config key, a flag, a run directory
    that already holds a run); the message names it and says the fix, in one line."""


def first_line(err: BaseException) -> str:
    """``Type: first line of the message`` (the type alone for an empty message): how a library's error that
    ebpo reports in one line of its own is named in that line."""
    text = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
