"""The built-in models' recipes, one module a recipe, side by side: ``arith`` (S1: a character-level Llama on
the arith task, :mod:`ebpo.models.recipes.arith`) and ``gym`` (S2: a Qwen3 with a BPE tokenizer and a chat template
on a reasoning-gym mixture, :mod:`ebpo.models.recipes.gym`), each a :class:`Recipe` of :data:`RECIPES`
(:mod:`ebpo.models.recipes.base`). Importing this package registers both."""

from ebpo.models.recipes import arith, gym  # each registers its recipe in RECIPES
from ebpo.models.recipes.base import RECIPES, Recipe, check_recipe_fields, default_config, grid_of, recipe_of

__all__ = [
    "RECIPES",
    "Recipe",
    "arith",
    "check_recipe_fields",
    "default_config",
    "grid_of",
    "gym",
    "recipe_of",
]
