"""ebpo under verl's own launcher (``python -m verl.trainer.main_ppo algorithm.adv_estimator=ebpo ...``).

``pip install ebpo[verl]`` puts :mod:`.registration` in verl's plugin group (``verl.plugins``), so every verl
process registers our estimators when it imports verl. Through verl's documented keys its v1 trainer then also
takes:

- ``trainer.checkpoint_callback_class=ebpo.integrations.verl.EBPOCheckpointCallback``
  (:class:`EBPOCheckpointCallback`): the estimator's state saved with every checkpoint, restored on resume.
- ``trainer.v1.sampler.custom_sampler.path=pkg://ebpo.integrations.verl.v1`` and
  ``trainer.v1.sampler.custom_sampler.name=EBPOReplayBuffer``: the groups ``algorithm.filter_groups`` (DAPO)
  evicts reach the prior, a group's rows in the order they were drawn.

What verl's launcher cannot do here, because verl's trainer builds its own pieces where ours would go, is named
in one warning when the trainer starts (:func:`launcher_gaps`), with the one-line switch to
``python -m ebpo.integrations.verl`` and the same overrides: the clustered samplers (verl 0.9 builds its own
sampler and ignores ``data.sampler.class_path``), cluster keys for ``prior_scope=cluster``, the ``ebpo/*``
metrics (no hook after the advantage), the prior written before verl marks a checkpoint complete (verl calls
the checkpoint callback after the mark: a resume that finds the mark without the prior stops, naming the
last checkpoint that has one), and the CPU mode (refused: verl's trainer builds verl's worker, whose process
group setup asks torch for ``cpu:gloo,cpu:gloo``, which torch refuses, and offers no key to name another).
"""

from __future__ import annotations

import logging
from typing import Any

try:
    from verl.trainer.ppo.checkpoint_callback import CheckpointCallback

    #: whether this verl has ``trainer.checkpoint_callback_class`` (0.9.1 does, 0.9.0 does not)
    CALLBACK_AVAILABLE = True
except ImportError:  # verl 0.9.0: the warning says the prior cannot be checkpointed under verl's launcher

    class CheckpointCallback:  # type: ignore[no-redef]
        """verl 0.9.1's base class, for this module to import on a verl without it."""

        def __init__(self, config: Any = None) -> None:
            self.config = config

    CALLBACK_AVAILABLE = False

from ebpo.integrations.verl.checkpoint import (
    resolve_resume_folder,
    restore_estimator_state,
    save_estimator_state,
)
from ebpo.integrations.verl.estimators import (
    HOLDER,
    EstimatorHolder,
    estimator_options,
    refuse_rejection_after_advantage,
    served_by_ebpo,
    to_plain,
)

logger = logging.getLogger(__name__)

__all__ = [
    "CALLBACK_AVAILABLE",
    "CALLBACK_KEY",
    "SWITCH",
    "EBPOCheckpointCallback",
    "launcher_gaps",
    "warn_about_launcher",
]

CALLBACK_KEY = "trainer.checkpoint_callback_class=ebpo.integrations.verl.EBPOCheckpointCallback"
BUFFER_KEYS = (
    "trainer.v1.sampler.custom_sampler.path=pkg://ebpo.integrations.verl.v1 "
    "trainer.v1.sampler.custom_sampler.name=EBPOReplayBuffer"
)
#: the one-line switch every warning ends with
SWITCH = "python -m ebpo.integrations.verl <the same overrides>"


def _get(config: Any, dotted: str, default: Any = None) -> Any:
    node = config
    for part in dotted.split("."):
        getter = getattr(node, "get", None)
        node = getter(part, None) if callable(getter) else getattr(node, part, None)
        if node is None:
            return default
    return node


