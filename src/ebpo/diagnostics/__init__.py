"""``ebpo diagnose``: what each advantage estimator does to the baseline and to the policy gradient, measured on
a model, its prompts and its reward (docs/diagnose.md).

    result = ebpo.diagnose(group_sizes=[4, 8], estimators=["grpo", "ebpo"])   # a DiagnoseResult
    summary = ebpo.diagnostics.report.summarize(result)                      # rows with 95% intervals

Modules: ``config`` (:class:`DiagnoseConfig`, the settings and flags; estimator specs), ``measures`` (the
definitions, pure functions: baselines, the reference's noise, the sketch, gradient statistics, intervals),
``study`` (:func:`diagnose`, the measurement loop), ``report`` (rows, table, CSV, figure), ``cli``.
"""

from __future__ import annotations

from ebpo.diagnostics.config import DiagnoseConfig
from ebpo.diagnostics.study import DiagnoseResult, diagnose

__all__ = ["DiagnoseConfig", "DiagnoseResult", "diagnose"]
