"""``ebpo train``: the reference trainer from the command line.

ebpo train                                   # built-in default: EBPO on arith with the base model
ebpo train --config grpo run.steps=100 rollout.temperature=0.8   # a shipped preset, by name
ebpo train --config my.yaml                  # or any YAML file (a subset of the keys)
ebpo train --resume runs/20260101-120000-ebpo run.steps=120
ebpo train --resume runs/20260101-120000-ebpo/checkpoints/best   # from the best checkpoint instead
ebpo train run.name=demo --overwrite         # replace the run already in runs/demo
ebpo train --help-config                     # every config key, its default and help
ebpo train --plugins my_estimators.py algorithm.estimator=median_baseline   # your own estimator
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any

from ebpo.settings import add_command, dataclass_parser
from ebpo.trainer.config_files import list_presets


@dataclass
class TrainCommand:
    """What ``ebpo train`` runs beside the config keys (``TrainConfig``, given as ``KEY=VALUE`` overrides)."""

    config: str | None = field(
        default=None,
        metadata={
            "metavar": "NAME|FILE",
            "help": f"a preset shipped with the package ({', '.join(list_presets())}; src/ebpo/configs/) or a "
            "YAML file with any subset of the keys; default: built-in (= the ebpo preset)",
        },
    )
    resume: str | None = field(
        default=None,
        metadata={
            "metavar": "DIR",
            "help": "continue a run exactly from its last checkpoint (a run directory), or from one checkpoint "
            "of it (DIR/checkpoints/best); its config.yaml is the base, --config and overrides apply on top "
            "(e.g. run.steps=200 to train longer). Ctrl-C or SIGTERM stops a run after its current step with a "
            "checkpoint and prints the command that continues it",
        },
    )
    run_dir: str | None = field(
        default=None,
        metadata={"metavar": "DIR", "help": "write to this directory instead of runs/<timestamp>-<method>"},
    )
    overwrite: bool = field(
        default=False,
        metadata={
            "help": "start over in a run directory that already holds a run, deleting its metrics, checkpoints, "
            "TensorBoard logs, summary and plot (without it such a directory is refused; --resume continues it)"
        },
    )
    help_config: bool = field(
        default=False, metadata={"help": "print every config key with its default and help, and exit"}
    )


SWITCHES = ("overwrite", "help_config")
"""TrainCommand's booleans: flags without a value, so that an override after them is not read as theirs."""


def build_parser(prog: str = "ebpo train") -> argparse.ArgumentParser:
    """``ebpo train``'s parser: one flag per field of :class:`TrainCommand` (``ebpo.settings``) and the
    positional ``KEY=VALUE`` overrides of the config."""
    parser = dataclass_parser(prog, __doc__ or "", [TrainCommand], switches=SWITCHES, raw_description=True)
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="dotted config overrides applied after --config, e.g. algorithm.estimator=grpo optim.lr=5e-5",
    )
    return parser


def add_parser(subparsers: Any) -> None:
    """Register ``ebpo train`` (its parser is built when it runs: :func:`build_parser`)."""
    add_command(
        subparsers,
        "train",
        help="RL-train a causal LM with EBPO or a baseline (default: EBPO on the arith task, a few minutes on CPU)",
        parser=build_parser,
        run=run,
    )


