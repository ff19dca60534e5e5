"""The training side of the CPU mode: verl's FSDP engine on ``cpu``, gloo process groups, CPU device slots.

Imported only by processes that build workers (the task runner and the actor worker), never by
``VERL_USE_EXTERNAL_MODULES``: it imports verl's engines.

- Engine: verl registers its FSDP language-model engine for devices ``cuda`` and ``npu`` only
  (``EngineRegistry.register(..., device=[...])``); we register the same class, unchanged, for ``cpu``.
- :class:`CPUActorRolloutRefWorker`: our ``EBPOActorRolloutRefWorker`` whose only addition is that it opens
  the default process group itself, with ``gloo``, before verl does. verl's
  ``initialize_global_process_group_ray`` would ask for ``"cpu:gloo,<device>:<backend>"``, which with device
  ``cpu`` is ``"cpu:gloo,cpu:gloo"`` and torch rejects as a duplicate device; it skips when a group exists.
- :class:`CPUResourcePoolManager`: verl's ``ResourcePoolManager`` whose availability check counts our Ray
  resource (:data:`CPU_SLOT_RESOURCE`) instead of ``GPU``/``NPU`` (stock verl: "Total available GPUs 0").
"""

from __future__ import annotations

import os

import torch
from verl.single_controller.ray.base import ResourcePoolManager
from verl.workers.engine import EngineRegistry
from verl.workers.engine.fsdp import FSDPEngineWithLMHead

from ebpo.integrations.verl.cpu.platform import CPU_SLOT_RESOURCE
from ebpo.integrations.verl.worker import EBPOActorRolloutRefWorker

__all__ = ["CPUActorRolloutRefWorker", "CPUResourcePoolManager", "register_engine"]


def register_engine() -> None:
    """verl's FSDP language-model engine for device ``cpu`` (backends ``fsdp`` and ``fsdp2``; idempotent)."""
    registry = EngineRegistry._engines.get("language_model", {})
    if all("cpu" in registry.get(backend, {}) for backend in ("fsdp", "fsdp2")):
        return
    EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu")(
        FSDPEngineWithLMHead
    )


register_engine()


def init_gloo_process_group() -> None:
    """The default process group over gloo, from the RANK / WORLD_SIZE / MASTER_* env verl's Worker set."""
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(
            backend="gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"])
        )


class CPUActorRolloutRefWorker(EBPOActorRolloutRefWorker):
    """Our hybrid actor/rollout/ref worker (:mod:`ebpo.integrations.verl.worker`) on the CPU: a gloo process
    group, nothing else changed."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        torch.set_num_threads(int(os.environ.get("EBPO_CPU_TRAIN_THREADS", "1")))
        init_gloo_process_group()


class CPUResourcePoolManager(ResourcePoolManager):
    """verl's resource pools, checked against the CPU slots our entry point declares to Ray."""

    def _check_resource_available(self) -> None:
        import ray

        available = sum(
            node.get(CPU_SLOT_RESOURCE, 0)
            for node in ray._private.state.available_resources_per_node().values()
        )
        required = sum(n for nodes in self.resource_pool_spec.values() for n in nodes)
        if available < required:
            raise ValueError(
                f"CPU mode: {required} training processes requested (trainer.n_gpus_per_node x trainer.nnodes) "
                f"but Ray has {available} '{CPU_SLOT_RESOURCE}' slots; set trainer.n_gpus_per_node=1"
            )
