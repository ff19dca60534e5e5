"""``ebpo.diagnostics.config``: settings that cannot run are one line naming the setting."""

from __future__ import annotations

import pytest

import ebpo
from ebpo.diagnostics import study
from ebpo.diagnostics.config import DiagnoseConfig
from ebpo.errors import ConfigError


def test_bad_settings_fail_with_one_line():
    with pytest.raises(ConfigError, match="--estimators ebpo:normalise=prior"):
        study.estimator_specs(DiagnoseConfig(estimators=["grpo", "ebpo:normalise=prior"]))
    with pytest.raises(ConfigError, match="--compare-to"):
        DiagnoseConfig(estimators=["ebpo"])
    with pytest.raises(ConfigError, match=r"\breference_samples\b"):
        DiagnoseConfig(reference_samples=7)
    with pytest.raises(ConfigError, match=r"\['groups'\]"):
        ebpo.diagnose(groups=[4])
