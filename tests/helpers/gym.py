"""What the gym tests share: two reasoning-gym datasets at small settings, the gold answer of a gym record, and
the mark that skips a test where the ebpo[gym] extra is not installed."""

from __future__ import annotations

import importlib.util
import json

import pytest

needs_gym = pytest.mark.skipif(
    importlib.util.find_spec("reasoning_gym") is None, reason="the gym tasks need the ebpo[gym] extra"
)


SMALL = {
    "chain_sum": {"max_terms": 2, "levels": {1: {"max_digits": 1}, 2: {"min_digits": 2, "max_digits": 2}}},
    "spell_backward": {"max_word_len": 5},
}
"""Two datasets with small settings: chain_sum in two levels of our own, spell_backward without levels."""


def gold(record) -> str:
    return json.loads(record.answer)["answer"]
