"""A command of ``ebpo``: its parser built when it runs (:func:`add_command`), its plugins imported first, and
how to run this installation's ``ebpo`` again (:func:`command_prefix`). Imports the standard library (the
command's parser and :mod:`ebpo.plugins` when the command runs).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


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
    # the names resolved: loaded above, but for an abbreviation (--plugin), which only the command's parser
    # reads
    args.plugins = load_plugins(args.plugins)
    return run(args)
