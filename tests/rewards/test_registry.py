"""The reward registry (``ebpo.rewards``): names, the errors for an unknown or a taken name, and the ``arith``
reward it defines."""

from __future__ import annotations

import pytest

from ebpo.rewards import get_reward, list_rewards, register_reward
from ebpo.rewards.math import MathReward
from ebpo.tasks import arith


def test_registry_names_and_errors():
    assert {"math", "math_dapo", "arith"} <= set(list_rewards())
    with pytest.raises(ValueError, match="'gsm8k'.*arith.*math.*math_dapo"):
        get_reward("gsm8k")
    with pytest.raises(ValueError, match="^reward 'math' "):
        register_reward("math")(lambda **kw: None)
    assert isinstance(get_reward("math", num_workers=0), MathReward)


def test_arith_reward_wraps_the_task_verifier():
    reward = get_reward("arith")
    records = arith.generate("test", 20, 0)
    right = [f"{r.answer}" for r in records]
    wrong = [f"{r.answer}1" for r in records]
    answers = [r.answer for r in records]
    assert reward.batch(right, answers) == [float(arith.verify(c, a)) for c, a in zip(right, answers)]
    assert reward.batch(wrong, answers) == [float(arith.verify(c, a)) for c, a in zip(wrong, answers)]
    assert sum(reward.batch(right, answers)) == 20
