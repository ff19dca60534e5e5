"""Settings dataclasses built from nested mappings (``ebpo.settings.fields``): every key and value checked and
named, the same checks on an instance changed by hand, every option listed."""

from __future__ import annotations

import dataclasses
from typing import Literal

import pytest

from ebpo import settings
from ebpo.errors import ConfigError


class OptionError(ValueError):
    """An error that names its option, as ``ebpo.advantages.OptionError`` does."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


@dataclasses.dataclass
class Inner:
    mode: Literal["a", "b"] = dataclasses.field(default="a", metadata={"help": "a choice"})
    rate: float = dataclasses.field(default=0.5, metadata={"help": "a number in (0, 1]"})
    names: list[str] | None = dataclasses.field(default=None, metadata={"help": "optional names"})

    def __post_init__(self) -> None:
        if not 0 < self.rate <= 1:
            raise OptionError("rate", f"rate must be in (0, 1], got {self.rate}")


@dataclasses.dataclass
class Outer:
    count: int = dataclasses.field(default=1, metadata={"help": "how many"})
    inner: Inner = dataclasses.field(default_factory=Inner, metadata={"help": "a section"})
    extra: dict = dataclasses.field(default_factory=dict, metadata={"help": "free options"})

    def __post_init__(self) -> None:
        if self.count > 1 and self.inner.mode == "a":
            raise ConfigError("count > 1 needs inner.mode=b")


def test_build_checks_every_key_and_value_and_names_it():
    built = settings.build(Outer, {"count": 2, "inner": {"mode": "b", "rate": 1, "names": ["x"]}})
    assert built == Outer(count=2, inner=Inner(mode="b", rate=1.0, names=["x"]))
    assert isinstance(built.inner.rate, float)  # an int widens to a float field
    with pytest.raises(
        ValueError,
        match=r"^unknown config key 'inner.speed' \(valid keys: inner.mode, inner.rate, inner.names\)$",
    ):
        settings.build(Outer, {"inner": {"speed": 1}})
    with pytest.raises(ConfigError, match=r"^unknown inner.mode 'c'; valid choices: a, b$"):
        settings.build(Outer, {"inner": {"mode": "c"}})
    with pytest.raises(ConfigError, match=r"^inner.names\[1\] must be a string, got None$"):
        settings.build(Outer, {"inner": {"names": ["x", None]}})
    with pytest.raises(ConfigError, match=r"^inner must be a mapping of keys, got 3$"):
        settings.build(Outer, {"inner": 3})
    with pytest.raises(ConfigError, match=r"^extra.x must be a finite number, got inf$"):
        settings.build(Outer, {"extra": {"x": float("inf")}})
    # a section's own error: prefixed with the section and the option it names; ours pass as they are
    with pytest.raises(ConfigError, match=r"^inner.rate: rate must be in \(0, 1\], got 2.0$"):
        settings.build(Outer, {"inner": {"rate": 2}})
    with pytest.raises(ConfigError, match=r"^count > 1 needs inner.mode=b$"):
        settings.build(Outer, {"count": 2})


def test_check_runs_the_same_checks_on_fields_set_by_hand():
    built = settings.build(Outer, {})
    assert settings.check(built) is built
    built.inner.mode = "c"  # type: ignore[assignment]
    with pytest.raises(ConfigError, match=r"unknown inner.mode 'c'"):
        settings.check(built)
    built.inner.mode, built.inner.rate = "a", 0.0
    with pytest.raises(ConfigError, match=r"^inner.rate: rate must be"):
        settings.check(built)
    built.inner.rate, built.count = 0.5, 2
    with pytest.raises(ConfigError, match=r"^count > 1"):
        settings.check(built)


def test_describe_lists_every_option_of_every_section():
    assert settings.describe(Outer) == [
        ("count", "1", "how many"),
        ("inner.mode", "a", "a choice"),
        ("inner.rate", "0.5", "a number in (0, 1]"),
        ("inner.names", "null", "optional names"),
        ("extra", "{}", "free options"),
    ]
