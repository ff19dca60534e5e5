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
    ``None`` or ``False`` (nothing to show); a ``%`` in a help text is printed as it is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = re.sub(r"%(?!\()", "%%", action.help or "")
        shown = action.option_strings and not any(
            action.default is d for d in (None, False, argparse.SUPPRESS)
        )
        if shown and "%(default)" not in text:
            text += " (default %(default)s)"
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
    raw_description: bool = False,
) -> argparse.ArgumentParser:
    """An ``HfArgumentParser`` with one flag per field of ``types`` (see the module docstring), plus
    ``--no-<name>`` for each boolean field named in ``negatable``."""
    from transformers import HfArgumentParser

    formatter = RawDescriptionDefaultsHelpFormatter if raw_description else DefaultsHelpFormatter
    parser = HfArgumentParser(list(types), prog=prog, description=description, formatter_class=formatter)
    for cls in types:
        for hint in typing.get_type_hints(cls).values():
            args = typing.get_args(hint)
            if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
                parser.register("type", hint, comma_tuple(args[0]))  # argparse looks types up here first
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
