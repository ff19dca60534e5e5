"""Task suites: verifiable problem generators with their verifiers, found by name.

```python
task = get_task("arith")
records = task.generate("train", 900, seed=0)      # list[ebpo.data.Record]
task.verify("... Answer: 42", records[0].answer)   # 1.0 or 0.0
task.topics, task.levels, task.paper_topics         # the grid and the topic -> paper-label map
gym = get_task("gym:chain_sum,gcd", gcd={"max_value": 50})   # a family: reasoning-gym datasets, with settings
```

Fixed names (``arith``) and families (``gym:<dataset>[,<dataset>...]``, ``ebpo.tasks.gym``) share one registry;
a family's task is built from the part after the colon and the options ``get_task`` is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ebpo.registry import Registry
from ebpo.tasks import arith
from ebpo.tasks.base import Task

_TASKS: Registry[Task] = Registry("task")


def register_task(task: Task) -> Task:
    """Add ``task`` to the registry under ``task.name`` (a second task with the same name raises)."""
    return _TASKS.register(task.name, task)


def register_task_family(prefix: str, factory: Callable[..., Task], *, pattern: str) -> None:
    """Tasks named ``<prefix>:<argument>``, built by ``factory(argument, **options)`` (``ebpo.registry``)."""
    _TASKS.register_family(prefix, factory, pattern=pattern)


def list_tasks() -> list[str]:
    """Registered task names and families (``gym:<dataset>[,<dataset>...]``), sorted."""
    return _TASKS.names(families=True)


def get_task(name: str, **options: Any) -> Task:
    """The task registered as ``name``, or built by its family with ``options`` (a family's settings, e.g. a gym
    dataset's generator settings); an unknown name, or a bad option, raises ``ValueError`` in one line."""
    return _TASKS.get(name, **options)


def task_options(text: str | None, flag: str) -> dict[str, Any]:
    """The task options a flag gives as a YAML mapping (``--task-options '{chain_sum: {max_terms: 3}}'``); empty
    for none; anything but a mapping is one ``ValueError`` naming the flag."""
    if text is None or not text.strip():
        return {}
    import yaml

    try:
        options = yaml.safe_load(text)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or "not valid YAML"
        raise ValueError(
            f"{flag}: {problem} in {text!r}; give a mapping like '{{chain_sum: {{max_terms: 3}}}}'"
        ) from None
    if not isinstance(options, dict) or not all(isinstance(key, str) for key in options):
        raise ValueError(f"{flag}: expected a mapping like '{{chain_sum: {{max_terms: 3}}}}', got {text!r}")
    return options


def task_options_text(options: Mapping[str, Any]) -> str:
    """``options`` as one line of YAML (a flow mapping, ``{}`` for none) that :func:`task_options` and a
    ``data.task_options=...`` override read back as they were, integer level keys included."""
    import yaml

    return yaml.safe_dump(dict(options), default_flow_style=True, width=1 << 30).strip()


def _gym_task(datasets: str, **settings: Any) -> Task:
    from ebpo.tasks.gym import make_task

    return make_task(datasets, **settings)


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

register_task_family("gym", _gym_task, pattern="<dataset>[,<dataset>...]")

__all__ = [
    "Task",
    "get_task",
    "list_tasks",
    "register_task",
    "register_task_family",
    "task_options",
    "task_options_text",
]
