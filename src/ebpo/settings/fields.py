"""The fields of settings dataclasses: declared with their bounds (:func:`option`), checked, built from nested
mappings, listed.

:func:`build` (a nested mapping becomes an instance) refuses unknown keys, all of them in one message, each
with the valid key nearest to it in any section (:func:`nearest_key`); it and :func:`check` (the same checks
on an instance changed by hand) refuse a value of the wrong type, outside its ``Literal`` or its bounds, not
finite or empty, naming its dotted key (:func:`check_value`); a ``__post_init__`` error becomes one
:class:`~ebpo.errors.ConfigError` naming the section. A ``Literal`` with the choices ``on`` and ``off`` reads
YAML's ``true`` / ``false`` as them (YAML 1.1 reads the words ``on`` and ``off`` as booleans).
:func:`describe` lists every key with its default and help (``ebpo train --help-config``). Imports the
standard library (PyYAML when it describes).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from ebpo.errors import ConfigError


def is_section(tp: Any) -> bool:
    """Whether the annotation ``tp`` is a dataclass: a section of options."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def field_default(f: dataclasses.Field) -> Any:
    """The default value of a dataclass field (its ``default_factory`` called)."""
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def coerce(value: Any, tp: Any, key: str) -> Any:
    """``value`` as the annotation ``tp`` asks (an int widens to a float; a number or text to a string; a
    string like ``1e-3``, which YAML 1.1 leaves a string, to a float), or ``ConfigError`` naming ``key``:
    a wrong type, a choice outside a ``Literal``, a number that is not finite (in lists and mappings too)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce(value, option, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{key}: bad value {value!r}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if isinstance(value, bool) and {"on", "off"} <= set(choices):
            value = "on" if value else "off"  # YAML 1.1 reads the words on and off as booleans
        if any(value == choice and type(value) is type(choice) for choice in choices):  # True is not 1
            return value
        raise ConfigError(f"unknown {key} {value!r}; valid choices: {', '.join(sorted(map(str, choices)))}")
    if tp is Any:
        return _finite(value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if tp is float:
        number = value
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if isinstance(number, (int, float)) and not isinstance(number, bool):
            return _finite(float(number), key)
        raise ConfigError(f"{key} must be a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key} must be a string, got {value!r}")
    if origin is dict or tp is dict:
        if isinstance(value, dict):
            return {name: _finite(item, f"{key}.{name}") for name, item in value.items()}
        raise ConfigError(f"{key} must be a mapping like {{name: value}}, got {value!r}")
    if origin is list or (origin is tuple and typing.get_args(tp)[1:] == (Ellipsis,)):
        if isinstance(value, (list, tuple)):
            item_tp = typing.get_args(tp)[0]
            items = [coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
            return items if origin is list else tuple(items)
        raise ConfigError(f"{key} must be a list like [a, b], got {value!r}")
    raise ConfigError(f"{key}: unsupported type {tp}")  # pragma: no cover - a field type not handled above


def _finite(value: Any, key: str) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number, got {value}")
    return value


def option(
    help: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    note: str = "",
    **kwargs: Any,
) -> Any:
    """A dataclass field with its ``help`` and the bounds its value keeps: ``ge`` (>=), ``gt`` (>), ``le``
    (<=), checked with the option's dotted key by :func:`build` and :func:`check` (``run.seed must be in
    [0, 4294967295], got -1``; ``note`` adds what the bound means: ``0 = off``). ``kwargs`` go to
    ``dataclasses.field`` (``default``, ``default_factory``)."""
    bounds = {name: bound for name, bound in (("ge", ge), ("gt", gt), ("le", le)) if bound is not None}
    return dataclasses.field(metadata={"help": help, **bounds, "note": note}, **kwargs)


def _within_bounds(value: Any, f: dataclasses.Field, key: str) -> None:
    """``ConfigError`` unless the number ``value`` keeps the bounds :func:`option` declared for ``f``."""
    ge, gt, le = (f.metadata.get(name) for name in ("ge", "gt", "le"))
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    if (ge is None or value >= ge) and (gt is None or value > gt) and (le is None or value <= le):
        return
    low = f"[{ge}" if ge is not None else f"({gt}" if gt is not None else None
    bound = (
        f"in {low}, {le}]"
        if low is not None and le is not None
        else f">= {ge}"
        if ge is not None
        else f"> {gt}"
    )
    bound = f"<= {le}" if low is None else bound
    note = f" ({f.metadata['note']})" if f.metadata.get("note") else ""
    raise ConfigError(f"{key} must be {bound}{note}, got {value}")


def check_value(value: Any, tp: Any, f: dataclasses.Field, key: str) -> Any:
    """One option's value checked (:func:`coerce`, the bounds of :func:`option`); an empty string is refused
    naming the default (``path=`` would otherwise mean the current directory)."""
    if value == "":
        optional = type(None) in typing.get_args(tp)
        fix = f", or {key}=null for the default" if optional else f" (default {field_default(f)!r})"
        raise ConfigError(f"{key} is empty; set a value{fix}")
    value = coerce(value, tp, key)
    _within_bounds(value, f, key)
    return value


def _post_init_error(err: Exception, prefix: str) -> ConfigError:
    """A section's ``__post_init__`` error as one ``ConfigError``: ours pass as they are (they name their key);
    another's (``EBPOOptions``, ``PolicyLossOptions``) is prefixed with the section, and with the option when
    the error names it (an ``option`` attribute)."""
    if isinstance(err, ConfigError):
        return err
    option = getattr(err, "option", None)
    where = f"{prefix}{option}" if option else prefix.rstrip(".")
    return ConfigError(f"{where}: {err}")


def build(cls: type, values: Any, prefix: str = "") -> Any:
    """An instance of the dataclass ``cls`` from the nested mapping ``values`` (missing keys keep their
    defaults), every key and value checked; ``ConfigError`` names the first one at fault."""
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'the config'} must be a mapping of keys, got {values!r}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = unknown_keys(cls, values, prefix)
    if unknown:
        raise ConfigError(unknown_keys_message(unknown))
    kwargs = {}
    for key, value in values.items():
        full = f"{prefix}{key}"
        tp = hints[key]
        kwargs[key] = (
            build(tp, value, f"{full}.") if is_section(tp) else check_value(value, tp, fields[key], full)
        )
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as err:
        raise _post_init_error(err, prefix) from None


def _keys(cls: type, prefix: str = "") -> Iterator[str]:
    """Every dotted key of the dataclass ``cls``, sections included (``algorithm``, ``algorithm.ebpo``)."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if f.init:
            yield f"{prefix}{f.name}"
            if is_section(hints[f.name]):
                yield from _keys(hints[f.name], f"{prefix}{f.name}.")


