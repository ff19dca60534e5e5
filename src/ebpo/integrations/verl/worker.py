"""The actor worker of ``python -m ebpo.integrations.verl``: verl's ``ActorRolloutRefWorker`` whose training
half normalises each mini-batch of a filtered step by the rows it trains on (:mod:`.filtering`).

verl's extension point is the class attribute ``ActorRolloutRefWorker.actor_worker_cls`` (the
``TrainingWorker`` the hybrid worker builds for its actor); :class:`EBPOTrainingWorker` overrides one method,
``train_batch``, which verl's ``train_mini_batch`` calls once per mini-batch. A batch without
:data:`~ebpo.integrations.verl.filtering.TRAINED_KEY` (every step with nothing filtered, every caller other
than ``EBPORayPPOTrainer``) is trained exactly as by verl's own worker.

Imports verl's engines: loaded by the task runner and the workers, never by ``VERL_USE_EXTERNAL_MODULES``.
"""

from __future__ import annotations

import torch
from verl.utils import tensordict_utils as tu
from verl.utils.device import get_device_id
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

from ebpo.integrations.verl.filtering import TRAINED_KEY

__all__ = ["EBPOActorRolloutRefWorker", "EBPOTrainingWorker"]


class EBPOTrainingWorker(TrainingWorker):
    """verl's ``TrainingWorker``; a mini-batch carrying :data:`TRAINED_KEY` gets ``global_batch_size`` = its
    marked rows over all data-parallel ranks (verl's is the fixed mini-batch size, padding rows included)."""

    def train_batch(self, data):
        if TRAINED_KEY in data.keys():
            trained = data.pop(TRAINED_KEY)
            count = trained.sum().to(device=get_device_id(), dtype=torch.int64)
            group = self.engine.get_data_parallel_group()
            if group is not None:
                torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.SUM, group=group)
            tu.assign_non_tensor(data, global_batch_size=int(count.item()))
        return super().train_batch(data)


class EBPOActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's hybrid actor / rollout / reference worker with :class:`EBPOTrainingWorker` as its actor."""

    actor_worker_cls = EBPOTrainingWorker
