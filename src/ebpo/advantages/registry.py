"""The estimator registry: one name -> estimator class table, and the option checks frameworks run at start.

``register_estimator(name)`` (a class decorator) adds a class; ``get_estimator(name, **options)`` builds it
(an unknown name raises ``ValueError`` listing the valid ones, an unknown option ``TypeError`` listing the
options); ``list_estimators()`` gives the names. :func:`check_options` and :func:`option_names` are for the
code that reads estimator options from a config (``ebpo train``, the verl and TRL adapters): they name the
key at fault with the framework's prefix, before anything is built.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ebpo.advantages.base import AdvantageEstimator
from ebpo.advantages.checks import OptionError
from ebpo.registry import Registry

__all__ = ["check_options", "get_estimator", "list_estimators", "option_names", "register_estimator"]

_ESTIMATORS: Registry[type[AdvantageEstimator]] = Registry("advantage estimator")


def register_estimator(name: str) -> Callable[[type[AdvantageEstimator]], type[AdvantageEstimator]]:
    """Class decorator: make ``get_estimator(name, **options)`` build ``cls(**options)``."""

    def decorator(cls: type[AdvantageEstimator]) -> type[AdvantageEstimator]:
        _ESTIMATORS.register(name, cls)
        cls.name = name
        return cls

    return decorator


def list_estimators() -> list[str]:
    """Names accepted by :func:`get_estimator`, sorted."""
    return _ESTIMATORS.names()


def get_estimator(name: str, **options: Any) -> AdvantageEstimator:
    """Build the estimator registered as ``name`` with keyword ``options``.

    Raises ValueError for an unknown name (listing the valid ones) and TypeError for options the
    estimator does not take (naming them and listing the ones it does).
    """
    valid = option_names(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise TypeError(
            f"advantage estimator {name!r} got unknown option(s) {unknown}; "
            f"valid options: {valid if valid else 'none'}"
        )
    return _ESTIMATORS.get(name)(**options)


def option_names(name: str) -> list[str]:
    """The keyword options estimator ``name`` takes: the fields of its ``options_type`` (EBPO:
    :class:`EBPOOptions`), else its constructor's keyword-only parameters."""
    cls = _ESTIMATORS.get(name)
    if cls.options_type is not None:
        return [f.name for f in dataclasses.fields(cls.options_type)]
    params = inspect.signature(cls.__init__).parameters
    return [p for p in params if p != "self" and params[p].kind is inspect.Parameter.KEYWORD_ONLY]


def check_options(
    name: str, options: Mapping[str, Any], *, where: str, also_valid: Sequence[str] = ()
) -> None:
    """Check a framework's options for estimator ``name`` before anything is built, naming the key at fault
    as ``<where>.<key>`` (``algorithm.estimator_options.normalize``, ``algorithm.ebpo.tau2``,
    ``EBPOConfig.prior_memory``): ``ValueError`` for a key that is not one of its options (listing them, and
    ``also_valid``, keys the framework reads itself) or a value it rejects."""
    valid = option_names(name)
    unknown = sorted(set(options) - set(valid) - set(also_valid))
    if unknown:
        listed = ", ".join(f"{where}.{key}" for key in [*valid, *also_valid]) or "none"
        raise OptionError(
            unknown[0], f"{where}.{unknown[0]} is rejected by {name!r}: not one of its options ({listed})"
        )
    try:
        get_estimator(name, **{key: value for key, value in options.items() if key in valid})
    except OptionError as err:
        raise OptionError(err.option, f"{where}.{err.option}: {err}") from None
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where} {dict(options)} rejected by {name!r}: {err}") from None
