"""Environment checks for the adapters, importable without importing any framework.

``ebpo.integrations.verl`` runs :func:`check_environment` before it imports verl (so it lives outside that
package: importing ``ebpo.integrations.verl.anything`` would run the check itself).

verl 0.9's FSDP engine applies its model monkey-patches on every actor start
(``verl.models.transformers.monkey_patch``); whenever a ``trl`` package is importable they import
``AutoModelForCausalLMWithValueHead`` from ``trl.experimental.ppo`` or ``trl``. TRL 1.x has neither (verl's
own ``fsdp`` extra pins ``trl==0.27.0``), so with TRL 1.x installed verl's workers die at
``actor_rollout_init_model``. verl without any ``trl`` skips those patches and runs, so the fix is an
environment without TRL 1.x: ``ebpo[verl]`` and ``ebpo[trl]`` live in separate virtual environments.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import warnings
from importlib import metadata

logger = logging.getLogger(__name__)

__all__ = ["TRL_CONFLICT_FIX", "VERL_MISSING", "trl_conflict", "check_environment"]

TRL_CONFLICT_FIX = (
    "use a separate environment for verl: `make verl-env` (or `python -m venv .venv-verl && "
    '.venv-verl/bin/pip install torch==2.13.0 -e ".[verl]"`), or `pip uninstall trl` here'
)


VERL_MISSING = (
    "verl is not installed in this environment: install `ebpo[verl]` in an environment of its own, without "
    "TRL 1.x: `make verl-env` (or `python -m venv .venv-verl && .venv-verl/bin/pip install torch==2.13.0 "
    '-e ".[verl]"`)'
)


def _has_value_head_class() -> bool:
    """Whether verl's import of TRL's value-head model would succeed (the lookup verl performs, ``from
    trl.experimental.ppo import ...`` then ``from trl import ...``, done through importlib: the class is
    absent from the TRL we type-check against, which is the point of the probe)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # trl.experimental warns on import
        for module_name in ("trl.experimental.ppo", "trl"):
            try:
                if hasattr(importlib.import_module(module_name), "AutoModelForCausalLMWithValueHead"):
                    return True
            except ImportError:
                pass
        return False


def trl_conflict() -> str | None:
    """One line naming the TRL conflict and its fix, or None when verl's workers can start here.

    Cheap when ``trl`` is absent (the ``ebpo[verl]`` environment): one ``find_spec``. With ``trl`` installed
    it performs verl's own import of the value-head class, so the answer is exact for any TRL version.
    """
    if importlib.util.find_spec("trl") is None or _has_value_head_class():
        return None
    try:
        version = metadata.version("trl")
    except metadata.PackageNotFoundError:  # pragma: no cover - a bare trl module on the path
        version = "unknown"
    return (
        f"verl 0.9's FSDP workers import TRL's AutoModelForCausalLMWithValueHead, which the installed "
        f"trl {version} no longer has (TRL 1.x removed it; verl pins trl==0.27.0): {TRL_CONFLICT_FIX}"
    )


def _launched_as_cli() -> bool:
    """True in ``python -m ebpo.integrations.verl ...`` (the package is imported before ``__main__`` runs)."""
    argv = getattr(sys, "orig_argv", [])
    return any(a == "-m" and b == "ebpo.integrations.verl" for a, b in zip(argv, argv[1:]))


def check_environment() -> None:
    """Fail when verl cannot train in this environment: one line on stderr and exit status 2 for our CLI,
    ``ImportError`` with the same line for an import (``VERL_USE_EXTERNAL_MODULES``, user code). verl missing
    is named before any TRL conflict: it is the first thing to fix."""
    problem = VERL_MISSING if importlib.util.find_spec("verl") is None else trl_conflict()
    if problem is None:
        return
    if _launched_as_cli():
        logger.error(f"ebpo.integrations.verl: {problem}")
        raise SystemExit(2)
    raise ImportError(problem)
