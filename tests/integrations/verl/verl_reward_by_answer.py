"""A verl custom reward that ignores the response: (answer mod 3) / 2, so every run that draws the same prompts
sees the same rewards whatever it samples (the multi-rank test compares priors across world sizes)."""

from __future__ import annotations

from typing import Any


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **unused: Any
) -> float:
    return (int(str(ground_truth)) % 3) / 2
