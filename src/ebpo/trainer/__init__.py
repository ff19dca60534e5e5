"""The reference trainer behind ``ebpo train``: the loop (``trainer.py``) and one module per concern around it.

``config.py`` (``TrainConfig``, read through ``ebpo.settings``), ``config_files.py`` (presets,
``load_config``, ``save_config``), ``setup.py`` (prompts, policy, estimator and loss, optimizer), ``rollout.py``
(scored groups, the typed batch, log-probs), ``checkpoint.py`` (checkpoints, RNG), ``clock.py`` (the step's wall time),
``validation.py``, ``report.py``, ``plots.py``, ``cli.py``. The run directory itself (lock, resume or
overwrite, metrics journal, summary) is an ``ebpo.run_directory.RunDirectory``; the metrics and trackers are
``ebpo.trackers``.

``Trainer``, ``TrainConfig``, ``load_config`` and ``ConfigError`` are imported on first use (PEP 562
``__getattr__``), so ``import ebpo.trainer`` (and ``ebpo --help``, which imports ``ebpo.trainer.cli``) does not
pay for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["ConfigError", "TrainConfig", "Trainer", "load_config"]

_LAZY = {
    "ConfigError": "ebpo.errors",
    "TrainConfig": "ebpo.trainer.config",
    "load_config": "ebpo.trainer.config_files",
    "Trainer": "ebpo.trainer.trainer",
}

if TYPE_CHECKING:  # for type checkers and IDEs; at run time these come from __getattr__
    from ebpo.errors import ConfigError
    from ebpo.trainer.config import TrainConfig
    from ebpo.trainer.config_files import load_config
    from ebpo.trainer.trainer import Trainer


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ebpo.trainer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
