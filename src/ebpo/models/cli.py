"""``ebpo base-model``: show, build or verify a base model: S1, the ``arith`` model ``ebpo train`` starts from,
or with ``--recipe gym`` S2, the Qwen3 chat model of reasoning-gym tasks.

ebpo base-model                      # the default recipe: the shipped model's directory (no training)
ebpo base-model --grid test          # ... and its pass@1 / maj@8 / greedy grid on test problems
ebpo base-model --check              # rebuild the default recipe in full, compare bit for bit
ebpo base-model --steps 3000 --hidden-size 128   # another recipe: built once into the cache
ebpo base-model --force --out src/ebpo/models/arith_base   # (maintainers) rebuild the shipped model
ebpo base-model --recipe gym --grid test         # S2 (its flags: ebpo base-model --recipe gym --help)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ebpo.models.recipes.arith import BaseModelConfig
from ebpo.settings import add_command, dataclass_parser, from_args


@dataclass
class BaseModelCommand:
    """What ``ebpo base-model`` does with the recipe (the recipe itself is :class:`BaseModelConfig`, or the
    ``--recipe``'s config class)."""

    recipe: str = field(
        default="arith",
        metadata={
            "help": "which base model: arith (S1, the built-in model of ebpo train) or gym (S2, a Qwen3 chat model "
            "of reasoning-gym tasks; its recipe's flags replace S1's: --recipe gym --help lists them)"
        },
    )
    force: bool = field(default=False, metadata={"help": "build even if a build of this recipe exists"})
    check: bool = field(
        default=False,
        metadata={
            "help": "rebuild the recipe in full (its whole SFT run on one core: docs/base_model.md gives the time) and compare every tensor with the "
            "shipped model; exit 1 on any difference"
        },
    )
    grid: Literal["validation", "test"] | None = field(
        default=None,
        metadata={
            "help": "also measure the pass@1 / maj@n / greedy grid of the model on this split (eval_per_cell "
            "problems per cell, eval_samples samples each)"
        },
    )
    grid_samples: int | None = field(
        default=None,
        metadata={
            "metavar": "N",
            "help": "samples per problem of --grid only (default: the recipe's eval_samples); the recipe and "
            "its key are unchanged. A large N (64) estimates the majority answer's limit: how often the "
            "model's most likely answer is right",
        },
    )
    grid_temperature: float | None = field(
        default=None,
        metadata={
            "metavar": "T",
            "help": "sampling temperature of --grid only (default: the recipe's eval_temperature); the recipe "
            "and its key are unchanged. T > 1 measures the model as if its logits were divided by T",
        },
    )
    out: str | None = field(
        default=None, metadata={"help": "build into this directory instead of the cache (implies a build)"}
    )
    cache_dir: str | None = field(
        default=None,
        metadata={"help": "cache root (default: $EBPO_CACHE or ~/.cache/ebpo); builds go in base_models/"},
    )
    quiet: bool = field(default=False, metadata={"help": "no progress bars or tables; print only the path"})


def _recipe_named(words: list[str]) -> str:
    """The ``--recipe`` the words give (``arith`` when none); the full parser checks the rest."""
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--recipe", default="arith")
    return first.parse_known_args(words)[0].recipe


def _parser(prog: str, words: list[str]) -> argparse.ArgumentParser:
    from ebpo.models.recipes import RECIPES

    name = _recipe_named(words)
    config_cls = RECIPES.get(name).config_cls if name in RECIPES else BaseModelConfig  # run() names a bad one
    return dataclass_parser(
        prog,
        __doc__ or "",
        [BaseModelCommand, config_cls],
        negatable=["near_miss_digit_slips"] if config_cls is BaseModelConfig else [],
        raw_description=True,
    )


def add_parser(subparsers: Any) -> None:
    """``ebpo base-model``: one flag per :class:`BaseModelCommand` field and per field of the ``--recipe``'s config
    (:class:`BaseModelConfig` for ``arith``)."""
    add_command(
        subparsers,
        "base-model",
        help="show, build or verify a base model: arith (S1) or gym (S2); the defaults ship with the package",
        parser=_parser,
        run=run,
        parser_reads_words=True,
    )


def run(args: argparse.Namespace) -> int:
    from ebpo.console import show_traceback
    from ebpo.models.build import build_base_model, check_base_model, load_build_info
    from ebpo.models.recipes import RECIPES

    try:
        config = from_args(RECIPES.get(args.recipe).config_cls, args)
    except ValueError as err:  # a recipe that cannot be built: one line naming the field
        show_traceback(err)
        print(f"ebpo base-model: error: {err}", file=sys.stderr)
        return 2
    if args.grid_samples is not None and args.grid_samples < 1:
        print(
            f"ebpo base-model: error: --grid-samples must be >= 1, got {args.grid_samples}", file=sys.stderr
        )
        return 2
    if args.grid_temperature is not None and not args.grid_temperature > 0:
        print(
            f"ebpo base-model: error: --grid-temperature must be > 0, got {args.grid_temperature}",
            file=sys.stderr,
        )
        return 2
    if args.check:
        problems, notes = check_base_model(config, progress=not args.quiet)
        if problems:
            print("ebpo base-model --check: the rebuild differs from the shipped model:")
            for line in problems + notes:
                print(f"  - {line}")
            return 1
        if notes:
            print(
                "ebpo base-model --check: the recipe is the shipped one (this machine cannot rebuild its bits):"
            )
            for line in notes:
                print(f"  - {line}")
            return 0
        print("ebpo base-model --check: the rebuild equals the shipped model bit for bit")
        return 0
    path = build_base_model(
        config,
        force=args.force,
        progress=not args.quiet,
        cache_dir=args.cache_dir,
        out_dir=args.out,
        portable=args.out is not None,
    )
    if args.grid and not args.quiet:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from ebpo.models.build import measure_grid

        torch.set_num_threads(1)
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
        measured = replace(
            config,
            eval_samples=config.eval_samples if args.grid_samples is None else args.grid_samples,
            eval_temperature=config.eval_temperature
            if args.grid_temperature is None
            else args.grid_temperature,
        )
        measure_grid(model, tokenizer, measured, split=args.grid, progress=True)
    elif not args.quiet:
        info = load_build_info(path)
        print(f"recipe key {info['key']}, {info['num_parameters'] / 1e6:.2f}M parameters")
    print(path)
    return 0
