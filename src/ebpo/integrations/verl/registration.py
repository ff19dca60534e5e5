"""What ``import ebpo.integrations.verl`` does in every verl process (``VERL_USE_EXTERNAL_MODULES``).

1. Fails with one line if this environment cannot run verl's workers (TRL 1.x installed: see
   :mod:`ebpo.integrations.compat`).
2. Registers verl platform ``cpu`` (opt-in: used only under ``VERL_PLATFORM=cpu``), before anything asks verl
   for its platform; under ``VERL_PLATFORM=cpu`` also the ``ebpo_cpu`` rollout backend.
3. Registers our estimators in verl's advantage registry (:data:`REGISTERED`).

Cheap by design: verl's ``core_algos`` and platform registry, no Ray trainer, no workers, no engines.
"""

from __future__ import annotations

from ebpo.integrations.compat import check_environment

check_environment()

from ebpo.integrations.verl.cpu.platform import cpu_mode_enabled, register_platform  # noqa: E402

register_platform()
if cpu_mode_enabled():
    from ebpo.integrations.verl.cpu.rollout import register_rollout

    register_rollout()

from ebpo.integrations.verl.estimators import register_with_verl  # noqa: E402

#: the estimator names this process serves in verl's registry
REGISTERED: list[str] = register_with_verl()
