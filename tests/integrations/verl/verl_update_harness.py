"""One actor update through verl's own code on CPU ranks (gloo), for tests/integrations/verl/test_verl_update.py.

    python -m torch.distributed.run --nproc_per_node R tests/integrations/verl/verl_update_harness.py MODEL_DIR OUT.pt CASE...

Each CASE (``name:worker:filter:prompts_per_update:loss_agg_mode``) builds verl's actor worker (role
``actor``: FSDP2 on ``cpu``, SGD, no gradient clipping) from verl's ``ppo_trainer.yaml`` with the CPU
mode's settings, computes the old log-probs of one fixed batch with verl's ``_compute_old_log_prob`` and
runs verl's ``RayPPOTrainer._update_actor`` (or ``EBPORayPPOTrainer._update_actor``) on it; the worker
group is this process group (verl's dispatch: the batch in R contiguous chunks, one per rank). Rank 0 saves,
per case, the parameters after the update and the actor metrics.

- ``worker``: ``ours`` (``CPUActorRolloutRefWorker``, with ``EBPORayPPOTrainer._update_actor`` as driver) or
  ``verl`` (verl's ``ActorRolloutRefWorker`` on gloo, with verl's ``RayPPOTrainer._update_actor``).
- ``filter``: ``none`` (the whole batch), ``ebpo`` (groups DROPPED filtered through ebpo's trainer), ``zeroed``
  (the DROPPED groups kept with their response mask zeroed: what a trainer that only masks them sends),
  ``removed`` (the DROPPED groups taken out of the batch, the rest trained in consecutive mini-batches of
  ``prompts_per_update`` prompts, the last one smaller: the reference, made of plain verl calls).

The batch: GROUPS prompts x N responses, random tokens of the tiny model's vocabulary, prompts left-padded
and responses right-padded to random lengths, advantages one random value per row, reference log-probs
the old ones plus noise (the KL term and the entropy bonus are on, so every part of verl's loss is in).
"""

from __future__ import annotations

import copy
import functools
import os
import sys
from pathlib import Path

import numpy as np
import torch

GROUPS, N, PROMPT_LEN, RESPONSE_LEN = 8, 4, 6, 5
DROPPED = (1, 4, 5)  # the groups the filter drops: 20 of 32 rows stay
LR = 0.5


@functools.cache
def _composed(model_dir: str, world: int):
    """verl's ``ppo_trainer.yaml`` with the harness's settings and the CPU mode's, composed once per process
    (a Hydra compose costs about a second; the cases differ only in the two keys :func:`compose_config` sets,
    which verl's config reads through interpolations, so setting them afterwards is the same as composing
    them)."""
    from hydra import compose, initialize_config_dir

    from ebpo.integrations.verl.cpu.config import apply_cpu_mode, overridden_keys
    from ebpo.integrations.verl.main import _config_dir

    overrides = [
        "trainer.device=cpu",
        f"trainer.n_gpus_per_node={world}",
        f"actor_rollout_ref.model.path={model_dir}",
        f"actor_rollout_ref.rollout.n={N}",
        f"data.train_batch_size={GROUPS}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={GROUPS}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.optim.optimizer=SGD",
        f"actor_rollout_ref.actor.optim.lr={LR}",
        "actor_rollout_ref.actor.optim.weight_decay=0",
        "actor_rollout_ref.actor.optim.clip_grad=1e9",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.5",
        "actor_rollout_ref.actor.entropy_coeff=0.01",
        "algorithm.adv_estimator=ebpo",
        "algorithm.filter_groups.enable=True",
    ]
    with initialize_config_dir(config_dir=_config_dir(), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    apply_cpu_mode(config, overridden_keys(overrides))
    return config


def compose_config(model_dir: str, world: int, prompts_per_update: int, loss_agg_mode: str):
    """The config of one case: :func:`_composed`'s, with its mini-batch size (prompts) and ``loss_agg_mode``."""
    from omegaconf import open_dict

    config = copy.deepcopy(_composed(model_dir, world))
    with open_dict(config):
        config.actor_rollout_ref.actor.ppo_mini_batch_size = prompts_per_update
        config.actor_rollout_ref.actor.loss_agg_mode = loss_agg_mode
    return config


def make_batch(tokenizer_size: int):
    """The fixed batch (seeded): a verl ``DataProto`` as ``fit`` has it before the old log-probs."""
    from verl import DataProto

    gen = torch.Generator().manual_seed(0)
    rows = GROUPS * N
    prompt_lens = torch.randint(2, PROMPT_LEN + 1, (GROUPS,), generator=gen).repeat_interleave(N)
    response_lens = torch.randint(1, RESPONSE_LEN + 1, (rows,), generator=gen)
    prompts = torch.randint(4, tokenizer_size, (GROUPS, PROMPT_LEN), generator=gen).repeat_interleave(N, 0)
    responses = torch.randint(4, tokenizer_size, (rows, RESPONSE_LEN), generator=gen)
    prompt_mask = torch.arange(PROMPT_LEN).unsqueeze(0) >= (PROMPT_LEN - prompt_lens).unsqueeze(1)
    response_mask = torch.arange(RESPONSE_LEN).unsqueeze(0) < response_lens.unsqueeze(1)
    prompts = prompts * prompt_mask
    responses = responses * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1).long()
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    advantages = torch.randn(rows, 1, generator=gen) * response_mask
    uids = np.array([f"g{i // N}" for i in range(rows)], dtype=object)
    advantages[np.isin(uids, [f"g{g}" for g in DROPPED])] = 0.0  # what the estimator gives a filtered group
    batch = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "response_mask": response_mask.long(),
            "advantages": advantages.float(),
        },
        non_tensors={"uid": uids},
        meta_info={"temperature": 1.0, "global_token_num": attention_mask.sum(-1).tolist()},
    )
    return batch, torch.randn(rows, RESPONSE_LEN, generator=gen) * 0.1


