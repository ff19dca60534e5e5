"""The nine labels (``ebpo.annotate.topic.labels``): a judge's answer normalized to one of them, the instruction
stripped from a problem."""

from __future__ import annotations

from ebpo.annotate.topic import normalize_label, strip_instruction


def test_normalize_label():
    assert normalize_label("Geometry & Trigonometry") == "Geometry & Trigonometry"
    assert normalize_label("  geometry and trigonometry. ") == "Geometry & Trigonometry"
    assert normalize_label('"Linear Algebra"') == "Linear Algebra"
    assert normalize_label("Topic: Discrete Mathematics") == "Discrete Mathematics"
    assert normalize_label("4") == "Discrete Mathematics"  # 1-based position in TOPICS
    assert normalize_label("Geometry") is None  # not one of the nine
    assert normalize_label("Algebra & Number Theory or Geometry & Trigonometry") is None
    assert normalize_label(None) is None


def test_strip_instruction():
    text = "Find $x$.\nPlease reason step by step, and put your final answer within \\boxed{}."
    assert strip_instruction(text) == "Find $x$."
