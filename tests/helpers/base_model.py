"""The arith base model's recipe at a size that builds in a few seconds, for the tests of ``ebpo.models``
and its recipes."""

from __future__ import annotations

from ebpo.models.recipes import arith as recipe

# A build that takes a few seconds: a 2-layer width-32 model, 40 steps, one validation problem per cell.
TINY = recipe.BaseModelConfig(
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    steps=40,
    batch_size=16,
    lr=1e-2,
    warmup_steps=5,
    train_problems=450,
    eval_per_cell=1,
    eval_samples=2,
    max_new_tokens=6,
)

# ``ebpo base-model``'s flags for a build of a few steps with no grid (the command's own tests, the console's).
TINY_COMMAND = [
    "base-model",
    "--hidden-size",
    "32",
    "--num-layers",
    "1",
    "--num-heads",
    "2",
    "--steps",
    "3",
    "--batch-size",
    "8",
    "--train-problems",
    "45",
    "--eval-per-cell",
    "0",
]
