"""The built-in models by name: ``builtin:<recipe>`` (one per recipe of :data:`ebpo.models.recipes.RECIPES`;
``builtin`` and a null ``model.path`` are ``builtin:arith``, S1), and :func:`resolve_model`, the one reading of a
model name for every command: a built-in name goes to its recipe's build (``ebpo.models.build``), anything else
to a model, checkpoint or run directory (``ebpo.models.paths``)."""

from __future__ import annotations

import os
from pathlib import Path

from ebpo.errors import ConfigError
from ebpo.models import build
from ebpo.models.paths import FoundModel, find_model
from ebpo.models.recipes import RECIPES, Recipe

BUILTIN = "builtin"
"""How every command names a built-in base model: ``builtin:<recipe>`` (``builtin:gym`` is S2), and ``builtin``
alone (like a null ``model.path``) the ``arith`` recipe's, S1."""
DEFAULT_RECIPE = "arith"


def builtin_names() -> list[str]:
    """Every name a built-in model answers to: ``builtin`` and ``builtin:<recipe>`` for each recipe."""
    return [BUILTIN, *(f"{BUILTIN}:{name}" for name in RECIPES.names())]


def builtin_recipe(name: str | os.PathLike[str] | None) -> Recipe | None:
    """The recipe of the built-in model ``name`` names (None and ``builtin``: ``arith``; ``builtin:<recipe>``),
    or None when ``name`` is not such a name (a path). An unknown recipe is one ``ConfigError`` listing the
    valid names."""
    if name is None:
        return RECIPES.get(DEFAULT_RECIPE)
    text = os.fspath(name)
    if text == BUILTIN:
        return RECIPES.get(DEFAULT_RECIPE)
    prefix, sep, recipe = text.partition(":")
    if prefix != BUILTIN or not sep:
        return None
    if recipe not in RECIPES:
        raise ConfigError(
            f"unknown built-in model {text!r}; valid choices: {', '.join(builtin_names())} "
            f"({BUILTIN} = {BUILTIN}:{DEFAULT_RECIPE})"
        )
    return RECIPES.get(recipe)


def resolve_model(name: str | os.PathLike[str] | None, *, progress: bool = False) -> FoundModel:
    """The model a user means by ``name``, the one reading for every command that takes a model (``ebpo train
    model.path``, ``ebpo eval MODEL``, ``ebpo diagnose --model``, the TRL example's ``--model``, the verl
    launcher's ``actor_rollout_ref.model.path``):

    - None, ``builtin`` or ``builtin:<recipe>``: that recipe's default base model (:func:`builtin_recipe`), the
      shipped directory (built into the cache if it is not current: ``progress`` prints the build);
    - anything else: a model, checkpoint or run directory (``ebpo.models.paths.find_model``).

    A name it cannot read is one ``ConfigError``."""
    recipe = builtin_recipe(name)
    if recipe is not None:
        return FoundModel(build.build_base_model(recipe.config_cls(), progress=progress), None, "")
    assert name is not None
    return find_model(Path(os.fspath(name)).expanduser())


def builtin_hint() -> str:
    """What to add to a message about a model path: the names of the built-in models."""
    return f"or {BUILTIN}:<recipe> for a built-in model: {', '.join(builtin_names()[1:])}"
