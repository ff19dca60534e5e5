"""ebpo: Empirical Bayes Policy Optimization (GRPO with a shrinkage baseline) and its baselines for RLVR.

What users build, all from here: advantage estimators (``get_estimator`` / ``list_estimators`` /
``register_estimator``, the ``AdvantageEstimator`` base class, ``EBPOEstimator`` and its ``EBPOOptions``;
``ebpo.advantages``), policy losses (``get_policy_loss`` / ``list_policy_losses`` / ``register_policy_loss``,
the ``PolicyLossOptions`` a user sets and the ``PolicyLossConfig`` a loss takes; ``ebpo.losses``) and
``diagnose`` (``ebpo diagnose`` in Python, ``ebpo.diagnostics``). Each is imported on first use (PEP 562
``__getattr__``), so ``import ebpo`` and ``ebpo --help`` do not pay for torch. ``diagnose`` is named by string
only: it is built on the trainer, far above this package's layer (``tools/import_graph.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "AdvantageEstimator": "ebpo.advantages",
    "EBPOEstimator": "ebpo.advantages",
    "EBPOOptions": "ebpo.advantages",
    "get_estimator": "ebpo.advantages",
    "list_estimators": "ebpo.advantages",
    "register_estimator": "ebpo.advantages",
    "PolicyLossConfig": "ebpo.losses",
    "PolicyLossOptions": "ebpo.losses",
    "get_policy_loss": "ebpo.losses",
    "list_policy_losses": "ebpo.losses",
    "register_policy_loss": "ebpo.losses",
    "diagnose": "ebpo.diagnostics.study",
}

__all__ = [
    "AdvantageEstimator",
    "EBPOEstimator",
    "EBPOOptions",
    "PolicyLossConfig",
    "PolicyLossOptions",
    "__version__",
    "diagnose",
    "get_estimator",
    "get_policy_loss",
    "list_estimators",
    "list_policy_losses",
    "register_estimator",
    "register_policy_loss",
]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time these come from __getattr__
    from ebpo.advantages import (
        AdvantageEstimator,
        EBPOEstimator,
        EBPOOptions,
        get_estimator,
        list_estimators,
        register_estimator,
    )
    from ebpo.losses import (
        PolicyLossConfig,
        PolicyLossOptions,
        get_policy_loss,
        list_policy_losses,
        register_policy_loss,
    )


def __getattr__(name: str) -> Any:
    """Import the module that defines ``name`` on first access and cache the attribute here."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ebpo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
