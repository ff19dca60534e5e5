"""ebpo.integrations.compat: the probe for TRL's value-head class that verl's workers import.

Fake modules stand in for TRL: the probe must find the class where verl looks for it, ``trl.experimental.ppo``
then ``trl``, and report its absence (TRL 1.x) without raising.
"""

from __future__ import annotations

import sys
import types

import pytest

from ebpo.integrations.compat import _has_value_head_class


def _module(name: str, *, with_class: bool) -> types.ModuleType:
    module = types.ModuleType(name)
    if with_class:
        module.AutoModelForCausalLMWithValueHead = type("AutoModelForCausalLMWithValueHead", (), {})
    return module


@pytest.mark.parametrize(
    ("experimental_ppo", "top_level", "expected"),
    [
        (True, False, True),  # trl.experimental.ppo has it
        (None, True, True),  # no trl.experimental.ppo (ImportError), trl has it
        (False, True, True),  # trl.experimental.ppo without it, trl has it
        (False, False, False),  # TRL 1.x: neither
        (None, False, False),
    ],
)
def test_value_head_probe(monkeypatch, experimental_ppo, top_level, expected):
    monkeypatch.setitem(sys.modules, "trl", _module("trl", with_class=top_level))
    monkeypatch.setitem(sys.modules, "trl.experimental", _module("trl.experimental", with_class=False))
    # a None entry in sys.modules makes `import trl.experimental.ppo` raise ImportError
    ppo = None if experimental_ppo is None else _module("trl.experimental.ppo", with_class=experimental_ppo)
    monkeypatch.setitem(sys.modules, "trl.experimental.ppo", ppo)
    assert _has_value_head_class() is expected
