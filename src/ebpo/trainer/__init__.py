"""The reference trainer behind ``ebpo train``: the loop (``trainer.py``) and one module per concern around it.

``config.py`` (TrainConfig, YAML, overrides), ``setup.py`` (prompts, policy, estimator and loss, optimizer),
``rollout.py`` (scored groups, the typed batch, log-probs), ``checkpoint.py`` (checkpoints, RNG),
``metrics_log.py``, ``validation.py``, ``report.py``, ``plots.py``, ``cli.py``. The run directory itself
(lock, resume or overwrite, metrics journal, summary) is an ``ebpo.persist.RunDirectory``.

``Trainer`` and ``TrainConfig`` are imported lazily so that ``import ebpo.trainer`` stays light.
"""

from __future__ import annotations

from typing import Any

from ebpo.trainer.config import ConfigError, TrainConfig, load_config

__all__ = ["ConfigError", "TrainConfig", "Trainer", "load_config"]


def __getattr__(name: str) -> Any:
    if name == "Trainer":
        from ebpo.trainer.trainer import Trainer

        return Trainer
    raise AttributeError(f"module 'ebpo.trainer' has no attribute {name!r}")
