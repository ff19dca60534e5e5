"""What every task suite is: :class:`Task` (the registry of them is ``ebpo.tasks``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ebpo.data import Record


@dataclass(frozen=True)
class Task:
    """A verifiable task suite.

    Attributes:
        name: registry name.
        generate: ``(split, n, seed) -> list[Record]``; deterministic in ``seed``, splits disjoint.
        verify: ``(completion, answer) -> float`` in {0.0, 1.0}.
        topics: the suite's topic names (``Record.topic`` values).
        levels: the difficulty levels (``Record.level`` values).
        paper_topics: each topic's label among the paper's nine (docs/design.md §4), for topic-clustered sampling.
        splits: the split names ``generate`` accepts.
        reward: the ``ebpo.rewards`` name that scores it (``None``: the task's own name).
    """

    name: str
    generate: Callable[..., list[Record]]
    verify: Callable[[str, str], float]
    topics: Sequence[str]
    levels: Sequence[int]
    paper_topics: Mapping[str, str] = field(default_factory=dict)
    splits: Sequence[str] = ("train", "validation", "test")
    reward: str | None = None
