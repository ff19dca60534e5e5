"""``ebpo train``: the reference trainer from the command line.

ebpo train                                   # built-in default: EBPO on arith with the base model
ebpo train --config grpo run.steps=100 rollout.temperature=0.8   # a shipped preset, by name
ebpo train --config my.yaml                  # or any YAML file (a subset of the keys)
ebpo train --resume runs/20260101-120000-ebpo run.steps=120
ebpo train run.name=demo --overwrite         # replace the run already in runs/demo
ebpo train --help-config                     # every config key, its default and help
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(subparsers) -> None:
    from ebpo.trainer.config import list_presets  # standard library only: keeps `ebpo --help` fast

    parser = subparsers.add_parser(
        "train",
        help="RL-train a causal LM with EBPO or a baseline (default: EBPO on the arith task, a few minutes on CPU)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="dotted config overrides applied after --config, e.g. algorithm.estimator=grpo optim.lr=5e-5",
    )
    parser.add_argument(
        "--config",
        metavar="NAME|FILE",
        help=f"a preset shipped with the package ({', '.join(list_presets())}; src/ebpo/configs/) or a YAML "
        f"file; default: built-in (= the ebpo preset)",
    )
    parser.add_argument(
        "--resume",
        metavar="DIR",
        help="continue a run exactly from its last checkpoint (run directory); its config.yaml is the base, "
        "--config and overrides apply on top (e.g. run.steps=200 to train longer)",
    )
    parser.add_argument(
        "--run-dir", metavar="DIR", help="write to this directory instead of runs/<timestamp>-<method>"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start over in a run directory that already holds a run, deleting its metrics, checkpoints, "
        "TensorBoard logs, summary and plot (without it such a directory is refused; --resume continues it)",
    )
    parser.add_argument(
        "--help-config", action="store_true", help="print every config key with its default and exit"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ebpo.trainer.config import ConfigError, describe, load_config, read_yaml

    if args.help_config:
        for key, default, text in describe():
            print(f"{key} (default {default})\n    {text}")
        return 0
    try:
        base = None
        if args.resume:
            saved = Path(args.resume) / "config.yaml"
            if not saved.is_file():
                raise ConfigError(f"--resume {args.resume}: no config.yaml there; is it a run directory?")
            base = read_yaml(saved)
        cfg = load_config(args.config, args.overrides, base=base)
        from ebpo.trainer.report import print_eval_table
        from ebpo.trainer.trainer import RewardError, Trainer

        trainer = Trainer(cfg, run_dir=args.run_dir, resume=args.resume, overwrite=args.overwrite)
    except (ConfigError, ValueError, FileNotFoundError) as err:
        print(f"ebpo train: error: {err}", file=sys.stderr)
        return 2
    print(f"run directory: {trainer.run_dir}", flush=True)
    try:
        result = trainer.train()
    except RewardError as err:
        print(f"ebpo train: error: {err}", file=sys.stderr)
        return 1
    print()
    print_eval_table(result.eval_before, result.eval_after)
    if result.best_step is not None:
        print(
            f"best checkpoint: step {result.best_step} (maj@{cfg.run.eval_k} {result.best_score:.3f}) "
            f"in {result.run_dir / 'checkpoints' / 'best'}"
        )
    if cfg.run.plot:
        print(f"plot: {result.run_dir / 'training.png'}")
    print(f"run directory: {result.run_dir}")
    return 0
