"""``ebpo.diagnostics.report``: the figure's series of paired differences."""

from __future__ import annotations

import pytest

from ebpo.diagnostics import report


def test_the_figure_draws_each_estimators_paired_difference_against_compare_to():
    # Rows as summarize() gives them (estimators in order, G ascending per estimator); the figure's lines are
    # the table's Δ columns: each estimator but compare_to, per metric, its _diff and the _diff interval (not
    # its own value and interval).
    def row(label, G, cos, cos_diff, err_diff):
        return {
            "estimator": label,
            "G": G,
            "cosine": cos,
            "cosine_low": cos - 0.1,
            "cosine_high": cos + 0.1,
            "cosine_diff": cos_diff,
            "cosine_diff_low": cos_diff - 0.01,
            "cosine_diff_high": cos_diff + 0.02,
            "baseline_error_diff": err_diff,
            "baseline_error_diff_low": err_diff - 0.003,
            "baseline_error_diff_high": err_diff + 0.001,
        }

    rows = [row("grpo", 4, 0.7, 0.0, 0.0), row("grpo", 2, 0.6, 0.0, 0.0)]
    rows += [
        row("ebpo", 4, 0.75, 0.05, -0.004),
        row("ebpo", 2, 0.61, 0.01, -0.02),
        row("rloo", 2, 0.5, -0.1, 0.03),
    ]
    lines = report.difference_series(report.Summary(rows, [], {}), "grpo")
    assert [(line.metric, line.estimator) for line in lines] == [
        ("baseline_error", "ebpo"),
        ("baseline_error", "rloo"),
        ("cosine", "ebpo"),
        ("cosine", "rloo"),
    ]
    ebpo_cos = lines[2]
    assert ebpo_cos.G == [2, 4] and ebpo_cos.value == [0.01, 0.05]
    assert ebpo_cos.low == pytest.approx([0.0, 0.04]) and ebpo_cos.high == pytest.approx([0.03, 0.07])
    assert lines[0].value == [-0.02, -0.004] and lines[0].low == pytest.approx([-0.023, -0.007])
    assert lines[3].G == [2] and lines[3].value == [-0.1]
    assert report.difference_series(report.Summary(rows[:2], [], {}), "grpo") == []  # nothing to compare
