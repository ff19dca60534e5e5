"""How ``ebpo train``'s two ways of giving an estimator its options combine: ``algorithm.ebpo`` (EBPO's own section,
``ebpo.advantages.EBPOOptions``) and ``algorithm.estimator_options`` (any other estimator's keyword options, and
EBPO's in their earlier spelling, as Python code may still pass them).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ebpo.advantages import EBPOOptions, OptionError
from ebpo.errors import ConfigError


def combine_options(
    estimator: str, ebpo: EBPOOptions, estimator_options: dict[str, Any]
) -> tuple[EBPOOptions, dict[str, Any]]:
    """``(algorithm.ebpo, algorithm.estimator_options)`` as ``algorithm.estimator`` reads them: for ``ebpo``,
    ``estimator_options`` read as ``algorithm.ebpo.<option>`` (then empty); for any other estimator, EBPO's
    section must stay at its defaults. A bad option is one :class:`ConfigError` naming the key and the fix."""
    if estimator == "ebpo" and estimator_options:  # the earlier spelling, from Python
        try:
            ebpo = dataclasses.replace(ebpo, **estimator_options)
        except OptionError as err:
            raise ConfigError(f"algorithm.estimator_options.{err.option}: {err}") from None
        except TypeError:
            valid = ", ".join(f.name for f in dataclasses.fields(EBPOOptions))
            raise ConfigError(
                f"algorithm.estimator_options {sorted(estimator_options)}: EBPO's options are {valid}"
            ) from None
        estimator_options = {}
    if estimator != "ebpo":
        changed = {
            f.name: getattr(ebpo, f.name)
            for f in dataclasses.fields(EBPOOptions)
            if getattr(ebpo, f.name) != getattr(EBPOOptions(), f.name)
        }
        if changed:
            raise ConfigError(
                f"algorithm.ebpo sets EBPO's options {changed}, which algorithm.estimator={estimator} does "
                "not read; set algorithm.estimator=ebpo or leave algorithm.ebpo at its defaults"
            )
    return ebpo, estimator_options
