"""Task suites: verifiable problem generators with their verifiers, found by name.

```python
task = get_task("arith")
records = task.generate("train", 900, seed=0)      # list[ebpo.data.Record]
task.verify("... Answer: 42", records[0].answer)   # 1.0 or 0.0
task.topics, task.levels, task.paper_topics         # the grid and the topic -> paper-label map
```
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ebpo.data import Record
from ebpo.registry import Registry
from ebpo.tasks import arith


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
    """

    name: str
    generate: Callable[..., list[Record]]
    verify: Callable[[str, str], float]
    topics: Sequence[str]
    levels: Sequence[int]
    paper_topics: Mapping[str, str] = field(default_factory=dict)
    splits: Sequence[str] = ("train", "validation", "test")


_TASKS: Registry[Task] = Registry("task")


def register_task(task: Task) -> Task:
    """Add ``task`` to the registry under ``task.name`` (a second task with the same name raises)."""
    return _TASKS.register(task.name, task)


def list_tasks() -> list[str]:
    """Registered task names, sorted."""
    return _TASKS.names()


def get_task(name: str) -> Task:
    """The task registered as ``name``; an unknown name raises ``ValueError`` listing the valid ones."""
    return _TASKS.get(name)


register_task(
    Task(
        name="arith",
        generate=arith.generate,
        verify=arith.verify,
        topics=arith.TOPICS,
        levels=arith.LEVELS,
        paper_topics=arith.PAPER_TOPICS,
        splits=tuple(arith.SPLITS),
    )
)

__all__ = ["Task", "get_task", "list_tasks", "register_task"]
