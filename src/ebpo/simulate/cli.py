"""``ebpo simulate``: run the study ``--study`` names, print its tables, write its files to ``--out-dir``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ebpo.simulate.config import SimulateConfig

DESCRIPTION = (
    "Reproduce Theorem 2 (EBPO's baseline MSE equals (1-S) sigma2/G under the Gaussian model) and compare the "
    "estimators (baseline MSE against the latent success rate, zero-advantage fraction, advantage in all-fail "
    "groups) and EBPO's prior scopes and memories on shuffled vs topic-coherent, stationary vs improving "
    "streams. Prints tables; writes simulate.csv and simulate.png to --out-dir."
)


def _run_staleness(cfg: SimulateConfig) -> int:
    """``--study staleness``: run it, print its tables, write ``staleness.csv``."""
    from ebpo.simulate.config import StalenessSettings
    from ebpo.simulate.report import format_staleness, write_staleness_csv
    from ebpo.simulate.staleness import run_staleness

    start = time.perf_counter()
    rows = run_staleness(StalenessSettings.from_config(cfg))
    print(format_staleness(rows))
    print(f"({time.perf_counter() - start:.1f} s)")
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_staleness_csv(rows, out_dir / "staleness.csv")
    print(f"wrote {out_dir / 'staleness.csv'}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add ``ebpo simulate`` to the CLI: one flag per :class:`SimulateConfig` field."""
    from ebpo.settings import add_command, dataclass_parser

    add_command(
        subparsers,
        "simulate",
        help="Monte Carlo study of the advantage estimators on a synthetic RLVR stream",
        parser=lambda prog: dataclass_parser(prog, DESCRIPTION, [SimulateConfig]),
        run=run,
    )


def run(args: argparse.Namespace) -> int:
    """Entry point of ``ebpo simulate``: run, print the tables, write CSV and PNG, print their folder; a bad
    setting is one line on stderr, exit 2."""
    from ebpo.console import show_traceback
    from ebpo.errors import ConfigError
    from ebpo.settings import from_args
    from ebpo.simulate.report import format_tables, write_csv, write_plot
    from ebpo.simulate.study import simulate

    try:
        cfg = from_args(SimulateConfig, args)
    except ConfigError as err:
        show_traceback(err)
        print(f"ebpo simulate: error: {err}", file=sys.stderr)
        return 2
    if cfg.study == "staleness":
        return _run_staleness(cfg)
    result = simulate(cfg)
    print(format_tables(result))
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(result, out_dir / "simulate.csv")
    write_plot(result, out_dir / "simulate.png")
    print(f"wrote {out_dir / 'simulate.csv'} and {out_dir / 'simulate.png'}")
    print(f"output: {out_dir.resolve()}")
    return 0


__all__ = ["DESCRIPTION", "add_parser", "run"]
