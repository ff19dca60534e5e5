"""``ebpo.eval.report``: the results tables, their averages derived by hand."""

from __future__ import annotations

from ebpo.eval.report import results_table


def test_results_table_average_by_hand():
    results = {
        "A": {"b1": {"pass@1": 0.5}, "b2": {"pass@1": 0.25}},
        "B": {"b1": {"pass@1": 0.1}},
    }
    table = results_table(results, ["b1", "b2"], "pass@1")
    # A: (50 + 25) / 2 = 37.5; B lacks b2, so no average
    assert "| A | 50.00 | 25.00 | 37.50 |" in table
    assert "| B | 10.00 | - | - |" in table


def test_results_table_se_average_by_hand():
    # se 0.03 and 0.04: se of the mean of two independent estimates = sqrt(0.03^2 + 0.04^2) / 2 = 0.025
    results = {"A": {"b1": {"pass@1/se_problems": 0.03}, "b2": {"pass@1/se_problems": 0.04}}}
    assert "| A | 3.00 | 4.00 | 2.50 |" in results_table(results, ["b1", "b2"], "pass@1/se_problems")
