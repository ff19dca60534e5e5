"""The error every part of ebpo raises for a setting it cannot use."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A configuration value, key or combination that cannot be used (a config key, a flag, a run directory
    that already holds a run); the message names it and says the fix, in one line."""
