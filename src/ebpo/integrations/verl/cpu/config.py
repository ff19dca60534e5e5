"""What ``trainer.device=cpu`` changes in verl's config and in the environment of every Ray process.

Each setting below is applied unless the command line sets that key itself (a user's override wins):
verl's defaults assume a GPU node (8 GPUs, vLLM, 8 agent-loop and 8 reward workers, flash-attention
remove-padding, ``torch.compile``, bf16 FSDP compute), and on a 2-core laptop every extra Ray process costs
seconds of CPU to import torch and verl.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from ebpo.integrations.verl.cpu.platform import CPU_SLOT_RESOURCE
from ebpo.integrations.verl.estimators import to_plain

__all__ = ["CPU_DEFAULTS", "CPU_ENV", "apply_cpu_mode", "legacy_cpu_refusal", "overridden_keys", "ray_cpus"]

FP32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}

#: key -> value set for a CPU run (why, in order: our rollout backend; one process per replica and worker;
#: FSDP2 (``fully_shard``) runs on CPU tensors; no flash-attention varlen kernels on the CPU; no compile;
#: PyTorch's sdpa attention, not flash-attention; fp32 compute (CPU bf16 autocast is slow and lossy); small Ray footprint; console logging; one TransferQueue storage unit).
CPU_DEFAULTS: dict[str, Any] = {
    "actor_rollout_ref.rollout.name": "ebpo_cpu",
    "actor_rollout_ref.rollout.mode": "async",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
    "actor_rollout_ref.rollout.data_parallel_size": 1,
    "actor_rollout_ref.rollout.agent.num_workers": 1,
    "actor_rollout_ref.rollout.checkpoint_engine.backend": "naive",
    "actor_rollout_ref.rollout.load_format": "auto",
    "actor_rollout_ref.actor.strategy": "fsdp2",
    "actor_rollout_ref.actor.fsdp_config.strategy": "fsdp2",
    "actor_rollout_ref.ref.strategy": "fsdp2",
    "actor_rollout_ref.ref.fsdp_config.strategy": "fsdp2",
    "actor_rollout_ref.model.use_remove_padding": False,
    "actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
    "actor_rollout_ref.actor.use_torch_compile": False,
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile": False,
    "actor_rollout_ref.ref.fsdp_config.use_torch_compile": False,
    "actor_rollout_ref.actor.fsdp_config.mixed_precision": FP32,
    "actor_rollout_ref.ref.fsdp_config.mixed_precision": FP32,
    "data.dataloader_num_workers": 0,
    "trainer.n_gpus_per_node": 1,
    "trainer.nnodes": 1,
    "reward.num_workers": 1,
    "trainer.logger": ["console"],
    "ray_kwargs.ray_init.num_cpus": 6,  # for one training process; apply_cpu_mode scales it (ray_cpus)
    "ray_kwargs.ray_init.include_dashboard": False,
    "ray_kwargs.ray_init.object_store_memory": 256 * 1024 * 1024,
    # v1 trainer: one TransferQueue storage process (verl's default, 8, is sized for a GPU node)
    "transfer_queue.backend.SimpleStorage.num_data_storage_units": 1,
}

#: environment of every Ray process of a CPU run (the driver's, which Ray's processes inherit, and
#: ``runtime_env``): verl's platform override, and our module loaded by ``import verl`` everywhere; TransferQueue
#: aggregates tensors with one torch thread, as every other process of the run computes (its default, 8, exceeds a
#: laptop's cores and it warns at every call)
CPU_ENV = {
    "VERL_PLATFORM": "cpu",
    "RAY_DEDUP_LOGS": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "TQ_NUM_THREADS": "1",
}


def legacy_cpu_refusal(verl_version: str | None = None, flash_attn: bool | None = None) -> str | None:
    """Why verl's legacy trainer cannot run in the CPU mode with this verl, or None where it can.

    verl 0.9.0's legacy trainer unpads every batch before its old-log-prob pass with flash-attn's
    ``unpad_input`` (verl 0.9.1 falls back to its own on a machine without flash-attn), and flash-attn does
    not install on a CPU machine. ``verl_version`` / ``flash_attn``: the installed verl's version and whether
    flash-attn imports (looked up when not given)."""
    import importlib.util
    from importlib import metadata

    version = verl_version if verl_version is not None else metadata.version("verl")
    has_flash = flash_attn if flash_attn is not None else importlib.util.find_spec("flash_attn") is not None
    if version.startswith("0.9.0") and not has_flash:
        return (
            f"trainer.device=cpu with trainer.use_v1=false needs flash-attn on verl {version} (its legacy trainer "
            "unpads batches with flash-attn's unpad_input); drop trainer.use_v1=false (verl's v1 trainer runs on "
            "the CPU) or use verl 0.9.1"
        )
    return None


def overridden_keys(overrides: Iterable[str]) -> set[str]:
    """Config keys a Hydra command line sets (``a.b=1``, ``+a.b=1``, ``++a.b=1``, ``~a.b``)."""
    keys = set()
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("+~")
        keys.add(key)
    return keys


def ray_cpus(config: Any) -> int:
    """Ray's logical CPUs for a CPU run: what its actors reserve. verl places each training process in a
    bundle of 3 CPUs (``ResourcePoolManager.max_colocate_count``); the task runner and every agent-loop and
    reward worker take 1; our rollout servers take none. 6 for one training process and one worker each."""
    slots = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
    workers = int(config.actor_rollout_ref.rollout.agent.num_workers) + int(config.reward.num_workers)
    return 1 + 3 * slots + workers


def _with_module(value: str | None, module: str) -> str:
    modules = [m for m in (value or "").split(",") if m]
    return ",".join(modules if module in modules else [*modules, module])


def apply_cpu_mode(config: Any, user_keys: Iterable[str] = ()) -> list[str]:
    """Apply :data:`CPU_DEFAULTS` (except keys in ``user_keys``) and :data:`CPU_ENV`; returns the keys set.

    Also declares one Ray resource :data:`CPU_SLOT_RESOURCE` per training process and makes every Ray
    process import ``ebpo.integrations.verl`` (``VERL_USE_EXTERNAL_MODULES``), where the CPU platform is
    registered before verl resolves its platform.
    """
    from omegaconf import OmegaConf, open_dict

    user = set(user_keys)
    applied = []
    with open_dict(config):
        for key, value in CPU_DEFAULTS.items():
            parent, _, leaf = key.rpartition(".")
            if key in user or (parent and OmegaConf.select(config, parent) is None):
                continue
            OmegaConf.update(config, key, value, merge=False, force_add=True)
            applied.append(key)
        slots = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
        init = config.ray_kwargs.ray_init
        if "ray_kwargs.ray_init.num_cpus" in applied:
            init.num_cpus = ray_cpus(config)
        resources = dict(to_plain(init.get("resources", None)) or {})
        resources.setdefault(CPU_SLOT_RESOURCE, slots)
        init.resources = resources
        env = dict(CPU_ENV)
        env["VERL_USE_EXTERNAL_MODULES"] = _with_module(
            os.environ.get("VERL_USE_EXTERNAL_MODULES"), "ebpo.integrations.verl"
        )
        os.environ.update(env)
        runtime_env = init.get("runtime_env", None)
        if runtime_env is None:
            init.runtime_env = {}
            runtime_env = init.runtime_env
        env_vars = dict(to_plain(runtime_env.get("env_vars", None)) or {})
        runtime_env.env_vars = {**env, **env_vars}
        config.trainer.device = "cpu"
    return applied
