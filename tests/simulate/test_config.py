"""Tests for ebpo.simulate.config: the settings' checks."""

from __future__ import annotations

import pytest

from ebpo.simulate import SimulateConfig


def test_config_rejects_bad_settings():
    with pytest.raises(ValueError, match="steps > warmup"):
        SimulateConfig(steps=10, warmup=10)
    with pytest.raises(ValueError, match="group_size >= 2"):
        SimulateConfig(group_size=1)


def test_a_bad_setting_is_a_config_error_naming_each_broken_rule_and_only_its_fields_values():
    from ebpo.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        SimulateConfig(steps=10, warmup=10, pool_size=8, theorem2_steps=400)
    assert str(caught.value) == (
        "invalid simulate settings, need: steps > warmup >= 0; pool_size >= prompts_per_step "
        "(got prompts_per_step=32, steps=10, warmup=10, pool_size=8)"
    )


@pytest.mark.parametrize(
    ("settings", "rule"),
    [
        ({"staleness_lags": [0, -1]}, "staleness_lags non-empty, each >= 0"),
        ({"staleness_lags": []}, "staleness_lags non-empty, each >= 0"),
        ({"staleness_drifts": [2.0, float("nan")]}, "staleness_drifts non-empty, each finite"),
        (
            {"staleness_memories": ["all", "soon"]},
            "staleness_memories non-empty, each 'all' or a half-life > 0",
        ),
        ({"staleness_memories": ["0"]}, "staleness_memories non-empty, each 'all' or a half-life > 0"),
        ({"staleness_memories": ["inf"]}, "staleness_memories non-empty, each 'all' or a half-life > 0"),
    ],
)
def test_the_staleness_study_settings_are_checked_before_it_runs(settings, rule):
    from ebpo.errors import ConfigError

    name = next(iter(settings))
    with pytest.raises(ConfigError, match=f"need: {rule} \\(got {name}=") as caught:
        SimulateConfig(**settings)
    assert "\n" not in str(caught.value)


def test_the_staleness_study_takes_every_memory_ebpo_takes():
    cfg = SimulateConfig(staleness_memories=["all", "10", "2.5"], staleness_lags=[0], staleness_drifts=[-1.0])
    assert cfg.staleness_memories == ["all", "10", "2.5"]


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
