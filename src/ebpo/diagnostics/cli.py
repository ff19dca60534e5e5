"""``ebpo diagnose``: one flag per field of :class:`~ebpo.diagnostics.config.DiagnoseConfig`."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from ebpo.diagnostics.config import DiagnoseConfig

DESCRIPTION = """\
Measure, on your model, prompts and reward, what each advantage estimator does to the baseline and to the
policy gradient, before a training budget is spent. R batches of M prompts are sampled from the policy; at
each group size G every estimator sees the same responses, so estimators differ only in the advantage. Per
estimator and G, with 95% intervals over batches: the baseline's mean squared error against each prompt's
success rate (from G_ref separate samples, their own noise subtracted), the cosine between the one-batch
policy gradient (the estimator's preset loss at ratio 1, no KL term) and a reference gradient (G_ref samples,
leave-one-out baseline), its relative squared error and variance across batches, and the fractions of
responses and groups with no advantage; differences paired against --compare-to. Prints a markdown table;
writes diagnose.md, diagnose.csv, batches.csv and diagnose.png to --out-dir (and, with --report-to, to
TensorBoard, wandb or MLflow). docs/diagnose.md says how to read them.

examples:
  ebpo diagnose                                              # the shipped model, every estimator
  ebpo diagnose -G 4 8 --estimators grpo ebpo ebpo:normalize=prior --preset grpo
  ebpo diagnose --model runs/grpo/checkpoints/best/model --topics dot --levels 3
  ebpo diagnose --report-to wandb mlflow                     # the table in your trackers too
"""


def build_parser(prog: str = "ebpo diagnose") -> argparse.ArgumentParser:
    from ebpo.settings import dataclass_parser

    return dataclass_parser(prog, DESCRIPTION, [DiagnoseConfig], switches=("quiet",), raw_description=True)


def add_parser(subparsers: Any) -> None:
    """Add ``ebpo diagnose`` to the CLI."""
    from ebpo.settings import add_command

    add_command(
        subparsers,
        "diagnose",
        help="measure each advantage estimator's baseline error and policy gradient on a model",
        parser=build_parser,
        run=run,
    )


def run(args: argparse.Namespace) -> int:
    """Entry point: run, print the table, write the files and send them to the trackers; a bad setting is one
    line on stderr, exit 2; a tracker that cannot take them, exit 1."""
    from ebpo.console import show_traceback
    from ebpo.diagnostics.report import write_outputs
    from ebpo.diagnostics.study import diagnose
    from ebpo.errors import ConfigError
    from ebpo.settings import from_args

    try:
        cfg = from_args(DiagnoseConfig, args)
        result = diagnose(cfg)
    except ConfigError as err:
        show_traceback(err)
        print(f"ebpo diagnose: error: {err}", file=sys.stderr)
        return 2
    out_dir = Path(cfg.out_dir)
    table, summary = write_outputs(result, out_dir)
    print(table)
    print(f"output: {out_dir.resolve()} (diagnose.md, diagnose.csv, batches.csv, diagnose.png)")
    if cfg.report_to:
        from ebpo.diagnostics.tracking import report
        from ebpo.run_directory import RunDirectory
        from ebpo.trackers import TrackerError

        files = [out_dir / name for name in ("diagnose.md", "diagnose.csv", "batches.csv", "diagnose.png")]
        try:
            report(
                cfg.report_to,
                out_dir,
                name=RunDirectory.timestamped("diagnose"),
                config=dataclasses.asdict(cfg),
                tables={"diagnose": summary.rows},
                files=files,
            )
        except TrackerError as err:
            show_traceback(err)
            print(f"ebpo diagnose: error: {err}; the outputs are in {out_dir}", file=sys.stderr)
            return 1
    return 0
