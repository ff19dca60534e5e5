"""``ebpo diagnose``: what each advantage estimator does to the baseline and to the policy gradient, measured on
a model, its prompts and its reward (docs/diagnose.md).

    result = ebpo.diagnose(group_sizes=[4, 8], estimators=["grpo", "ebpo"])   # a DiagnoseResult
    summary = ebpo.diagnostics.report.summarize(result)                      # rows with 95% intervals

Modules: ``config`` (:class:`DiagnoseConfig`, the settings and flags; estimator specs), ``measures`` (the
definitions, pure functions: baselines, the reference's noise, the sketch, gradient statistics, intervals),
``study`` (:func:`diagnose`, the measurement loop), ``report`` (rows, table, CSV, figure), ``cli``. The names
below are imported on first use, so ``ebpo --help`` (which imports ``cli``) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "DiagnoseConfig": "ebpo.diagnostics.config",
    "DiagnoseResult": "ebpo.diagnostics.study",
    "diagnose": "ebpo.diagnostics.study",
}

__all__ = ["DiagnoseConfig", "DiagnoseResult", "diagnose"]

if TYPE_CHECKING:
    from ebpo.diagnostics.config import DiagnoseConfig
    from ebpo.diagnostics.study import DiagnoseResult, diagnose


def __getattr__(name: str) -> Any:
    """Import the module that defines ``name`` on first access and cache the attribute here."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ebpo.diagnostics' has no attribute {name!r}")
