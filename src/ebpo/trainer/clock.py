"""The wall time of a training step: ``timing_s/<phase>``, ``timing_s/step`` and ``perf/tokens_per_s``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class StepClock:
    """Wall seconds of a step and of its phases: the step's ``timing_s/...`` and ``perf/tokens_per_s``."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.seconds[phase] = time.perf_counter() - start

    def metrics(self, tokens: int) -> dict[str, float]:
        """``timing_s/<phase>``, ``timing_s/step`` (so far) and the step's ``tokens`` per second."""
        step = time.perf_counter() - self.start
        timing = {f"timing_s/{phase}": seconds for phase, seconds in self.seconds.items()}
        return {**timing, "timing_s/step": step, "perf/tokens_per_s": tokens / max(step, 1e-9)}
