"""``EBPORayPPOTrainer``: verl's synchronous ``RayPPOTrainer`` with EBPO's state, metrics and clusters.

Everything else is verl's own ``fit``. What the subclass adds, hook by hook:

- ``__init__``: marks the process's :data:`~ebpo.integrations.verl.estimators.HOLDER` as managed (no
  "outside the trainer" warning), warns once about settings this trainer path ignores and refuses
  ``actor.shuffle=True`` together with ``filter_groups`` (see ``_update_actor``).
- ``_get_gen_batch``: records uid -> ``algorithm.<estimator>.cluster_key`` for the batch.
- ``_save_checkpoint`` / ``_load_checkpoint``: ``global_step_N/ebpo_estimator.pt`` (same
  ``trainer.resume_mode`` rules as verl); the prior saved at step N holds the rewards of steps 1..N. It is
  written before verl's own ``_save_checkpoint``, which writes ``latest_checkpointed_iteration.txt`` last:
  a kill in between leaves step N unmarked, so a resume takes the previous checkpoint, never one without
  its prior. A resumed checkpoint without the file warns in one line (written by another trainer) or stops
  (another checkpoint of the run has one: :func:`~ebpo.integrations.verl.checkpoint.restore_estimator_state`). With a
  clustered sampler also ``global_step_N/ebpo_sampler.pt``, its stream cursor: verl skips restoring
  ``data.pt`` when N ends an epoch ("next epoch will iterate from scratch"), which would restart the topic or
  curriculum stream at its first epoch; the cursor is restored then, so the stream goes on with epoch
  N / steps_per_epoch + 1. Mid-epoch, verl's own ``data.pt`` restore stands.
- ``_update_actor``: the groups ``algorithm.filter_groups`` dropped (the prior has seen them) leave the
  update exactly as if removed from the batch (:mod:`.filtering`, with the worker of :mod:`.worker`); a step
  that dropped every group takes no optimizer step. Adds ``est.metrics()`` (``ebpo/mu_glob``,
  ``ebpo/shrinkage``, ...) to the actor metrics that ``fit`` sends to verl's logger.
- ``_log_rollout_data``: the rollouts verl dumps to ``trainer.rollout_data_dir`` also carry each row's
  ``uid`` (its group) and ``advantage`` (the sequence advantage: the mean over its response tokens).
"""

from __future__ import annotations

import logging
import os

import numpy as np
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from ebpo.integrations.verl.checkpoint import (
    load_sampler_state,
    resolve_resume_folder,
    restore_estimator_state,
    save_estimator_state,
    save_sampler_state,
)
from ebpo.integrations.verl.estimators import (
    HOLDER,
    column_values,
    estimator_options,
    refuse_rejection_after_advantage,
)
from ebpo.integrations.verl.filtering import layout_filtered_update
from ebpo.integrations.verl.registration import REGISTERED

logger = logging.getLogger(__name__)

__all__ = ["EBPORayPPOTrainer", "ignored_settings", "refuse_unsupported"]


def ignored_settings(config) -> list[str]:
    """Settings of ``config`` that this (legacy, synchronous) trainer path does not honour, one line each."""
    out = []
    v1 = config.trainer.get("v1", None)
    if v1 is not None and str(v1.get("trainer_mode", "sync")) != "sync":
        out.append(
            f"trainer.v1.trainer_mode={v1.trainer_mode}: async modes belong to verl's v1 trainer; this entry "
            "point trains synchronously (one advantage call per full batch)"
        )
    rollout = config.actor_rollout_ref.rollout
    if rollout.get("multi_turn", {}).get("enable", False):
        out.append(
            "actor_rollout_ref.rollout.multi_turn.enable=True: multi-turn agent loops are not validated with "
            "ebpo's estimators (each trajectory must be one group member)"
        )
    filter_groups = config.algorithm.get("filter_groups", None)
    if filter_groups is not None and filter_groups.get("enable", False):
        name = str(config.algorithm.get("adv_estimator", ""))
        if name not in REGISTERED:
            out.append(
                f"algorithm.filter_groups.enable=True does nothing with algorithm.adv_estimator={name} (verl's "
                f"own estimator): this trainer filters groups only for ebpo's ({', '.join(REGISTERED)}); every "
                "group trains"
            )
        elif str(filter_groups.get("max_num_gen_batches", 0) or 0) not in ("0", "1"):
            out.append(
                "algorithm.filter_groups.max_num_gen_batches: this trainer drops saturated groups without "
                "generating replacements (the batch trains on the groups it has)"
            )
    return out


