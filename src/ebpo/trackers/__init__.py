"""Metrics on disk and in experiment trackers, for every command that reports them (``ebpo train``,
``ebpo diagnose``).

Modules: ``metrics_log`` (:class:`MetricsLogger`: ``metrics.jsonl``, one JSON line per step, and the trackers of
``run.report_to`` with them, continued from ``trackers.json`` or replaced with the history replayed on a
resume; :func:`read_metrics`), ``base`` (the :class:`Tracker` interface, the registry :data:`TRACKERS`,
:func:`check_trackers`), one module a backend (``tensorboard``, ``wandb``, ``mlflow``), ``runs``
(:class:`TrackerRuns`: several trackers called together) and ``excepthook`` (the process-wide hook that keeps
TensorBoard's writer thread quiet).
"""

from __future__ import annotations

from ebpo.trackers import mlflow, tensorboard, wandb  # noqa: F401  (each registers its tracker)
from ebpo.trackers.base import (
    PROJECT,
    TRACKERS,
    Status,
    Tracker,
    TrackerError,
    TrackerStart,
    check_trackers,
)
from ebpo.trackers.metrics_log import (
    EXCLUDED_FROM_REPRODUCIBILITY,
    MetricsLogger,
    finite_metrics,
    read_metrics,
)
from ebpo.trackers.mlflow import MLflowTracker, mlflow_metric_name
from ebpo.trackers.runs import TrackerRuns
from ebpo.trackers.tensorboard import TensorBoardTracker
from ebpo.trackers.wandb import WandbTracker

__all__ = [
    "EXCLUDED_FROM_REPRODUCIBILITY",
    "MLflowTracker",
    "MetricsLogger",
    "PROJECT",
    "Status",
    "TRACKERS",
    "TensorBoardTracker",
    "Tracker",
    "TrackerError",
    "TrackerRuns",
    "TrackerStart",
    "WandbTracker",
    "check_trackers",
    "finite_metrics",
    "mlflow_metric_name",
    "read_metrics",
]
