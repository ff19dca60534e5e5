"""EBPO inside verl 0.9: estimators, checkpointed state, metrics, clustered samplers, CPU mode.

Importing this package runs :mod:`.registration`: it checks the environment (TRL 1.x breaks verl's workers),
registers the opt-in CPU platform and our estimators in verl's advantage registry. verl imports it in every
process through its plugin group (``verl.plugins``, our package's entry point; also
``VERL_USE_EXTERNAL_MODULES=ebpo.integrations.verl``). That imports verl's ``core_algos`` only; the Ray trainer,
workers and engines load when one of their names is first used.

Modules, one concern each:

| module | what |
|---|---|
| :mod:`.estimators` | registered advantage functions, :class:`EstimatorHolder` / :data:`HOLDER`, ``observe_groups`` |
| :mod:`.registration` | what importing this package does (:data:`REGISTERED`) |
| :mod:`.checkpoint` | ``global_step_N/ebpo_estimator.pt`` save / load / resume folder |
| :mod:`.callback` | verl's own launcher: :class:`EBPOCheckpointCallback`, the one warning about what it lacks |
| :mod:`.samplers` | :class:`TopicSampler`, :class:`DifficultySampler` for ``data.sampler`` |
| :mod:`.data` | our records -> verl's parquet rows |
| :mod:`.rewards` | ``compute_score`` for ``reward.custom_reward_function`` over ``ebpo.rewards`` |
| :mod:`.v1` | verl's v1 trainer (the default): :class:`EBPOTrainerSync`, :class:`EBPOTrainerColocateAsync`, :class:`EBPOTrainerSeparateAsync`, :class:`EBPOReplayBuffer` (:class:`EBPOReplayBufferAsync` in the async modes) |
| :mod:`.trainer` | :class:`EBPORayPPOTrainer` (verl's legacy ``RayPPOTrainer`` subclass, ``trainer.use_v1=false``) |
| :mod:`.filtering` | the legacy trainer's actor batch of a step with filtered groups (the driver's half) |
| :mod:`.worker` | our actor worker: each mini-batch normalised by the rows it trains (the workers' half) |
| :mod:`.main` | ``python -m ebpo.integrations.verl``: Hydra entry point, task runners (v1 and legacy) |
| :mod:`.cpu` | the opt-in CPU mode (``trainer.device=cpu``): platform, engine, rollout, config |
"""

from __future__ import annotations

import importlib
from typing import Any

from ebpo.integrations import ESTIMATOR_STATE_FILE
from ebpo.integrations.verl.registration import REGISTERED

_LAZY = {
    # estimators (already imported by registration)
    "DEFAULT_CLUSTER_KEY": "estimators",
    "EstimatorHolder": "estimators",
    "HOLDER": "estimators",
    "make_verl_estimator": "estimators",
    "register_with_verl": "estimators",
    "estimator_options": "estimators",
    "column_values": "estimators",
    "observe_groups": "estimators",
    # checkpoints
    "save_estimator_state": "checkpoint",
    "load_estimator_state": "checkpoint",
    "restore_estimator_state": "checkpoint",
    "resolve_resume_folder": "checkpoint",
    "SAMPLER_STATE_FILE": "checkpoint",
    "save_sampler_state": "checkpoint",
    "load_sampler_state": "checkpoint",
    # verl's own launcher
    "EBPOCheckpointCallback": "callback",
    # samplers
    "ClusteredSampler": "samplers",
    "TopicSampler": "samplers",
    "DifficultySampler": "samplers",
    "create_sampler": "samplers",
    # data
    "record_to_verl_row": "data",
    "write_verl_parquet": "data",
    # trainers (import verl's Ray trainers)
    "EBPORayPPOTrainer": "trainer",
    "EBPOTrainerSync": "v1",
    "EBPOTrainerColocateAsync": "v1",
    "EBPOTrainerSeparateAsync": "v1",
    "EBPOReplayBuffer": "v1",
    "EBPOReplayBufferAsync": "v1",
}

__all__ = ["ESTIMATOR_STATE_FILE", "REGISTERED", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
