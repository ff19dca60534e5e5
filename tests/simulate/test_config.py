"""Tests for ebpo.simulate.config: the settings' checks."""

from __future__ import annotations

import pytest

from ebpo.simulate import SimulateConfig


def test_config_rejects_bad_settings():
    with pytest.raises(ValueError, match="steps > warmup"):
        SimulateConfig(steps=10, warmup=10)
    with pytest.raises(ValueError, match="group_size >= 2"):
        SimulateConfig(group_size=1)


def test_staleness_settings_read_the_shared_settings_from_the_config():
    from ebpo.simulate import StalenessSettings

    cfg = SimulateConfig(
        steps=30, warmup=5, group_size=8, prompts_per_step=16, seeds=[4, 5], concentration=3.0, pool_size=64
    )
    settings = StalenessSettings.from_config(cfg)
    assert settings == StalenessSettings(
        lags=[0, 2, 4, 8, 16],
        drifts=[2.0, 8.0],
        memories=["all", "10"],
        seeds=[4, 5],
        steps=30,
        warmup=5,
        prompts_per_step=16,
        group_size=8,
        concentration=3.0,
    )  # its own pool: pool_size and mean_rate keep the study's values
    assert settings.pool_size == 1024 and settings.mean_rate == 0.35
