"""Student's t quantile, exact, in plain Python: ``ebpo diagnose``'s intervals and the learning benchmark's
report use this one function (scipy is no dependency of ebpo; ``tests/test_stats.py`` and
``tests/bench_learning/test_learning_stats.py`` hold it to scipy's ``t.ppf`` and to the printed table)."""

from __future__ import annotations

import math

__all__ = ["t_quantile"]


def t_quantile(df: int, level: float = 0.95) -> float:
    """Two-sided Student t quantile t_{(1 + level)/2, df} for integer df >= 1, by bisection on the exact
    distribution function for integer degrees of freedom (Abramowitz and Stegun 26.7.3-26.7.4)."""
    if df < 1:
        raise ValueError(f"t_quantile needs df >= 1, got {df}")

    def central_mass(t: float) -> float:  # P(|T| < t)
        theta = math.atan(t / math.sqrt(df))
        cos2 = math.cos(theta) ** 2
        if df % 2 == 1:
            series, term = 1.0, 1.0
            for k in range(1, (df - 1) // 2):  # 1 + (2/3) c² + (2·4)/(3·5) c⁴ + ...
                term *= (2 * k) / (2 * k + 1) * cos2
                series += term
            body = math.sin(theta) * math.cos(theta) * series if df > 1 else 0.0
            return 2 / math.pi * (theta + body)
        series, term = 1.0, 1.0
        for k in range(1, df // 2):  # 1 + (1/2) c² + (1·3)/(2·4) c⁴ + ...
            term *= (2 * k - 1) / (2 * k) * cos2
            series += term
        return math.sin(theta) * series

    low, high = 0.0, 1.0
    while central_mass(high) < level:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if central_mass(mid) < level else (low, mid)
    return (low + high) / 2