class LocalWorkerGroup:
    """verl's worker group reduced to this process: a call dispatches rank's contiguous chunk of the batch
    (``make_nd_compute_dataproto_dispatch_fn``) and returns this rank's output (every rank holds the
    all-gathered metrics)."""

    def __init__(self, worker, rank: int, world: int) -> None:
        self.worker, self.rank, self.world = worker, rank, world

    def _chunk(self, data):
        from verl.utils import tensordict_utils as tu

        return tu.chunk_tensordict(data, self.world)[self.rank] if self.world > 1 else data

    def compute_log_prob(self, data):
        return self._gather(self.worker.compute_log_prob(self._chunk(data)))

    def update_actor(self, data):
        return self.worker.update_actor(self._chunk(data))

    def _gather(self, output):
        """Log-probs come back per rank; verl's collect concatenates them in rank order."""
        from verl.utils import tensordict_utils as tu

        if self.world == 1:
            return output
        parts = [None] * self.world
        torch.distributed.all_gather_object(parts, output)
        return tu.concat_tensordict(parts)


def worker_class(kind: str):
    from verl.workers.engine_workers import ActorRolloutRefWorker

    from ebpo.integrations.verl.cpu.worker import CPUActorRolloutRefWorker, init_gloo_process_group

    if kind == "ours":
        return CPUActorRolloutRefWorker

    class VerlCPUWorker(ActorRolloutRefWorker):  # verl's own worker; gloo as in the CPU mode
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            init_gloo_process_group()

    return VerlCPUWorker


def full_parameters(worker) -> dict[str, torch.Tensor]:
    out = {}
    for name, param in worker.actor.engine.module.named_parameters():
        value = param.full_tensor() if hasattr(param, "full_tensor") else param
        out[name] = value.detach().clone()
    return out


def run_case(model_dir: str, rank: int, world: int, spec: str) -> dict:
    from omegaconf import open_dict
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    import ebpo.integrations.verl as ev
    from ebpo.integrations.verl.trainer import EBPORayPPOTrainer

    name, kind, filtering, prompts_per_update, mode = spec.split(":")
    config = compose_config(model_dir, world, int(prompts_per_update), mode)
    worker = worker_class(kind)(config.actor_rollout_ref, role="actor")
    worker.init_model()
    trainer = object.__new__(EBPORayPPOTrainer)
    trainer.config = config
    trainer.actor_rollout_wg = LocalWorkerGroup(worker, rank, world)
    before = full_parameters(worker)

    from transformers import AutoTokenizer

    batch, noise = make_batch(len(AutoTokenizer.from_pretrained(model_dir)))
    old_log_prob, _ = RayPPOTrainer._compute_old_log_prob(trainer, batch)
    batch = batch.union(old_log_prob)
    batch.batch["ref_log_prob"] = batch.batch["old_log_probs"] + noise

    dropped = np.isin(batch.non_tensor_batch["uid"], [f"g{g}" for g in DROPPED])
    ev.HOLDER.reset()
    driver = EBPORayPPOTrainer._update_actor if kind == "ours" else RayPPOTrainer._update_actor
    metrics: list[dict] = []
    if filtering == "ebpo":
        ev.HOLDER.filtered_uids = {f"g{g}" for g in DROPPED}
        metrics.append(driver(trainer, batch).meta_info["metrics"])
    elif filtering in ("none", "zeroed"):
        if filtering == "zeroed":
            batch.batch["response_mask"][dropped] = 0
        metrics.append(driver(trainer, batch).meta_info["metrics"])
    elif filtering == "removed":
        kept = batch.select_idxs(np.flatnonzero(~dropped))
        rows = int(prompts_per_update) * N
        whole = len(kept) // rows * rows
        parts = [kept.slice(0, whole), kept.slice(whole, len(kept))]
        for part in parts:
            if len(part) == 0:
                continue
            with open_dict(config):
                config.actor_rollout_ref.actor.ppo_mini_batch_size = min(len(part), rows) // N
            metrics.append(driver(trainer, part).meta_info["metrics"])
    else:
        raise ValueError(f"unknown filter {filtering!r}")
    after = full_parameters(worker)
    return {
        "name": name,
        "before": before,
        "delta": {k: after[k] - before[k] for k in after},
        "metrics": metrics,
    }


def main(argv: list[str]) -> None:
    model_dir, out, *cases = argv
    os.environ.setdefault("VERL_PLATFORM", "cpu")
    import ebpo.integrations.verl  # noqa: F401  (the CPU platform, before verl resolves its device)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    results = [run_case(model_dir, rank, world, spec) for spec in cases]
    if rank == 0:
        torch.save(results, Path(out))


if __name__ == "__main__":
    main(sys.argv[1:])
