"""Agreement of predicted with gold labels (``ebpo.annotate.topic.agreement``), beside the backends' registry
(``ebpo.annotate.topic``): the names, and the error for an unknown one."""

from __future__ import annotations

import pytest

from ebpo.annotate.topic import agreement, get_topic_backend, list_topic_backends


def test_registry_and_agreement():
    assert list_topic_backends() == ["embedding", "judge", "keyword"]
    with pytest.raises(ValueError, match="'llm'.*embedding, judge, keyword; .*--plugins"):
        get_topic_backend("llm")
    # 3 of 4 right; the miss is Geometry predicted as Algebra
    a, g = "Algebra & Number Theory", "Geometry & Trigonometry"
    rep = agreement([a, a, g, None], [a, g, g, a])
    assert rep["accuracy"] == 0.5
    assert rep["confusion"] == {a: {a: 1, "None": 1}, g: {a: 1, g: 1}}
    assert rep["per_label"] == {a: (1, 2), g: (1, 2)}
