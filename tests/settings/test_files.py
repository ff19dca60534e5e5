"""Nested mappings from layers and dotted overrides (``ebpo.settings.files``), with keys renamed from earlier
spellings."""

from __future__ import annotations

import pytest

from ebpo import settings
from ebpo.errors import ConfigError


def test_merge_applies_layers_then_overrides_and_leaves_the_layers_unchanged():
    preset = {"inner": {"mode": "b", "names": ["p"]}}
    mine = {"count": 3, "inner": {"rate": 0.25}}
    merged = settings.merge([preset, mine], ["inner.names=[q, r]", "extra={k: 1}", "extra.j=2"])
    assert merged == {
        "count": 3,
        "inner": {"mode": "b", "names": ["q", "r"], "rate": 0.25},
        "extra": {"k": 1, "j": 2},
    }
    assert preset == {"inner": {"mode": "b", "names": ["p"]}} and mine == {
        "count": 3,
        "inner": {"rate": 0.25},
    }
    merged["inner"]["mode"] = "a"
    assert preset["inner"]["mode"] == "b"  # the result shares nothing with the layers


def test_an_earlier_spelling_is_renamed_and_the_later_layer_wins_whichever_it_uses():
    renames = {"old": "inner"}
    assert settings.rename_keys({"old": {"rate": 0.1}}, renames) == {"inner": {"rate": 0.1}}
    # one mapping may hold both spellings of a section, but not one option under both
    assert settings.rename_keys({"old": {"rate": 0.1}, "inner": {"mode": "b"}}, renames) == {
        "inner": {"mode": "b", "rate": 0.1}
    }
    with pytest.raises(
        ConfigError, match=r"^old.rate and inner.rate are one key given twice; keep inner.rate$"
    ):
        settings.rename_keys({"old": {"rate": 0.1}, "inner": {"rate": 0.2}}, renames)
    layers = [{"inner": {"rate": 0.1}}, {"old": {"rate": 0.2}}]
    assert settings.merge(layers, [], renames) == {"inner": {"rate": 0.2}}
    assert settings.merge(layers, ["old.rate=0.3"], renames) == {"inner": {"rate": 0.3}}
    assert settings.merge(layers, ["inner.rate=0.4", "old.mode=b"], renames) == {
        "inner": {"rate": 0.4, "mode": "b"}
    }
    # a mapping set whole replaces the section (as it did under the earlier spelling), its keys renamed too
    assert settings.merge(layers, ["old={mode: b}"], renames) == {"inner": {"mode": "b"}}
    assert settings.merge([], ["x={old: {rate: 0.5}}"], {"x.old": "x.inner"}) == {
        "x": {"inner": {"rate": 0.5}}
    }