def refuse_unsupported(config) -> None:
    """Raise ``ValueError`` (one line naming the keys) for combinations this trainer cannot train exactly."""
    filter_groups = config.algorithm.get("filter_groups", None)
    if filter_groups is not None and filter_groups.get("enable", False):
        if config.actor_rollout_ref.actor.get("shuffle", False):
            raise ValueError(
                "actor_rollout_ref.actor.shuffle=True with algorithm.filter_groups.enable=True: the rows that "
                "fill a filtered step's last mini-batch would be shuffled into other mini-batches; set "
                "actor_rollout_ref.actor.shuffle=False"
            )


class EBPORayPPOTrainer(RayPPOTrainer):
    """verl's ``RayPPOTrainer`` with EBPO's estimator state checkpointed, its metrics logged, and each
    prompt's cluster passed to the estimator (see the module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        refuse_unsupported(self.config)
        refuse_rejection_after_advantage(self.config.algorithm)
        HOLDER.managed = True
        for line in ignored_settings(self.config):
            logger.warning(f"[ebpo] WARNING: {line}")

    def _estimator_name(self) -> str:
        return str(self.config.algorithm.adv_estimator)

    def _get_gen_batch(self, batch):
        name = self._estimator_name()
        if name in REGISTERED and "uid" in batch.non_tensor_batch:
            _, cluster_key = estimator_options(self.config.algorithm, name)
            keys = column_values(batch.non_tensor_batch, cluster_key)
            if keys is not None:
                HOLDER.note_clusters(list(batch.non_tensor_batch["uid"]), keys)
        return super()._get_gen_batch(batch)

    def _save_checkpoint(self):
        # ours first: verl's own save ends by marking step N complete (latest_checkpointed_iteration.txt)
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        save_estimator_state(folder)
        save_sampler_state(folder, getattr(self.train_dataloader, "sampler", None))
        super()._save_checkpoint()

    def _load_checkpoint(self):
        result = super()._load_checkpoint()
        folder = resolve_resume_folder(self.config.trainer)
        if folder is not None and self._estimator_name() in REGISTERED:
            restore_estimator_state(folder)
        steps_per_epoch = len(self.train_dataloader)
        if folder is not None and steps_per_epoch and self.global_steps % steps_per_epoch == 0:
            # verl left data.pt alone here (an epoch boundary); our stream's cursor sits at that epoch's end
            load_sampler_state(folder, getattr(self.train_dataloader, "sampler", None))
        return result

    def _update_actor(self, batch):
        if HOLDER.filtered_uids:
            dropped = np.isin(
                np.asarray(batch.non_tensor_batch["uid"], dtype=object), list(HOLDER.filtered_uids)
            )
            actor = self.config.actor_rollout_ref
            batch = layout_filtered_update(batch, dropped, actor.actor.ppo_mini_batch_size * actor.rollout.n)
        if batch is None:  # every group was dropped: nothing to train on, no optimizer step
            actor_output = DataProto.from_single_dict(data={}, meta_info={"metrics": {}})
        else:
            actor_output = super()._update_actor(batch)
        actor_output.meta_info["metrics"].update(HOLDER.metrics())
        return actor_output

    def _log_rollout_data(self, batch, reward_extra_infos_dict, timing_raw, rollout_data_dir):
        extra = dict(reward_extra_infos_dict)
        if "uid" in batch.non_tensor_batch:
            extra["uid"] = [str(uid) for uid in batch.non_tensor_batch["uid"]]
        if "advantages" in batch.batch.keys():
            mask_BT = batch.batch["response_mask"].float()
            adv_B = (batch.batch["advantages"].float() * mask_BT).sum(-1) / mask_BT.sum(-1).clamp(min=1)
            extra["advantage"] = adv_B.tolist()
        return super()._log_rollout_data(batch, extra, timing_raw, rollout_data_dir)
