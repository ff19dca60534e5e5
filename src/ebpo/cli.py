"""The ``ebpo`` command line.

Each subcommand lives in its own module, which exposes ``add_parser(subparsers)``: it adds one
``argparse`` sub-parser, documents every flag (``--help``), and sets ``func`` to the function that runs
it. Modules keep heavy imports (transformers, datasets) inside their run functions so that ``ebpo --help``
stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module that defines add_parser(subparsers)
SUBCOMMANDS: dict[str, str] = {
    "simulate": "ebpo.simulate",
    "diagnose": "ebpo.diagnostics.cli",
    "base-model": "ebpo.models.cli",
    "train": "ebpo.trainer.cli",
    "eval": "ebpo.eval.cli",
    "annotate": "ebpo.annotate.cli",
}


def build_parser() -> argparse.ArgumentParser:
    from ebpo import __version__

    parser = argparse.ArgumentParser(
        prog="ebpo",
        description="Empirical Bayes Policy Optimization (EBPO) for RL with verifiable rewards.",
    )
    parser.add_argument("--version", action="version", version=f"ebpo {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMANDS.values():
        importlib.import_module(module_name).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 0 if args.command is None else 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
