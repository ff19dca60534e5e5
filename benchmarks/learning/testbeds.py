"""The testbeds a matrix runs on: a base model and the task it is trained, validated and tested on.

- ``s1`` (the default): the shipped ``arith`` base model S1 (docs/base_model.md) on ``arith``, as
  ``src/ebpo/configs/ebpo.yaml`` names them; it adds no setting, so its runs keep the keys they were published with.
- ``s2``: the gym base model S2 (a Qwen3 with a byte-level BPE tokenizer and a ChatML template,
  docs/gym_base_model.md) on its reasoning-gym mixture: ``data.task`` = ``ebpo.models.recipes.gym.TASK`` and
  ``data.task_options`` = its ``MIXTURE`` (eight datasets, three levels each), so training prompts come from the
  mixture's ``train`` split and validation from its ``validation`` split, as ``ebpo train`` draws them.

Whatever the testbed, a run is tested on the test split of the task it trained on (:func:`benchmark_of`:
``arith``'s 450 test problems, or the gym benchmark of the mixture, 450 problems of its test split at seed 0), so
the test set follows the run's config and enters no key; its answers are sorted by the task family's kinds
(:data:`ANSWER_KINDS`). Topics and levels are the records' own: ``arith``'s nine topics and five levels, or the
gym datasets and the mixture's three levels.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ebpo.registry import Registry

if TYPE_CHECKING:  # pragma: no cover
    from ebpo.data import Record
    from ebpo.eval.benchmarks import BenchmarkSpec


@dataclass(frozen=True)
class Testbed:
    """A base model and its task.

    Attributes:
        name: the ``--testbed`` choice.
        title: what it is, for help and logs.
        settings: ``() -> key=value`` trainer overrides every run takes (before ``--set``'s): the task.
        model: ``() -> path`` of its base model, built or not (None: ``src/ebpo/configs/ebpo.yaml``'s model).
        build: ``() -> path``: builds the base model if it is missing (None: the ``arith`` recipe's default).
        tag_prefix: put before the default ``--tag`` (``s2_matrix``), so that a testbed's pages never
            overwrite another's; empty for ``s1``.
        results_dir: the default ``--results-dir``, relative to the repository.
    """

    name: str
    title: str
    settings: Callable[[], tuple[str, ...]]
    model: Callable[[], str] | None = None
    build: Callable[[], Path] | None = None
    tag_prefix: str = ""
    results_dir: str = "docs/results"


def _s2_config() -> Any:
    from ebpo.models.recipes.gym import GymBaseModelConfig

    return GymBaseModelConfig()


def _s2_settings() -> tuple[str, ...]:
    from ebpo.models.recipes.gym import MIXTURE, TASK
    from ebpo.tasks import task_options_text

    return (f"data.task={TASK}", f"data.task_options={task_options_text(MIXTURE)}")


def _s2_model() -> str:
    from ebpo.models.build import base_model_path, shipped_model_path

    config = _s2_config()
    return str(shipped_model_path(config) or base_model_path(config))


def _s2_build() -> Path:
    from ebpo.models.build import build_base_model

    return build_base_model(_s2_config())


TESTBEDS: Registry[Testbed] = Registry("testbed")
TESTBEDS.register(
    "s1", Testbed("s1", "S1, the arith base model, on arith (ebpo.yaml's model and task)", lambda: ())
)
TESTBEDS.register(
    "s2",
    Testbed(
        "s2",
        "S2, the gym base model (Qwen3, BPE, ChatML), on its reasoning-gym mixture (gym_recipe.TASK, MIXTURE)",
        _s2_settings,
        model=_s2_model,
        build=_s2_build,
        tag_prefix="s2_",
        results_dir="docs/results/gym",
    ),
)
DEFAULT_TESTBED = "s1"


def get_testbed(name: str) -> Testbed:
    """The testbed named ``name``; an unknown name lists the valid ones."""
    return TESTBEDS.get(name)


# ---------------------------------------------------------------------------------------------------
# the test set and its answer kinds, by the task a run trains on


def benchmark_of(data: dict[str, Any]) -> BenchmarkSpec:
    """The test set of a run whose ``data`` section (a resolved config's) is ``data``: its task's test split as
    ``ebpo eval`` names it, ``arith`` (450 problems) or ``gym:<datasets>`` with the task's settings (450 problems
    of its test split, seed 0)."""
    from ebpo.eval import get_benchmark

    return get_benchmark(data["task"], **(data.get("task_options") or {}))


def _arith_kinds(problems: Iterable[tuple[Sequence[Any], Record]]) -> dict[str, float]:
    from ebpo.tasks.arith import answer_kind_shares

    return answer_kind_shares((answers, record.answer) for answers, record in problems)


def _gym_kinds(problems: Iterable[tuple[Sequence[Any], Record]]) -> dict[str, float]:
    from ebpo.models.recipes.gym import ANSWER_KINDS as GYM_KINDS
    from ebpo.models.recipes.gym import answer_kind, gold_answer

    found = [answer_kind(answer, gold_answer(record)) for answers, record in problems for answer in answers]
    return {kind: found.count(kind) / len(found) for kind in GYM_KINDS} if found else {}


@dataclass(frozen=True)
class AnswerKinds:
    """How a task family's sampled test answers are sorted: ``shares`` maps ``(answers, record)`` pairs to the
    share of each kind; ``source`` names the function, for the pages."""

    shares: Callable[[Iterable[tuple[Sequence[Any], Record]]], dict[str, float]]
    source: str


ANSWER_KINDS: Registry[AnswerKinds] = Registry("answer kinds")
ANSWER_KINDS.register("arith", AnswerKinds(_arith_kinds, "arith.answer_kind"))
ANSWER_KINDS.register("gym", AnswerKinds(_gym_kinds, "gym_recipe.answer_kind"))


def answer_kinds_of(task: str) -> AnswerKinds | None:
    """The answer kinds of ``task``'s family (``arith``, ``gym`` for ``gym:<datasets>``), or None (a task of
    another family: its results have no kinds)."""
    family = task.partition(":")[0]
    return ANSWER_KINDS.get(family) if family in ANSWER_KINDS else None


KIND_ORDER: tuple[str, ...] = ("right", "near miss", "run-on", "other", "no number", "no answer")
"""The order pages list the kinds of every family in (``arith.ANSWER_KINDS``, then the gym's ``no answer``)."""
