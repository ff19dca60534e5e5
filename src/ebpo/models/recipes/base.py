"""What every base-model recipe is: :class:`Recipe` (its config class, how it is built and measured, the task it
answers), the registry :data:`RECIPES` (``arith`` = S1, ``gym`` = S2; a recipe registers itself where it is
defined), and the helpers the recipes share (:func:`check_recipe_fields`, :func:`grid_of`).

A recipe's config is a frozen dataclass whose ``key()`` names a build (12 hex digits over the config, the
recipe's format version and a fingerprint of its training data); the build machinery that turns any recipe into
a model directory, the cache and the shipped weights is ``ebpo.models.build``.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ebpo.registry import Registry

MODELS_DIR = Path(__file__).resolve().parents[1]
"""``ebpo/models``: the shipped builds sit there as package data (``arith_base/``, ``gym_base/``)."""


@dataclass(frozen=True)
class Recipe:
    """A kind of base model: its config class (whose ``key()`` names a build) and how it is built and measured.

    Attributes:
        name: the registry name, also the cache directory's prefix (``<name>-<key>``).
        config_cls: the recipe's dataclass; its default instance is the shipped model.
        shipped_dir: where the default build ships in the package.
        new_model: ``config -> (model, tokenizer)``, seeded, before training.
        train: ``(model, tokenizer, config, *, progress, stop_after) -> losses``.
        grid: ``(model, tokenizer, config, *, split) -> grid`` (``ebpo.models.grid``), the build's measurement.
        format_version: recorded in ``build_info.json``.
        what: how progress lines name it.
        task: the task (``ebpo.tasks``) the model answers: what ``ebpo eval builtin:<name>``, ``ebpo diagnose
            --model builtin:<name>`` and the TRL example draw problems from when not told otherwise.
        task_options: that task's generator settings (``data.task_options``).
    """

    name: str
    config_cls: type
    shipped_dir: Path
    new_model: Callable[[Any], tuple[Any, Any]]
    train: Callable[..., list[float]]
    grid: Callable[..., dict[str, Any]]
    format_version: int
    what: str
    task: str = "arith"
    task_options: Mapping[str, Any] = field(default_factory=dict)


RECIPES: Registry[Recipe] = Registry("base-model recipe")


def recipe_of(config: Any) -> Recipe:
    """The recipe whose config class ``config`` is an instance of."""
    for name in RECIPES.names():
        recipe = RECIPES.get(name)
        if type(config) is recipe.config_cls:
            return recipe
    raise TypeError(
        f"no base-model recipe takes a {type(config).__name__}; recipes: {', '.join(RECIPES.names())}"
    )


def default_config(recipe: str = "arith") -> Any:
    """The default config (the shipped model) of the recipe named ``recipe``."""
    return RECIPES.get(recipe).config_cls()


def check_recipe_fields(config: Any, positive: Sequence[str]) -> None:
    """What every recipe's ``__post_init__`` starts with: each field coerced to its annotated type, then the
    ``positive`` fields checked >= 1 and the step counts >= 0, each a ``ValueError`` naming the field.

    One recipe, one key: ``lr=1`` and ``lr=1.0``, ``(1, 0.9)`` and ``[1.0, 0.9]`` are the same recipe, but their
    JSON (what ``key()`` hashes) differs; hence the coercion."""
    kind_name = type(config).__name__
    for name, hint in typing.get_type_hints(type(config)).items():
        value = getattr(config, name)
        if hint is float and isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(config, name, float(value))
        elif typing.get_origin(hint) is tuple and isinstance(value, (tuple, list)):
            kind = typing.get_args(hint)[0]
            if kind is int and not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                raise ValueError(f"{kind_name}.{name} needs whole numbers, got {value}")
            object.__setattr__(config, name, tuple(float(v) if kind is float else v for v in value))
    for name in positive:
        if getattr(config, name) < 1:
            raise ValueError(f"{kind_name}.{name} must be >= 1, got {getattr(config, name)}")
    for name in ("steps", "clean_steps", "warmup_steps", "eval_per_cell"):
        if getattr(config, name) < 0:
            raise ValueError(f"{kind_name}.{name} must be >= 0, got {getattr(config, name)}")


def grid_of(evaluate: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """A recipe's grid from its ``evaluate_grid`` (``ebpo.models.grid``'s for S1, :func:`ebpo.models.recipes.gym.evaluate_grid` for S2), read with the
    recipe's grid settings."""

    def grid(model, tokenizer, config: Any, *, split: str, progress: bool = False) -> dict[str, Any]:
        return evaluate(
            model,
            tokenizer,
            split=split,
            per_cell=config.eval_per_cell,
            samples=config.eval_samples,
            temperature=config.eval_temperature,
            seed=config.seed,
            max_new_tokens=config.max_new_tokens,
            progress=progress,
        )

    return grid
