"""Tests for ebpo.simulate.staleness: the rows of the study of EBPO's prior_staleness options."""

from __future__ import annotations

import numpy as np

from ebpo.simulate import STALENESS_OPTIONS, StalenessSettings, run_staleness
from ebpo.simulate.staleness import GROUP_MEAN, METRICS

TINY = StalenessSettings(
    lags=[0, 3], drifts=[4.0], memories=["all", "5"], seeds=[0, 1], steps=10, warmup=2, prompts_per_step=6
)


def test_one_row_per_drift_memory_option_and_lag_and_the_group_mean_once():
    rows = run_staleness(TINY)
    options = [label for label, _ in STALENESS_OPTIONS]
    keys = [(row["drift"], row["prior_memory"], row["option"], row["max_lag"]) for row in rows]
    expected = [(4.0, "all", label, lag) for label in options for lag in (0, 3)]
    expected += [(4.0, "-", GROUP_MEAN, lag) for lag in (0, 3)]  # no prior: with the first memory only
    expected += [(4.0, "5", label, lag) for label in options for lag in (0, 3)]
    assert sorted(keys, key=str) == sorted(expected, key=str)
    for row in rows:
        assert set(row) == {
            "drift",
            "prior_memory",
            "option",
            "max_lag",
            *METRICS,
            *(f"{m}_se" for m in METRICS),
        }
        assert row["rmse_now"] > 0 and row["rmse_sample"] > 0
    np.testing.assert_equal(run_staleness(TINY), rows)  # deterministic given the settings (NaN: no prior)


def test_without_lag_every_staleness_option_is_the_plain_prior():
    # L = 0 for every group: max_lag and decay drop or weigh down nothing, so each option gives the
    # plain prior's numbers on the same (paired) stream; with a lag they differ
    rows = run_staleness(TINY)
    by_option = {
        (row["prior_memory"], row["option"], row["max_lag"]): [row[m] for m in METRICS]
        for row in rows
        if row["option"] != GROUP_MEAN
    }
    for memory in TINY.memories:
        plain = by_option[(memory, "all", 0)]
        for label, _ in STALENESS_OPTIONS:
            np.testing.assert_allclose(by_option[(memory, label, 0)], plain, rtol=1e-12)
        assert by_option[(memory, "decay 2", 3)] != by_option[(memory, "all", 3)]
