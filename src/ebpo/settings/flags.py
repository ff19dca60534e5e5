"""Flags generated from flat settings dataclasses (``ebpo simulate``, ``eval``, ``annotate``, ``base-model``,
and ``ebpo train``'s own switches).

:func:`dataclass_parser` makes every field a flag with ``transformers.HfArgumentParser``, as TRL's and
transformers' scripts do: ``--field-name`` (and ``--field_name``), its help with the default appended, more
spellings from ``metadata["aliases"]`` (``-G``, ``--judge-model``), choices from a ``Literal``, one or more
values for a ``list``, ``--flag`` / ``--flag false`` for a boolean (``--no-flag`` where asked for),
comma-separated values for a ``tuple[int, ...]`` (``--level-weights 1,2,3``; ``--run-on-digits=`` for none); a
dataclass with ``_argument_group_name`` gets its own ``--help`` section. ``--config FILE`` reads the same
options from a YAML file (checked as :func:`ebpo.settings.fields.build` checks), the flags given winning.
:func:`from_args` makes the parsed flags an instance.

HfArgumentParser for flags because ``transformers`` is installed already and TRL users know its flags; it
reads neither nested dataclasses nor dotted keys, hence :mod:`ebpo.settings.files` (docs/design.md, "CLI").
Importing it imports ``transformers`` (over a second), so it is imported when a parser is built, which
:func:`ebpo.settings.command.add_command` does only when that command runs: ``ebpo --help`` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import typing
from collections.abc import Callable, Sequence
from typing import Any

from ebpo.errors import ConfigError
from ebpo.settings.fields import check_value, nearest_key
from ebpo.settings.files import read_yaml


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
    by name checked as :func:`~ebpo.settings.fields.build` checks them (a key or value at fault is one usage
    error naming the file): its values become the defaults, which the flags given override."""

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
                    values[name] = check_value(value, hints[name], fields[name], name)
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
