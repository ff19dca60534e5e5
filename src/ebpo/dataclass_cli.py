"""Command lines generated from settings dataclasses by ``transformers.HfArgumentParser``.

Every field of the dataclasses a command reads becomes a flag, as in TRL's and transformers' own scripts:
``--field-name`` (and ``--field_name``), its help from ``metadata["help"]`` with the default appended, more
spellings from ``metadata["aliases"]`` (``-G``, ``--judge-model``), choices from a ``Literal`` type, one or
more values for a ``list`` field, and ``--flag`` / ``--flag false`` for a boolean (``--no-flag`` too where
the command asks for it). A ``tuple[int, ...]`` or ``tuple[float, ...]`` field takes comma-separated values
(``--level-weights 1,2,3``; ``--run-on-digits=`` for none). A dataclass with a class attribute
``_argument_group_name`` gets its own section in ``--help``.

HfArgumentParser was chosen over a library of its own kind (simple-parsing, tyro, jsonargparse) because
``transformers`` is installed already and TRL users know its flags. Importing it imports ``transformers``
(over a second), so :func:`add_command` builds a command's parser only when that command runs:
``ebpo --help`` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from collections.abc import Callable, Sequence
from typing import Any


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
    ``--no-<name>`` for each boolean field named in ``negatable``.

    ``switches``: boolean fields whose flag takes no value (``--quiet``, not ``--quiet false``), for a command
    with positional arguments: HfArgumentParser's boolean flag takes an optional value, so it would read the
    positional word after it (``--quiet model_dir``) as its own."""
    from transformers import HfArgumentParser

    fields = {f.name: f for cls in types for f in dataclasses.fields(cls) if f.init}
    _check_unique_flags(fields.values(), negatable)
    formatter = RawDescriptionDefaultsHelpFormatter if raw_description else DefaultsHelpFormatter
    # "resolve": a switch below replaces the flag HfArgumentParser made for its field (no other flag can
    # clash: _check_unique_flags)
    parser = HfArgumentParser(
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
            action="store_false",
            default=argparse.SUPPRESS,  # the field's own flag sets the default
            help=f"the opposite of --{flag}",
        )
    return parser


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
    parser: Callable[[str], argparse.ArgumentParser],
    run: Callable[[argparse.Namespace], int],
) -> None:
    """Add the command ``name``, whose parser ``parser(prog)`` is built only when the command runs.

    The entry in ``subparsers`` takes every remaining word as it is (no character starts a flag there) and
    hands them to the real parser, which prints the command's ``--help`` and its errors. ``run`` gets the
    parsed flags.
    """
    command = subparsers.add_parser(name, help=help, add_help=False, prefix_chars="\0")
    command.add_argument("words", nargs="*", help=argparse.SUPPRESS)
    command.set_defaults(func=lambda args: run(parser(command.prog).parse_args(args.words)))
