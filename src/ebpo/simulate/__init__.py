"""``ebpo simulate``: Monte Carlo studies of the advantage estimators on synthetic RLVR streams.

One concern a module: ``config`` (:class:`SimulateConfig`, every field a flag; :class:`StalenessSettings`),
``streams`` (the synthetic streams: :func:`make_stream`, :func:`staleness_stream`), ``study`` (Theorem 2 and
the estimators on the streams: :func:`simulate`), ``staleness`` (EBPO's ``prior_staleness`` options on groups
sampled by older weights: :func:`run_staleness`), ``report`` (tables, CSV, figure), ``cli`` (the command).
"""

from ebpo.simulate.config import SimulateConfig, StalenessSettings
from ebpo.simulate.report import (
    format_staleness,
    format_tables,
    write_csv,
    write_plot,
    write_staleness_csv,
)
from ebpo.simulate.staleness import STALENESS_OPTIONS, run_staleness
from ebpo.simulate.streams import Stream, make_stream, staleness_stream
from ebpo.simulate.study import (
    EstimatorSpec,
    SimulateResult,
    estimator_specs,
    oracle_prior_mse,
    recover_prior,
    run_estimator,
    simulate,
    theorem2,
)

__all__ = [
    "STALENESS_OPTIONS",
    "EstimatorSpec",
    "SimulateConfig",
    "SimulateResult",
    "StalenessSettings",
    "Stream",
    "estimator_specs",
    "format_staleness",
    "format_tables",
    "make_stream",
    "oracle_prior_mse",
    "recover_prior",
    "run_estimator",
    "run_staleness",
    "simulate",
    "staleness_stream",
    "theorem2",
    "write_csv",
    "write_plot",
    "write_staleness_csv",
]
