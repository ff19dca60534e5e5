"""Reward registry: verifiable rewards by name, shared by the trainer, the evaluation and the adapters.

``get_reward(name, **options)`` returns a reward object ``fn`` with

- ``fn(completion, answer) -> float``: one sample;
- ``fn.batch(completions, answers) -> list[float]``: many samples (use this in training loops);
- ``fn.extract(completion) -> str | None``: the final answer it grades (for maj@k);
- ``fn.metrics() -> dict``: cumulative ``reward/...`` counters.

Registered names:

- ``math``: 1 / 0, final-answer extraction + math-verify (gold first) in a killable worker pool
  (:mod:`ebpo.rewards.math`);
- ``math_dapo``: the same verification scored +1 / -1 (DAPO);
- ``arith``: 1 / 0 from ``ebpo.tasks.arith.verify`` (imported on first use);
- ``gym``: a reasoning-gym dataset's own ``score_answer`` on the ``<answer>`` of a completion, for the records of
  ``gym:<dataset>`` tasks (:mod:`ebpo.rewards.gym`; 1 for full credit, else 0, or the score with
  ``partial_credit=True``).

Add one with ``@register_reward("name")`` on a factory that takes keyword options and returns such an object.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from ebpo.registry import Registry

__all__ = ["ArithReward", "Reward", "get_reward", "list_rewards", "register_reward"]


@runtime_checkable
class Reward(Protocol):
    """What every registered reward provides."""

    def __call__(self, completion: str, answer: str) -> float: ...

    def batch(self, completions: Sequence[str], answers: Sequence[str]) -> list[float]: ...


_REWARDS: Registry[Callable[..., Reward]] = Registry("reward")


def register_reward(name: str) -> Callable[[Callable[..., Reward]], Callable[..., Reward]]:
    """Decorator: register a reward factory (keyword options -> reward object) under ``name``."""
    return _REWARDS.register(name)


def list_rewards() -> list[str]:
    """Registered reward names, sorted."""
    return _REWARDS.names()


def get_reward(name: str, **options: Any) -> Reward:
    """A new reward object by name; ``options`` go to its factory (e.g. ``timeout_s=5.0`` for ``math``).

    Raises ``ValueError`` naming the valid choices for an unknown name.
    """
    return _REWARDS.get(name)(**options)


@register_reward("math")
def _math_reward(**options: Any) -> Reward:
    """1 if the final answer equals the gold under math-verify, else 0 (see :class:`MathReward`)."""
    from ebpo.rewards.math import MathReward

    return MathReward(correct=1.0, wrong=0.0, **options)


@register_reward("math_dapo")
def _math_dapo_reward(**options: Any) -> Reward:
    """DAPO's +1 / -1 reward: +1 for a verified final answer, -1 otherwise (Yu et al. 2025)."""
    from ebpo.rewards.math import MathReward

    return MathReward(correct=1.0, wrong=-1.0, **options)


class ArithReward:
    """The ``arith`` task's verifier as a reward: ``float(ebpo.tasks.arith.verify(completion, answer))``.

    The task module is imported on first call, so the registry loads without it. Its own verifier is
    integer comparison (no SymPy), fast and safe in-process, so no worker pool is used.
    """

    def __init__(self) -> None:
        self._counts = {"verified": 0}

    @staticmethod
    def _task() -> Any:
        from ebpo.tasks import arith

        return arith

    def __call__(self, completion: str, answer: str) -> float:
        self._counts["verified"] += 1
        return float(self._task().verify(completion, answer))

    def batch(self, completions: Sequence[str], answers: Sequence[str]) -> list[float]:
        if len(completions) != len(answers):
            raise ValueError(f"got {len(completions)} completions but {len(answers)} answers")
        return [self(c, a) for c, a in zip(completions, answers)]

    def extract(self, completion: str) -> str | None:
        """The task's own answer extraction if it has one (``extract_answer``), else ``None``."""
        extract = getattr(self._task(), "extract_answer", None)
        return extract(completion) if extract is not None else None

    def metrics(self) -> dict[str, float]:
        return {f"reward/{k}": float(v) for k, v in self._counts.items()}


@register_reward("arith")
def _arith_reward() -> Reward:
    return ArithReward()


@register_reward("gym")
def _gym_reward(**options: Any) -> Reward:
    """A reasoning-gym dataset's ``score_answer`` of the extracted answer (see :class:`GymReward`)."""
    from ebpo.rewards.gym import GymReward

    return GymReward(**options)
