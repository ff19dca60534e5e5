"""Settings dataclasses, declared once, read from YAML files, dotted ``key=value`` overrides and flags.

A settings dataclass declares each option once: its type (``Literal[...]`` for a fixed set of choices), its
default, ``metadata["help"]`` and, through :func:`option`, the bounds its value keeps. A field whose type is
itself a dataclass is a section, so sections nest (``TrainConfig.algorithm.ebpo``). How options combine is
checked in the dataclass's own ``__post_init__``, whose ``ValueError`` says the fix. This module reads such
dataclasses from what a user types, for every command:

- **YAML and dotted overrides** (``ebpo train --config grpo rollout.temperature=0.8``): :func:`read_yaml` (a
  key repeated in one mapping is an error), :func:`parse_override` (``a.b=0.8``; the value is YAML: ``true``,
  ``null``, ``[1, 2]``, ``{k: v}``), :func:`merge` (mappings, then overrides, the later winning, keys renamed
  from earlier spellings first) and :func:`build` (the mapping becomes an instance). :func:`build` refuses
  unknown keys, all of them in one message, each with the valid key nearest to it in any section
  (:func:`nearest_key`); it and :func:`check` (the same checks on an instance changed by hand) refuse a value of the wrong type, outside its ``Literal`` or its bounds, not finite or empty, naming its
  dotted key; a ``__post_init__`` error becomes one :class:`~ebpo.errors.ConfigError` naming the section. A
  ``Literal`` with the choices ``on`` and ``off`` reads YAML's ``true`` / ``false`` as them (YAML 1.1 reads the
  words ``on`` and ``off`` as booleans).
  :func:`describe` lists every key with its default and help (``ebpo train --help-config``).
- **Flags** (``ebpo simulate``, ``eval``, ``annotate``, ``base-model``, and ``ebpo train``'s own switches):
  :func:`dataclass_parser` makes every field of flat dataclasses a flag with ``transformers.HfArgumentParser``,
  as TRL's and transformers' scripts do: ``--field-name`` (and ``--field_name``), its help with the default
  appended, more spellings from ``metadata["aliases"]`` (``-G``, ``--judge-model``), choices from a
  ``Literal``, one or more values for a ``list``, ``--flag`` / ``--flag false`` for a boolean (``--no-flag``
  where asked for), comma-separated values for a ``tuple[int, ...]`` (``--level-weights 1,2,3``;
  ``--run-on-digits=`` for none); a dataclass with ``_argument_group_name`` gets its own ``--help`` section.
  ``--config FILE`` reads the same options from a YAML file (checked as :func:`build` checks), the flags
  given winning.

HfArgumentParser for flags because ``transformers`` is installed already and TRL users know its flags; it reads
neither nested dataclasses nor dotted keys, hence the rest here (docs/design.md, "CLI"). Importing it imports
``transformers`` (over a second), so :func:`add_command` builds a command's parser only when that command
runs: ``ebpo --help`` stays fast. Otherwise this module imports the standard library (PyYAML when it reads).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from ebpo.errors import ConfigError

# ---------------------------------------------------------------------------------------------------
# YAML files and dotted overrides


def _unique_key_loader() -> Any:
    """A ``yaml.SafeLoader`` subclass that rejects a mapping holding the same key twice (PyYAML keeps the
    last one silently, so a preset that sets ``optim.lr`` twice would train with whichever came second)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        pass

    def construct_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node)
            if key in first_line:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} appears twice in one mapping (lines {first_line[key] + 1} and "
                    f"{key_node.start_mark.line + 1}); keep one",
                    key_node.start_mark,
                )
            first_line[key] = key_node.start_mark.line
        return loader.construct_mapping(node)

    UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return UniqueKeyLoader


