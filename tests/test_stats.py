"""``ebpo.stats``: Student's t quantile against the printed table."""

from __future__ import annotations

import pytest

from ebpo import stats


def test_t_quantile_against_the_table():
    # t_{0.975, df} from standard tables
    for df, value in (
        (1, 12.706),
        (2, 4.303),
        (3, 3.182),
        (9, 2.262),
        (15, 2.131),
        (30, 2.042),
        (120, 1.980),
    ):
        assert stats.t_quantile(df) == pytest.approx(value, abs=1e-3)
