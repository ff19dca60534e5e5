"""The names the verl launcher (``ebpo.integrations.verl.main``) and its tests import from here; each lives in its
own room: :mod:`ebpo.models.names` (the built-in models by name), :mod:`ebpo.models.recipes` (the recipes),
:mod:`ebpo.models.build` (building them)."""

from ebpo.models.names import builtin_recipe, resolve_model
from ebpo.models.recipes.gym import SHIPPED_DIR as GYM_SHIPPED_DIR

__all__ = ["GYM_SHIPPED_DIR", "builtin_recipe", "resolve_model"]
