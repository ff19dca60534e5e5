"""ebpo.integrations.compat: the probe for TRL's value-head class that verl's workers import.

Fake modules stand in for TRL: the probe must find the class where verl looks for it, ``trl.experimental.ppo``
then ``trl``, and report its absence (TRL 1.x) without raising. The environment check names a missing verl
before a TRL conflict: one line for our launcher, an ``ImportError`` for an import.
"""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest

from ebpo.integrations import compat
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


def _find_spec_without(monkeypatch, missing: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == missing else real(name, *a)
    )


def test_missing_verl_is_named_before_a_trl_conflict(monkeypatch):
    # no verl and TRL 1.x (the core + TRL environment): the first fix is installing verl, in its own environment
    _find_spec_without(monkeypatch, "verl")
    monkeypatch.setattr(compat, "trl_conflict", lambda: "the TRL conflict")
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-c", "import ebpo.integrations.verl"])
    with pytest.raises(ImportError, match="verl is not installed") as raised:
        compat.check_environment()
    assert "make verl-env" in str(raised.value)


def test_a_trl_conflict_is_named_when_verl_is_installed(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    monkeypatch.setattr(compat, "trl_conflict", lambda: "the TRL conflict")
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-c", "import ebpo.integrations.verl"])
    with pytest.raises(ImportError, match="the TRL conflict"):
        compat.check_environment()
    monkeypatch.setattr(compat, "trl_conflict", lambda: None)
    compat.check_environment()  # verl and no conflict: nothing to say


def test_our_launcher_without_verl_exits_with_one_line(capsys, monkeypatch):
    _find_spec_without(monkeypatch, "verl")
    monkeypatch.setattr(
        sys, "orig_argv", [sys.executable, "-m", "ebpo.integrations.verl", "trainer.device=cpu"]
    )
    with pytest.raises(SystemExit) as raised:
        compat.check_environment()
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ebpo.integrations.verl: verl is not installed")