def parse_yaml(text: str) -> Any:
    """``text`` parsed as YAML with the safe loader, a key repeated within one mapping being an error
    (``yaml.YAMLError``)."""
    import yaml

    return yaml.load(text, Loader=_unique_key_loader())  # noqa: S506 - a SafeLoader subclass


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping in the YAML file ``path``; a missing file, invalid YAML, a repeated key or a top level
    that is not a mapping raise ``ConfigError`` naming the file."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        values = parse_yaml(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from err
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys")
    return values


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"a.b=0.8"`` -> (["a", "b"], 0.8); the value is parsed as a YAML scalar or flow collection (an empty
    value is the empty string, which :func:`build` refuses naming the key)."""
    import yaml

    if "=" not in item:
        raise ConfigError(f"override {item!r} is not key=value (e.g. algorithm.estimator=grpo)")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r} has an empty key part (e.g. algorithm.estimator=grpo)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def merge_dicts(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``extra``, recursively where both hold a dict at the same key; a new mapping that
    shares nothing with either (neither is changed, now or when the result is)."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_dicts(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def rename_keys(values: dict[str, Any], renames: Mapping[str, str]) -> dict[str, Any]:
    """``values`` with each dotted key ``old`` of ``renames`` moved to its new spelling (``{"a.x": "a.y"}``:
    ``{"a": {"x": {...}}}`` -> ``{"a": {"y": {...}}}``). Where one mapping holds both spellings, their
    contents merge; an option given under both is a ``ConfigError`` (it would be ambiguous which wins)."""
    out = copy.deepcopy(values)
    for old, new in renames.items():
        *old_parent, old_leaf = old.split(".")
        parent = _node(out, old_parent)
        if parent is None or old_leaf not in parent:
            continue
        moved = parent.pop(old_leaf)
        *new_parent, new_leaf = new.split(".")
        target = _node(out, new_parent, create=True)
        assert target is not None  # created
        if new_leaf not in target:
            target[new_leaf] = moved
            continue
        present = target[new_leaf]
        both = (
            sorted(set(moved) & set(present))
            if isinstance(moved, dict) and isinstance(present, dict)
            else [""]
        )
        if both:
            where = f".{both[0]}" if both[0] else ""
            raise ConfigError(f"{old}{where} and {new}{where} are one key given twice; keep {new}{where}")
        target[new_leaf] = {**present, **moved}
    return out


def _node(values: dict[str, Any], path: Sequence[str], *, create: bool = False) -> dict[str, Any] | None:
    """The mapping at ``path`` in ``values`` (made, replacing anything that is not a mapping, if ``create``)."""
    node = values
    for part in path:
        child = node.get(part)
        if not isinstance(child, dict):
            if not create:
                return None
            child = {}
            node[part] = child
        node = child
    return node


def apply_overrides(
    values: dict[str, Any], overrides: Sequence[str], renames: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Set each ``key=value`` of ``overrides`` in the nested mapping ``values``, in order (changed in place and
    returned). A key is renamed from its old spelling first (``renames``, as :func:`rename_keys`); a value
    replaces what was at its key, a mapping included (``algorithm.loss={clip_eps_high: 0.28}`` sets that one
    option, the others return to their defaults)."""
    renames = dict(renames or {})
    for item in overrides:
        path, value = parse_override(item)
        dotted = ".".join(path)
        for old, new in renames.items():
            if dotted == old or dotted.startswith(old + "."):
                path = new.split(".") + path[len(old.split(".")) :]
        if isinstance(value, dict):  # a mapping may hold old spellings below its key
            wrapped: dict[str, Any] = {}
            node = _node(wrapped, path[:-1], create=True)
            assert node is not None  # created
            node[path[-1]] = value
            value = _node(rename_keys(wrapped, renames), path[:-1])[path[-1]]  # type: ignore[index]
        node = _node(values, path[:-1], create=True)
        assert node is not None  # created
        node[path[-1]] = value
    return values


