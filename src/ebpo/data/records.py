"""The one record type every task, loader, sampler and evaluator agrees on."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class Record:
    """One verifiable problem.

    Attributes:
        id: stable identifier, unique within a dataset (also the group id of its sampled responses).
        prompt: the text given to the model (before any chat template).
        answer: the gold final answer, as a string (verified by a reward function).
        topic: optional cluster label (one of the paper's nine topics, or a task's own topic name).
        difficulty: optional base-model pass rate in [0, 1] (``ebpo annotate difficulty``).
        source: optional name of the dataset or benchmark the record comes from.
        level: optional integer difficulty level given by the generator (``arith``: 1..5).
        extra: anything else a loader wants to keep (not used by the library).
    """

    id: str
    prompt: str
    answer: str
    topic: str | None = None
    difficulty: float | None = None
    source: str | None = None
    level: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if not out["extra"]:
            out.pop("extra")
        return out

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Record:
        names = {f.name for f in fields(cls)}
        known = {k: v for k, v in row.items() if k in names}
        extra = {k: v for k, v in row.items() if k not in names}
        if extra:
            known.setdefault("extra", {}).update(extra)
        return cls(**known)