def launcher_gaps(config: Any, *, callback: bool) -> list[str]:
    """What ebpo's estimator does not get under verl's launcher with this (full) config, one phrase each.

    ``callback``: whether :class:`EBPOCheckpointCallback` is the checkpoint callback.
    """
    gaps = ["ebpo/* metrics (verl's trainer has no hook after the advantage)"]
    v1 = bool(_get(config, "trainer.use_v1", True))
    if not CALLBACK_AVAILABLE:
        gaps.append("a checkpointed prior (a resume restarts it empty): this verl has no checkpoint callback")
    elif not callback or not v1:
        gaps.append(
            "a checkpointed prior (a resume restarts it empty): "
            + (f"add {CALLBACK_KEY}" if v1 else "verl's legacy trainer calls no checkpoint callback")
        )
    else:
        gaps.append(
            "the prior on disk before verl marks a checkpoint complete (a resume that finds the mark without it stops)"
        )
    if _get(config, "data.sampler.class_path"):
        gaps.append(
            f"data.sampler.class_name={_get(config, 'data.sampler.class_name')} (verl 0.9 builds its own sampler; "
            "the prompts come in verl's order)"
        )
    name = str(_get(config, "algorithm.adv_estimator", ""))
    if name and served_by_ebpo(name):
        options, _ = estimator_options(_get(config, "algorithm"), name)
        if options.get("prior_scope") == "cluster":
            gaps.append(f"cluster keys (algorithm.{name}.prior_scope=cluster stops at the first step)")
    mode = str(_get(config, "trainer.v1.trainer_mode", "sync"))
    custom = to_plain(_get(config, "trainer.v1.sampler.custom_sampler", {})) or {}
    if v1 and mode != "sync" and custom.get("name") != "EBPOReplayBuffer":
        gaps.append(f"each group's staleness (trainer.v1.trainer_mode={mode}): add {BUFFER_KEYS}")
    if v1 and bool(_get(config, "algorithm.filter_groups.enable", False)):
        if custom.get("name") != "EBPOReplayBuffer":
            gaps.append(f"the groups algorithm.filter_groups evicts in the prior: add {BUFFER_KEYS}")
    return gaps


def warn_about_launcher(config: Any, *, callback: bool, holder: EstimatorHolder | None = None) -> None:
    """Log the one warning about verl's launcher (:func:`launcher_gaps`), once per process; nothing under
    ``python -m ebpo.integrations.verl`` (its trainers mark :data:`HOLDER` managed)."""
    owner = holder if holder is not None else HOLDER
    if owner.managed or owner.warned:
        return
    owner.warned = True
    name = str(_get(config, "algorithm.adv_estimator", "ebpo"))
    logger.warning(
        f"[ebpo] WARNING: verl's launcher runs {name!r} without: {'; '.join(launcher_gaps(config, callback=callback))}. "
        f"All of it: {SWITCH}"
    )


class EBPOCheckpointCallback(CheckpointCallback):
    """``trainer.checkpoint_callback_class=ebpo.integrations.verl.EBPOCheckpointCallback``: the estimator's state
    in every checkpoint of verl's v1 trainer under verl's own launcher.

    verl builds it with the full config when its trainer starts, before it loads a checkpoint: it refuses what
    cannot run here (``trainer.device=cpu``; rejection after the advantage), prints the one warning of
    :func:`warn_about_launcher`, and restores the prior from the checkpoint verl will resume from (same
    ``trainer.resume_mode`` rules; :func:`~ebpo.integrations.verl.checkpoint.restore_estimator_state`).
    ``on_save`` writes ``global_step_N/ebpo_estimator.pt`` atomically. Under ``python -m
    ebpo.integrations.verl`` it does nothing: that trainer saves the prior before verl's own save.
    """

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        if HOLDER.managed or config is None:
            return
        if str(_get(config, "trainer.device", "")) == "cpu":
            raise ValueError(
                "trainer.device=cpu: the CPU mode needs ebpo's launcher (verl's trainer builds verl's worker, whose "
                f"process group torch refuses on the CPU, and has no key for another): {SWITCH}"
            )
        refuse_rejection_after_advantage(_get(config, "algorithm"))
        HOLDER.filter_in_estimator = False  # v1 filters groups in its replay buffer, before the advantage
        warn_about_launcher(config, callback=True)
        name = str(_get(config, "algorithm.adv_estimator", ""))
        folder = resolve_resume_folder(config.trainer)
        if folder is not None and served_by_ebpo(name):
            restore_estimator_state(folder)

    def on_save(
        self, trainer: Any, global_step: int, checkpoint_dir: str, async_save: bool = False, **kwargs: Any
    ) -> None:
        if not HOLDER.managed:
            save_estimator_state(checkpoint_dir)
