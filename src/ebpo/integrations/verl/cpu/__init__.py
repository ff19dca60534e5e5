"""Opt-in CPU mode for verl 0.9 (tests and laptops), through verl's extension points only.

Switched on by ``trainer.device=cpu`` on ``python -m ebpo.integrations.verl``, which sets ``VERL_PLATFORM=cpu``
in every Ray process. Pieces: :mod:`.platform` (verl platform ``cpu``: gloo, CPU slots), :mod:`.rollout`
(rollout backend ``ebpo_cpu``: Hugging Face sampling with the actor's current weights), :mod:`.worker`
(FSDP engine on ``cpu``, gloo process group, resource pools), :mod:`.config` (the settings a CPU run needs).
"""

from ebpo.integrations.verl.cpu.platform import CPU_SLOT_RESOURCE, cpu_mode_enabled, register_platform

__all__ = ["CPU_SLOT_RESOURCE", "cpu_mode_enabled", "register_platform"]
