"""Statistics over seeds: t-intervals, paired differences, and the per-run summaries of a validation curve.

Definitions (used by every table):

- **95% interval**: mean +- t_{0.975, n-1} s / sqrt(n) over seeds, s the sample standard deviation; none
  with one seed.
- **Paired difference**: per seed, a cell's value minus its reference's (same arm, budget variant, G and
  seed: the same prompt stream, validation and test sets), then the interval above over the differences.
- **Validation AUC**: the trapezoid area under validation pass@1 over the evaluated steps (step 0 to the
  last step) divided by the number of steps: the mean validation pass@1 over training, in pass@1 units.
- **Steps to threshold**: the first evaluated step >= 1 whose validation pass@1 is at least the run's own
  step-0 value (the base model on that seed's validation set) plus ``threshold`` points; censored (None)
  when no validation reaches it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ebpo.stats import t_quantile  # the one t quantile (exact; scipy is no dependency of ebpo)


@dataclass(frozen=True)
class MeanCI:
    """A mean over seeds and the half-width of its 95% t-interval (nan with fewer than two values)."""

    mean: float
    half_width: float
    n: int

    @property
    def excludes_zero(self) -> bool:
        """The interval lies entirely above or below 0 (False without an interval)."""
        return self.n >= 2 and not math.isnan(self.half_width) and abs(self.mean) > self.half_width

    def format(self, scale: float = 100.0, digits: int = 1, signed: bool = False) -> str:
        """``"mean ± half"`` scaled (percent points by default); ``-`` when empty."""
        if self.n == 0 or math.isnan(self.mean):
            return "-"
        text = f"{self.mean * scale:+.{digits}f}" if signed else f"{self.mean * scale:.{digits}f}"
        if self.n >= 2 and not math.isnan(self.half_width):
            text += f" ± {self.half_width * scale:.{digits}f}"
        return text

    def format_difference(self, scale: float = 100.0, digits: int = 1) -> str:
        """A difference for a Markdown table: signed, in bold when its interval excludes 0."""
        text = self.format(scale, digits, signed=True)
        return f"**{text}**" if self.excludes_zero else text


EMPTY = MeanCI(float("nan"), float("nan"), 0)


def mean_ci(values: Iterable[float | None]) -> MeanCI:
    """mean +- t_{0.975, n-1} s / sqrt(n) over the finite values (None and nan are missing, not zero)."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    n = len(xs)
    if n == 0:
        return EMPTY
    mean = sum(xs) / n
    if n == 1:
        return MeanCI(mean, float("nan"), 1)
    s = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return MeanCI(mean, t_quantile(n - 1) * s / math.sqrt(n), n)


def paired_ci(values: dict[int, float], reference: dict[int, float]) -> MeanCI:
    """The interval of ``values[seed] - reference[seed]`` over the seeds both have (finite values only)."""
    seeds = sorted(set(values) & set(reference))
    return mean_ci(values[s] - reference[s] for s in seeds if _finite(values[s]) and _finite(reference[s]))


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def validation_auc(points: Sequence[Sequence[float]], total_steps: int) -> float:
    """Trapezoid area under ``[(step, pass@1), ...]`` from step 0 to ``total_steps``, divided by
    ``total_steps``; nan unless the curve starts at step 0 and ends at ``total_steps``."""
    curve = sorted((float(s), float(v)) for s, v in points)
    if total_steps < 1 or len(curve) < 2 or curve[0][0] != 0 or curve[-1][0] != total_steps:
        return float("nan")
    area = sum((s1 - s0) * (v0 + v1) / 2 for (s0, v0), (s1, v1) in zip(curve, curve[1:]))
    return area / total_steps


def steps_to_threshold(points: Sequence[Sequence[float]], threshold: float) -> int | None:
    """First step >= 1 with pass@1 >= (step-0 pass@1) + ``threshold`` (a fraction: 0.1 = 10 points);
    None when never reached (censored) or without a step-0 value."""
    curve = sorted((float(s), float(v)) for s, v in points)
    if not curve or curve[0][0] != 0:
        return None
    target = curve[0][1] + threshold
    return next((int(s) for s, v in curve[1:] if v >= target - 1e-12), None)


def median_censored(values: Sequence[int | None], limit: int) -> str:
    """The median over seeds of steps-to-threshold, censored runs counting as "never" (above every step),
    and how many reached it: ``"40 (4/5)"``, ``"> 150 (2/5)"`` (``limit`` = the run's steps); ``-`` if none."""
    if not values:
        return "-"
    ordered = sorted(math.inf if v is None else float(v) for v in values)
    n, reached = len(ordered), sum(v is not None for v in values)
    mid = ordered[(n - 1) // 2 : n // 2 + 1]  # one middle value (odd n) or two (even n)
    median = sum(mid) / len(mid)
    text = f"> {limit}" if math.isinf(median) else f"{median:g}"
    return f"{text} ({reached}/{n})"


def curve_mean(points: Sequence[Sequence[float]], from_step: int = 1) -> float:
    """Mean of a per-step curve over steps >= ``from_step`` (training steps start at 1); nan if empty."""
    values = [float(v) for s, v in points if s >= from_step]
    return sum(values) / len(values) if values else float("nan")
