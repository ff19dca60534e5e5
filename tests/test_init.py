"""The packages' entry points (``ebpo/__init__.py``, ``ebpo/trainer/__init__.py``): what ``import ebpo``
offers, and that importing them costs no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

import ebpo


def _fresh_python(code: str) -> list[str]:
    """The words ``code`` prints in a fresh interpreter that imports what this one does."""
    env = {"PYTHONPATH": ":".join(sys.path)}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return run.stdout.split()


def test_import_ebpo_imports_no_torch_until_an_entry_point_is_used():
    code = (
        "import sys, ebpo\nprint('torch' in sys.modules)\nebpo.EBPOOptions\nprint('torch' in sys.modules)\n"
    )
    assert _fresh_python(code) == ["False", "True"]


def test_import_ebpo_trainer_imports_no_torch():
    code = "import sys, ebpo.trainer\nprint('torch' in sys.modules, 'transformers' in sys.modules)\n"
    assert _fresh_python(code) == ["False", "False"]


def test_every_export_is_its_defining_module_s_object():
    from ebpo import advantages, losses
    from ebpo.diagnostics import study

    for name in ebpo.__all__:
        if name != "__version__":
            home = advantages if name in advantages.__all__ else study if name == "diagnose" else losses
            assert getattr(ebpo, name) is getattr(home, name), name
    assert set(ebpo.__all__) <= set(dir(ebpo))
    # what users build is here: the estimator API and EBPO's options, the policy-loss API and its config
    assert {"AdvantageEstimator", "EBPOOptions", "register_estimator", "PolicyLossConfig"} <= set(
        ebpo.__all__
    )
    with pytest.raises(AttributeError, match="'get_estimater'"):
        ebpo.get_estimater  # noqa: B018
