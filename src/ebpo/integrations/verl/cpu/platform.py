"""verl's platform abstraction for a machine without an accelerator (``VERL_PLATFORM=cpu``).

Registered through ``verl.plugin.platform.PlatformRegistry`` under the name ``cpu``. verl selects it only
when ``VERL_PLATFORM=cpu`` is set (its own override variable; our entry point sets it for
``trainer.device=cpu``): auto-detection never picks it, so GPU machines are unaffected. The CPU mode is
opt-in. What it answers, and why:

- ``device_name`` ``cpu`` and ``current_device()`` ``"cpu"`` (what ``torch.cpu.current_device()`` returns): verl
  moves tensors with ``.to(get_device_id())`` and builds ``torch.device(get_device_id())``, which an integer
  0 would turn into ``cuda:0``.
- ``communication_backend_name`` ``gloo``: the only CPU collective backend.
- ``ray_resource_name`` :data:`CPU_SLOT_RESOURCE`: a custom Ray resource that our entry point declares
  (one per training process), so verl's placement groups reserve "device slots" without GPUs.
- ``device_module``: :data:`CPU_DEVICE_MODULE`, ``torch.cpu`` plus the memory statistics verl logs
  (``max_memory_allocated`` ...), which ``torch.cpu`` does not have; they report 0.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

__all__ = ["CPU_SLOT_RESOURCE", "CPU_DEVICE_MODULE", "PlatformCPU", "register_platform", "cpu_mode_enabled"]

CPU_SLOT_RESOURCE = "ebpo_cpu_slot"


def cpu_mode_enabled() -> bool:
    """True when this process was asked for verl's CPU platform (``VERL_PLATFORM=cpu``)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu"


class _CPUDeviceModule:
    """``torch.cpu`` with the accelerator-module calls verl makes and ``torch.cpu`` lacks (no-ops / zeros)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "CPU"  # verl's FLOPs table has a "CPU" entry (MFU is then reported against it)

    @staticmethod
    def set_device(device: Any) -> None:
        return None

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def max_memory_allocated(device: Any = None) -> int:
        return 0

    max_memory_reserved = memory_allocated = memory_reserved = max_memory_allocated

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        return None

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        import psutil

        memory = psutil.virtual_memory()
        return memory.available, memory.total

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)


CPU_DEVICE_MODULE = _CPUDeviceModule()


class PlatformCPU(PlatformBase):
    """verl platform for CPU-only training (tests and laptops); see the module docstring."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        # verl annotates a ModuleType; it only reads attributes, which this stand-in for torch.cpu provides
        return CPU_DEVICE_MODULE  # type: ignore[return-value]

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return cpu_mode_enabled()  # never auto-detected: the CPU mode is opt-in

    # verl annotates int, but 0 would mean cuda:0 (module docstring). unused-ignore: without verl
    # installed (`make lint` runs in .venv) the base class is Any and there is nothing to ignore
    def current_device(self) -> str:  # type: ignore[override, unused-ignore]
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "EBPO_CPU_VISIBLE_SLOTS"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return CPU_SLOT_RESOURCE

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def register_platform() -> None:
    """Register :class:`PlatformCPU` as verl platform ``cpu`` (idempotent)."""
    if PlatformRegistry.get("cpu") is not PlatformCPU:
        PlatformRegistry.register(platform="cpu")(PlatformCPU)