def run(args: argparse.Namespace) -> int:
    """Run ``ebpo train``. Returns the exit code: 0; 2 for a bad config, path or checkpoint; 1 when the reward
    raised, the disk refused a write or a tracker could not start or log; 130 / 143 when Ctrl-C / SIGTERM
    stopped it (one line on stderr saying what was kept and the command that continues, never a traceback). With
    ``--debug`` an error's one line follows its traceback (:func:`ebpo.console.show_traceback`)."""
    from ebpo.console import show_traceback
    from ebpo.errors import ConfigError
    from ebpo.persist import WriteError
    from ebpo.settings import read_yaml
    from ebpo.trainer.config import describe
    from ebpo.trainer.config_files import load_config

    if args.help_config:
        for key, default, text in describe():
            print(f"{key} (default {default})\n    {text}")
        return 0
    try:
        base = None
        if args.resume:
            from ebpo.trainer.checkpoint import resume_run_dir

            base = read_yaml(resume_run_dir(args.resume) / "config.yaml")
        cfg = load_config(args.config, args.overrides, base=base)
        cfg.run.plugins = list(dict.fromkeys([*cfg.run.plugins, *args.plugins]))  # saved with the run
        from ebpo.trackers import TrackerError
        from ebpo.trainer.report import print_eval_table
        from ebpo.trainer.trainer import RewardError, Trainer

        trainer = Trainer(cfg, run_dir=args.run_dir, resume=args.resume, overwrite=args.overwrite)
    except (ConfigError, ValueError, FileNotFoundError, WriteError) as err:
        show_traceback(err)
        print(f"ebpo train: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ebpo train: interrupted before the first step; nothing to resume", file=sys.stderr)
        return 130
    print(f"run directory: {trainer.run_dir}", flush=True)
    from ebpo.models.names import builtin_recipe

    note = task_note(cfg)
    if note:
        print(note, flush=True)
    if cfg.model.path is not None and builtin_recipe(cfg.model.path) is None:
        from ebpo.models.paths import find_model

        note = find_model(cfg.model.path).note  # which model of a run or checkpoint directory trains
        if note:
            print(f"model.path: {note}", flush=True)
    try:
        result = trainer.train()
    except RewardError as err:
        show_traceback(err)
        print(f"ebpo train: error: {err}", file=sys.stderr)
        return 1
    except TrackerError as err:  # could not start or log: metrics.jsonl and the checkpoints are kept
        show_traceback(err)
        print(f"ebpo train: error: {err}; {_continue_from(trainer)}", file=sys.stderr)
        return 1
    except WriteError as err:
        show_traceback(err)
        print(
            f"ebpo train: error: cannot write {err.path}: {err.reason}; {_kept(trainer, err)}",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt as err:
        import signal

        for signum in (signal.SIGINT, signal.SIGTERM):  # the process ends now: no traceback from a late one
            signal.signal(signum, signal.SIG_IGN)
        print(f"ebpo train: {_stopped(trainer, err)}", file=sys.stderr)
        return getattr(err, "exit_code", 130)
    try:
        print()
        print_eval_table(result.eval_before, result.eval_after)
        for line in checkpoint_lines(result, cfg.run.eval_k):
            print(line)
        if cfg.run.plot:
            print(f"plot: {result.run_dir / 'training.png'}")
        print(f"run directory: {result.run_dir}")
    except KeyboardInterrupt:  # training is over and saved: only the summary is cut short
        print(f"\nebpo train: interrupted; the run is complete in {result.run_dir}", file=sys.stderr)
        return 130
    return 0


def checkpoint_lines(result: Any, eval_k: int) -> list[str]:
    """What the run's checkpoints hold, after the before/after table: the best checkpoint (the highest validation
    maj@k, the model ``ebpo eval RUN`` and ``model.path=RUN`` take) and, when it is not the final step the
    table's after column shows, the last checkpoint too, so that the two never read as one."""
    from ebpo.run_directory import RunDirectory

    if result.best_step is None:
        return []
    checkpoints = result.run_dir / RunDirectory.CHECKPOINTS
    best = (
        f"best checkpoint: step {result.best_step} (the highest validation maj@{eval_k}, "
        f"{result.best_score:.3f}; what `ebpo eval {result.run_dir}` scores) in {checkpoints / RunDirectory.BEST}"
    )
    if result.best_step == result.step:
        return [best]
    final = result.eval_after.get(f"eval/maj@{eval_k}")
    score = f"maj@{eval_k} {final:.3f}, " if final is not None else ""
    return [
        best,
        f"last checkpoint: step {result.step} ({score}the table's after column) in {checkpoints / RunDirectory.LAST}",
    ]


def task_note(cfg: Any) -> str | None:
    """One line when a built-in model trains on generated problems of a task family other than the one it was made
    for (S2, ``builtin:gym``, on ``arith``: most likely a forgotten ``--config gym``), naming the preset that trains
    it on its own task; None otherwise (a data file, or the family it was made for, whatever its options)."""
    from ebpo.models.names import builtin_recipe
    from ebpo.settings import read_yaml
    from ebpo.trainer.config_files import PRESETS_DIR

    recipe = builtin_recipe(cfg.model.path)
    if recipe is None or cfg.data.train_file is not None:
        return None
    family = recipe.task.split(":")[0]
    if cfg.data.task.split(":")[0] == family:
        return None
    presets = []  # the shipped presets that train it on its own task: one named after it, else ebpo, first
    for path in sorted(PRESETS_DIR.glob("*.yaml"), key=lambda p: (p.stem != recipe.name, p.stem != "ebpo")):
        values = read_yaml(path)
        model, data = values.get("model") or {}, values.get("data") or {}
        if builtin_recipe(model.get("path")) is recipe and data.get("task", "arith") == recipe.task:
            presets.append(path.stem)
    own = f" (`ebpo train --config {presets[0]}` trains it on its own)" if presets else ""
    return (
        f"note: model.path is the built-in {recipe.what}, made for {family} tasks; this run trains it on "
        f"data.task={cfg.data.task}{own}"
    )


def _continue_from(trainer) -> str:
    """The checkpoint a resume of ``trainer``'s run continues from and the command that does it."""
    from ebpo.trainer import checkpoint as ckpt

    newest = ckpt.newest_intact(trainer.run_dir, verify=False)  # written by this process: not read back
    if newest is None:
        return f"no checkpoint was written; start over with `{ckpt.start_over_command(trainer.run_dir)}`"
    checkpoint, step = newest
    return f"{checkpoint} (step {step}) is kept; continue with `{ckpt.resume_command(checkpoint)}`"


def _kept(trainer, err) -> str:
    """After a refused write: what a resume continues from, and what to do first."""
    return f"{_continue_from(trainer)} once you {err.fix}"


def _stopped(trainer, err: KeyboardInterrupt) -> str:
    """One line after Ctrl-C or SIGTERM: where it stopped and the command that continues."""
    from ebpo.trainer import checkpoint as ckpt
    from ebpo.trainer.interrupt import Interrupted, StoppedAtOnce

    if isinstance(err, Interrupted):
        return f"{err}; continue with `{ckpt.resume_command(err.checkpoint)}`"
    stopped = f"{err}" if isinstance(err, StoppedAtOnce) else "interrupted"
    return f"{stopped} before step {trainer.step + 1} finished; {_continue_from(trainer)}"
