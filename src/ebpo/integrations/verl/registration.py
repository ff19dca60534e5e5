"""What ``import ebpo.integrations.verl`` does in every verl process: our package's ``verl.plugins`` entry
point names this module, which verl imports at ``import verl`` (``VERL_USE_EXTERNAL_PLUGINS``, default ``auto``);
``VERL_USE_EXTERNAL_MODULES=ebpo.integrations.verl`` does the same without the package metadata.

1. Fails with one line if this environment cannot run verl's workers (TRL 1.x installed: see
   :mod:`ebpo.integrations.compat`). verl's plugin loader swallows import errors (it logs them at debug
   level), so the line is printed on stderr before the error is raised.
2. Registers verl platform ``cpu`` (opt-in: used only under ``VERL_PLATFORM=cpu``), before anything asks verl
   for its platform; under ``VERL_PLATFORM=cpu`` also the ``ebpo_cpu`` rollout backend.
3. Imports the user's plugins (:func:`ebpo.plugins.load_plugins`: installed ``ebpo.plugins`` entry points, and
   ``$EBPO_PLUGINS``, which our launcher sets for every Ray process of a run from its ``--plugins``), then
   registers every estimator of ebpo's registry, theirs included, in verl's advantage registry
   (:data:`REGISTERED`). A plugin that fails prints its one line on stderr before the error is raised.
4. In a process of ``python -m ebpo.integrations.verl`` (``EBPO_VERL_QUIET=1``): the log filters of :mod:`.quiet`.

Steps 2 and 4 act only in runs of our launcher that ask for them. Cheap by design: verl's ``core_algos`` and platform registry, no Ray trainer, no workers, no engines; nothing
of verl's is patched.
"""

from __future__ import annotations

import logging

from ebpo.integrations.compat import check_environment

logger = logging.getLogger(__name__)

try:
    check_environment()
except ImportError as error:
    logger.error(f"ebpo.integrations.verl: {error}")
    raise

from ebpo.integrations.verl.quiet import install as quiet_log  # noqa: E402
from ebpo.integrations.verl.quiet import quiet_requested  # noqa: E402

if quiet_requested():  # a run of python -m ebpo.integrations.verl (not VERBOSE=1): repeated messages once
    quiet_log()

from ebpo.integrations.verl.cpu.platform import cpu_mode_enabled, register_platform  # noqa: E402

register_platform()
if cpu_mode_enabled():
    from ebpo.integrations.verl.cpu.rollout import register_rollout

    register_rollout()

from ebpo.plugins import PluginError, load_plugins  # noqa: E402

try:
    load_plugins()
except PluginError as error:
    logger.error(f"ebpo.integrations.verl: {error}")
    raise

from ebpo.integrations.verl.estimators import HOLDER, register_with_verl  # noqa: E402

#: the estimator names this process serves in verl's registry (``estimators.SERVED``: a later
#: :func:`register_with_verl`, after a plugin registered more, updates it)
REGISTERED: list[str] = register_with_verl()


def register_plugins(names: list[str]) -> list[str]:
    """Import the plugins ``names`` (``--plugins`` of our launcher) and serve their estimators in verl's
    registry too; returns the names resolved (files absolute), for the run's Ray processes
    (``$EBPO_PLUGINS``)."""
    resolved = load_plugins(names)
    register_with_verl()
    return resolved


def _launcher_warning(algorithm: object) -> None:
    """The warning about verl's launcher; its module (verl's checkpoint callback) is imported on first use."""
    from ebpo.integrations.verl.callback import warn_about_launcher

    warn_about_launcher({"algorithm": algorithm}, callback=False)


HOLDER.warning = _launcher_warning
