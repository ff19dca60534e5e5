"""Disjoint splits by the hash of a prompt's text, shared by the generated task suites (``arith``, ``gym``).

A problem belongs to the split its prompt's SHA-256 bucket falls in, 60 / 20 / 10 / 10 into ``sft`` (a base
model's supervised fine-tuning pool), ``train`` (what RL draws from), ``validation`` and ``test``. A generator
keeps only the problems that hash into the split asked for, so the same prompt text never appears in two
splits, whatever the seeds or the generator's settings.
"""

from __future__ import annotations

import hashlib

SPLITS: dict[str, tuple[int, int]] = {
    "sft": (0, 60),
    "train": (60, 80),
    "validation": (80, 90),
    "test": (90, 100),
}
"""Split -> half-open range of hash buckets in [0, 100)."""
SPLIT_ALIASES: dict[str, str] = {"val": "validation", "valid": "validation", "eval": "test"}


def split_of(prompt: str) -> str:
    """The split a prompt belongs to: bucket = SHA-256(prompt) mod 100, 60/20/10/10 into sft / train /
    validation / test (:data:`SPLITS`)."""
    bucket = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "big") % 100
    for name, (lo, hi) in SPLITS.items():
        if lo <= bucket < hi:
            return name
    raise AssertionError(f"bucket {bucket} outside every split")  # SPLITS covers [0, 100)


def check_split(split: str, task: str) -> str:
    """``split`` (or its alias) as one of :data:`SPLITS`; else ``ValueError`` naming ``task`` and the valid ones."""
    split = SPLIT_ALIASES.get(split, split)
    if split not in SPLITS:
        raise ValueError(
            f"unknown {task} split {split!r}; valid: {', '.join(SPLITS)} (aliases: {', '.join(SPLIT_ALIASES)})"
        )
    return split
