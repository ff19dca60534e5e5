"""ebpo: Empirical Bayes Policy Optimization (GRPO with a shrinkage baseline) and its baselines for RLVR.

Entry points: ``get_estimator`` / ``list_estimators`` / ``register_estimator`` (advantage estimators,
``ebpo.advantages``), ``get_policy_loss`` / ``list_policy_losses`` (``ebpo.losses``) and ``diagnose`` (``ebpo
diagnose`` in Python, ``ebpo.diagnostics``). All are imported on first use (PEP 562 ``__getattr__``), so
``import ebpo`` and ``ebpo --help`` do not pay for torch. ``diagnose`` is named by string only: it is built on
the trainer, far above this package's layer (``tools/import_graph.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "get_estimator": "ebpo.advantages",
    "list_estimators": "ebpo.advantages",
    "register_estimator": "ebpo.advantages",
    "get_policy_loss": "ebpo.losses",
    "list_policy_losses": "ebpo.losses",
    "diagnose": "ebpo.diagnostics.study",
}

__all__ = [
    "__version__",
    "diagnose",
    "get_estimator",
    "get_policy_loss",
    "list_estimators",
    "list_policy_losses",
    "register_estimator",
]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time these come from __getattr__
    from ebpo.advantages import get_estimator, list_estimators, register_estimator
    from ebpo.losses import get_policy_loss, list_policy_losses


def __getattr__(name: str) -> Any:
    """Import the module that defines ``name`` on first access and cache the attribute here."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ebpo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