def merge(
    layers: Sequence[dict[str, Any]],
    overrides: Sequence[str] = (),
    renames: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The nested mappings of ``layers`` merged in order (a later one wins, mappings merging key by key),
    then ``overrides`` applied (:func:`apply_overrides`); each layer and override has its keys renamed from
    their old spellings (``renames``) before it is merged, so that the later one wins whichever spelling
    each uses."""
    values: dict[str, Any] = {}
    for layer in layers:
        values = merge_dicts(values, rename_keys(layer, renames or {}))  # a copy: the layers stay as they are
    return apply_overrides(values, overrides, renames)


# ---------------------------------------------------------------------------------------------------
# mappings -> checked dataclass instances


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


def _leaf(value: Any, tp: Any, f: dataclasses.Field, key: str) -> Any:
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
        kwargs[key] = build(tp, value, f"{full}.") if is_section(tp) else _leaf(value, tp, fields[key], full)
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
            _leaf(value, hints[f.name], f, full)
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


# ---------------------------------------------------------------------------------------------------
# flags


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Help of each flag with ``(default X)`` appended, unless it states its default itself or the default is
    ``None``, ``False`` or empty (nothing to show); a tuple default is shown as the flag takes it
    (``1,16``); a ``%`` in a help text is printed as it is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = re.sub(r"%(?!\()", "%%", action.help or "")
        default = action.default
        nothing = any(default is d for d in (None, False, argparse.SUPPRESS)) or default in ((), [])
        if action.option_strings and not nothing and "%(default)" not in text:
            shown = ",".join(map(str, default)) if isinstance(default, tuple) else "%(default)s"
            text += f" (default {shown.replace('%', '%%') if isinstance(default, tuple) else shown})"
        return text


class RawDescriptionDefaultsHelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultsHelpFormatter):
    """:class:`DefaultsHelpFormatter` that prints the description as written (examples, one per line)."""


def comma_tuple(kind: type) -> Callable[[str], tuple]:
    """Parser of a flag value ``"1,2,3"`` into a tuple of ``kind``; the empty string is the empty tuple."""

    def parse(text: str) -> tuple:
        if not text.strip():
            return ()
        try:
            return tuple(kind(part) for part in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {kind.__name__}s, got {text!r}"
            ) from None

    return parse


def dataclass_parser(
    prog: str,
    description: str,
    types: Sequence[Any],
    *,
    negatable: Sequence[str] = (),
    switches: Sequence[str] = (),
    raw_description: bool = False,
) -> argparse.ArgumentParser:
    """An ``HfArgumentParser`` with one flag per field of ``types`` (see the module docstring), plus
    ``--no-<name>`` for each field named in ``negatable``: a boolean's false, or the choice ``off`` of a
    ``Literal`` that has one.

    ``switches``: boolean fields whose flag takes no value (``--quiet``, not ``--quiet false``), for a command
    with positional arguments: HfArgumentParser's boolean flag takes an optional value, so it would read the
    positional word after it (``--quiet model_dir``) as its own."""
    from transformers import HfArgumentParser

    fields = {f.name: f for cls in types for f in dataclasses.fields(cls) if f.init}
    _check_unique_flags(fields.values(), negatable)
    formatter = RawDescriptionDefaultsHelpFormatter if raw_description else DefaultsHelpFormatter
    reads_file = "config" not in fields  # ebpo train's --config is its own (a TrainConfig preset)
    hints = {name: tp for cls in types for name, tp in typing.get_type_hints(cls).items()}
    parser_class = _with_config_file(HfArgumentParser, fields, hints) if reads_file else HfArgumentParser
    # "resolve": a switch below replaces the flag HfArgumentParser made for its field (no other flag can
    # clash: _check_unique_flags)
    parser = parser_class(
        list(types), prog=prog, description=description, formatter_class=formatter, conflict_handler="resolve"
    )
    for cls in types:
        for hint in typing.get_type_hints(cls).values():
            args = typing.get_args(hint)
            if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
                parser.register("type", hint, comma_tuple(args[0]))  # argparse looks types up here first
    for name in switches:
        parser.add_argument(
            *_spellings(name), dest=name, action="store_true", help=fields[name].metadata["help"]
        )
    for name in negatable:
        flag = name.replace("_", "-")
        parser.add_argument(
            f"--no-{flag}",
            dest=name,
            action="store_const",
            const="off" if "off" in typing.get_args(hints[name]) else False,
            default=argparse.SUPPRESS,  # the field's own flag sets the default
            help=f"the opposite of --{flag}",
        )
    if reads_file:
        parser.add_argument(
            "--config",
            metavar="FILE",
            dest=CONFIG_FILE,
            help="read options from a YAML file, one key per flag (max_new_tokens: 64, as --max-new-tokens 64); "
            "flags on the command line win",
        )
    return parser


CONFIG_FILE = "config_file"
"""Where ``--config FILE`` lands in the parsed flags."""


def _with_config_file(
    parser_class: type, fields: dict[str, dataclasses.Field], hints: dict[str, Any]
) -> type:
    """``parser_class`` whose ``parse_known_args`` first reads ``--config FILE``, a YAML mapping of ``fields``
    by name checked as :func:`build` checks them (a key or value at fault is one usage error naming the
    file): its values become the defaults, which the flags given override."""

    class ConfigFileParser(parser_class):
        def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
            words = [str(word) for word in (sys.argv[1:] if args is None else args)]
            path = next(
                (words[i + 1] for i, word in enumerate(words[:-1]) if word == "--config"),
                next((word.split("=", 1)[1] for word in words if word.startswith("--config=")), None),
            )
            if path is not None:
                try:
                    given = vars(namespace) if namespace is not None else {}
                    namespace = argparse.Namespace(**{**self.file_defaults(path), **given})
                except ConfigError as err:
                    self.error(str(err))
            return super().parse_known_args(words, namespace)

        def file_defaults(self, path: str) -> dict[str, Any]:
            values, read = {}, read_yaml(path)
            unknown = []
            for key in read:
                name = str(key).replace("-", "_")
                if name not in fields:
                    near = nearest_key(name, sorted(fields))
                    hint = f"did you mean {near!r}?" if near else f"valid keys: {', '.join(sorted(fields))}"
                    unknown.append(f"{key!r} ({hint})")
            if unknown:
                many = f"{len(unknown)} unknown keys: " if len(unknown) > 1 else "unknown key "
                raise ConfigError(f"{path}: {many}{'; '.join(unknown)}")
            for key, value in read.items():
                name = str(key).replace("-", "_")
                try:
                    values[name] = _leaf(value, hints[name], fields[name], name)
                except ConfigError as err:
                    raise ConfigError(f"{path}: {err}") from None
            return values

    return ConfigFileParser


def _spellings(name: str) -> list[str]:
    """The long flags HfArgumentParser makes for a field: ``--field_name`` and ``--field-name``."""
    return list(dict.fromkeys([f"--{name}", f"--{name.replace('_', '-')}"]))


def _check_unique_flags(fields: Any, negatable: Sequence[str]) -> None:
    """ValueError if two fields (or a field and a ``--no-<name>`` flag) would share a flag."""
    seen: dict[str, str] = {}
    for f in fields:
        aliases = f.metadata.get("aliases", [])
        for flag in [*_spellings(f.name), *([aliases] if isinstance(aliases, str) else aliases)]:
            if seen.setdefault(flag, f.name) != f.name:
                raise ValueError(f"flag {flag} is declared by both {seen[flag]} and {f.name}")
    for name in negatable:
        flag = f"--no-{name.replace('_', '-')}"
        if flag in seen:
            raise ValueError(f"flag {flag} is declared by both {seen[flag]} and --no-{name}")


def from_args(cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """An instance of the dataclass ``cls`` from the parsed flags of its fields, ``overrides`` replacing some."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.init} | overrides)


def add_command(
    subparsers: Any,
    name: str,
    *,
    help: str,
    parser: Callable[..., argparse.ArgumentParser],
    run: Callable[[argparse.Namespace], int],
    parser_reads_words: bool = False,
) -> None:
    """Add the command ``name``, whose parser ``parser(prog)`` is built only when the command runs.

    The entry in ``subparsers`` takes every remaining word as it is (no character starts a flag there) and
    hands them to the real parser, which prints the command's ``--help`` and its errors. Every command takes
    ``--plugins NAME`` (:mod:`ebpo.plugins`): the plugins are imported before the parser is built, so that
    nothing checks a name before a plugin could register it; a plugin that fails is one line on stderr and
    exit code 2. ``run`` gets the parsed flags (``plugins``: the names given, resolved). With
    ``parser_reads_words`` the parser is ``parser(prog, words)``: a command whose flags depend on one of them
    (``ebpo base-model --recipe gym`` takes the gym recipe's fields).
    """
    command = subparsers.add_parser(name, help=help, add_help=False, prefix_chars="\0")
    command.add_argument("words", nargs="*", help=argparse.SUPPRESS)

    def start(args: argparse.Namespace) -> int:
        build = (lambda prog: parser(prog, args.words)) if parser_reads_words else parser
        return _start(command.prog, build, run, args.words)

    command.set_defaults(func=start)


def command_prefix() -> str:
    """How to run this installation's ``ebpo`` again from the shell the user is in, for the commands a message
    prints (``continue with `ebpo train --resume ...```): ``ebpo`` when the ``PATH`` finds this installation's
    command (an activated virtual environment), else that command's path (``.venv/bin/ebpo``, relative to
    the working directory when inside it), else ``python -m ebpo.cli`` with this interpreter."""
    import os
    import shlex
    import shutil

    here = Path(sys.executable).parent / "ebpo"
    found = shutil.which("ebpo")
    if here.is_file():
        if found is not None and Path(found).resolve() == here.resolve():
            return "ebpo"
        try:
            shown = os.path.relpath(here) if here.absolute().is_relative_to(Path.cwd()) else str(here)
        except ValueError:  # another drive (Windows)
            shown = str(here)
        return shlex.quote(shown)
    return f"{shlex.quote(sys.executable)} -m ebpo.cli"


def _plugins_flag(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` with the flags every command takes: ``--plugins NAME`` (repeatable, comma-separated) and
    ``--debug`` (:mod:`ebpo.console`)."""
    from ebpo.plugins import HELP

    parser.add_argument("--plugins", action="append", default=[], metavar="NAME", help=HELP)
    parser.add_argument(
        "--debug",
        action="store_true",
        help="show the traceback behind a one-line error (on stderr, before the line; also EBPO_DEBUG=1)",
    )
    return parser


def _start(
    prog: str,
    parser: Callable[[str], argparse.ArgumentParser],
    run: Callable[[argparse.Namespace], int],
    words: list[str],
) -> int:
    """Import the plugins (entry points and ``--plugins``), then parse ``words`` with the command's parser and
    run it."""
    from ebpo import console
    from ebpo.plugins import PluginError, load_plugins

    named, _ = _plugins_flag(argparse.ArgumentParser(add_help=False, allow_abbrev=False)).parse_known_args(
        words
    )
    if named.debug:
        console.set_debug(True)
    try:
        load_plugins(named.plugins)
    except PluginError as err:
        console.show_traceback(err)
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    args = _plugins_flag(parser(prog)).parse_args(words)
    args.plugins = load_plugins(args.plugins)  # loaded above: the names resolved
    return run(args)
