"""The ``gym`` reward: a reasoning-gym dataset's own ``score_answer`` on the answer a completion gives.

The verifier lives with the task (``ebpo.tasks.gym``: ``decode_entry``, ``extract_answer``, ``score``),
as ``arith``'s does; this class adds the counters and the choice of partial credit. The gold ``answer`` is a gym
record's: the reasoning-gym entry as canonical JSON (``ebpo.tasks.gym.encode_entry``:
``{"dataset", "answer", "metadata"}``, ``"config"`` when the generator's settings differ from its defaults, an
optional ``"question"``). The completion's answer is what reasoning-gym's own ``reasoning_gym.utils.extract_answer``
finds: the text inside the last ``<answer>...</answer>`` pair, stripped; no pair is no answer (``score_answer``
gets ``None``, which every dataset scores 0). The score is ``dataset.score_answer(answer, entry)`` from a
generator built with the entry's ``config`` (a few datasets read their settings when they score).

reasoning-gym gives partial credit on many datasets (its default rule: a wrong answer that contains the right one
scores ``len(right) / len(given)``, so ``427`` for ``42`` scores 0.67). Every ebpo metric counts a reward above 0
as correct, so the reward is, by default, 1 for full credit and 0 otherwise; ``partial_credit=True`` returns
``score_answer``'s value as it is (``get_reward("gym", partial_credit=True)``, ``--reward-option
partial_credit=true``). A ``score_answer`` that raises on what a model wrote scores 0 and counts in
``reward/verifier_errors``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _gym() -> Any:
    from ebpo.tasks import gym

    return gym


class GymReward:
    """``score_answer`` of the record's dataset on the extracted answer: full credit 1, else 0, unless
    ``partial_credit`` (then the score as it is)."""

    def __init__(self, partial_credit: bool = False) -> None:
        if not isinstance(partial_credit, bool):
            raise TypeError(f"partial_credit must be true or false, got {partial_credit!r}")
        self.partial_credit = partial_credit
        self._counts = {"verified": 0, "no_answer": 0, "verifier_errors": 0}

    def score(self, completion: str, answer: str) -> float:
        """The dataset's ``score_answer`` of the completion's answer, as reasoning-gym returns it (in [0, 1])."""
        scored = _gym().score(completion, answer)  # a bad gold answer raises before anything is counted
        self._counts["verified"] += 1
        self._counts["no_answer"] += scored.extracted is None
        self._counts["verifier_errors"] += scored.scorer_failed
        return scored.score

    def __call__(self, completion: str, answer: str) -> float:
        value = self.score(completion, answer)
        if self.partial_credit:
            return value
        return 1.0 if value >= _gym().FULL_CREDIT else 0.0

    def batch(self, completions: Sequence[str], answers: Sequence[str]) -> list[float]:
        if len(completions) != len(answers):
            raise ValueError(f"got {len(completions)} completions but {len(answers)} answers")
        return [self(c, a) for c, a in zip(completions, answers)]

    def extract(self, completion: str) -> str | None:
        """The answer it grades (for maj@k): ``ebpo.tasks.gym.extract_answer``, reasoning-gym's own."""
        return _gym().extract_answer(completion)

    def metrics(self) -> dict[str, float]:
        return {f"reward/{k}": float(v) for k, v in self._counts.items()}
