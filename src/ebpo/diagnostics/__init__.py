"""``ebpo diagnose``: what each advantage estimator does to the baseline and to the policy gradient, measured on
a model, its prompts and its reward (docs/diagnose.md).

    result = ebpo.diagnose(group_sizes=[4, 8], estimators=["grpo", "ebpo"])   # ebpo.diagnostics.study.diagnose
    summary = ebpo.diagnostics.report.summarize(result)                      # rows with 95% intervals

Modules: ``config`` (:class:`~ebpo.diagnostics.config.DiagnoseConfig`, the settings and flags; estimator specs),
``measures`` (the definitions, pure functions: baselines, the reference's noise, the sketch, gradient statistics,
intervals), ``study`` (:func:`~ebpo.diagnostics.study.diagnose`, the measurement loop), ``report`` (rows, table,
CSV, figure), ``cli``. This file imports nothing, so ``ebpo --help`` (which imports ``cli``) does not import
torch.
"""