def nearest_key(key: str, valid: Sequence[str]) -> str | None:
    """The valid dotted key ``key`` most likely meant, searched across sections: the one with the same last
    part (``algorithm.group_size`` -> ``data.group_size``), else the one whose last part is closest
    (``difflib``, ratio 0.75 or more; ``rollout.temprature`` -> ``rollout.temperature``), one in ``key``'s
    own section winning a tie; None when none is close."""
    import difflib

    section, _, name = key.rpartition(".")
    best: tuple[float, bool, str] | None = None
    for candidate in valid:
        other_section, _, other = candidate.rpartition(".")
        score = 1.0 if other == name else difflib.SequenceMatcher(None, name, other).ratio()
        ranked = (score, other_section == section, candidate)
        if score >= 0.75 and (best is None or ranked[:2] > best[:2]):
            best = ranked
    return None if best is None else best[2]


def unknown_keys(cls: type, values: Any, prefix: str = "", root: type | None = None) -> list[str]:
    """A line for each key of the nested mapping ``values`` that the dataclass ``cls`` does not have, at any
    depth: the dotted key and the valid key nearest to it (:func:`nearest_key`, searched over every key of
    ``root``, default ``cls``), or, when none is close, the valid keys of its section."""
    root = cls if root is None else root
    if not isinstance(values, dict):
        return []
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    found = []
    for key, value in values.items():
        full = f"{prefix}{key}"
        if key not in fields:
            near = nearest_key(full, list(_keys(root)))
            hint = (
                f"did you mean {near!r}?" if near else f"valid keys: {', '.join(prefix + n for n in fields)}"
            )
            found.append(f"{full!r} ({hint})")
        elif is_section(hints[key]):
            found.extend(unknown_keys(hints[key], value, f"{full}.", root))
    return found


def unknown_keys_message(found: Sequence[str]) -> str:
    """:func:`unknown_keys`'s lines as one message, every unknown key in it."""
    if len(found) == 1:
        return f"unknown config key {found[0]}"
    return f"{len(found)} unknown config keys: {'; '.join(found)}"


def check(obj: Any, prefix: str = "") -> Any:
    """Run :func:`build`'s checks on the instance ``obj`` as it is now (its fields may have been set by hand):
    every value against its type, then each section's ``__post_init__``, innermost first; returns ``obj``."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        value, full = getattr(obj, f.name), f"{prefix}{f.name}"
        if is_section(hints[f.name]):
            check(value, f"{full}.")
        else:
            check_value(value, hints[f.name], f, full)
    post_init = getattr(obj, "__post_init__", None)
    if post_init is not None:
        try:
            post_init()
        except (ValueError, TypeError) as err:
            raise _post_init_error(err, prefix) from None
    return obj


def leaves(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field]]:
    """(dotted key, field) of every option of the dataclass ``cls``, sections walked in declaration order."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if is_section(hints[f.name]):
            yield from leaves(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f


def describe(cls: type) -> list[tuple[str, str, str]]:
    """(dotted key, default, help) of every option of ``cls`` (``ebpo train --help-config``), the default
    written as a ``key=value`` override or a YAML file takes it (``null``, ``false``, ``[0.9, 0.999]``)."""
    import yaml

    def as_yaml(value: Any) -> str:
        return yaml.safe_dump(value, default_flow_style=True).removesuffix("...\n").strip()

    return [(key, as_yaml(field_default(f)), f.metadata.get("help", "")) for key, f in leaves(cls)]
