"""Tests for ebpo.simulate.report: the staleness study's table, by hand."""

from __future__ import annotations

from ebpo.simulate import format_staleness
from ebpo.simulate.staleness import GROUP_MEAN


def _row(option: str, memory: str, lag: int, rmse: float) -> dict:
    return {
        "drift": 2.0,
        "prior_memory": memory,
        "option": option,
        "max_lag": lag,
        "bias_now": -0.01,
        "bias_sample": 0.02,
        "rmse_now": rmse,
        "rmse_sample": rmse / 2,
    }


def test_format_staleness_by_hand():
    # options without rows are left out; the group mean has no prior, hence no bias
    rows = [_row("all", "all", 0, 0.1), _row("all", "all", 4, 0.3), _row(GROUP_MEAN, "-", 0, 0.2)]
    rows.append(_row(GROUP_MEAN, "-", 4, 0.4))
    assert format_staleness(rows) == "\n".join(
        [
            "## drift 2 logits over the run, prior_memory=all",
            "",
            "cells: baseline RMSE vs current rate (vs sampling rate); prior bias vs current (vs sampling)",
            "",
            "| option | L_max = 0 | L_max = 4 |",
            "|---|---|---|",
            "| all | 0.1000 (0.0500); -0.0100 (+0.0200) | 0.3000 (0.1500); -0.0100 (+0.0200) |",
            "| grpo (group mean) | 0.2000 (0.1000) | 0.4000 (0.2000) |",
            "",
        ]
    )
