"""``ebpo.rewards`` as verl's custom reward function (``reward.custom_reward_function``).

    reward.custom_reward_function.path=pkg://ebpo.integrations.verl.rewards
    reward.custom_reward_function.name=compute_score

verl calls ``compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)`` once per
response; the row's ``data_source`` names the reward (``arith``, ``math``, ``math_dapo``: any
``ebpo.rewards.list_rewards()`` name), so training in verl scores exactly as ``ebpo train`` and ``ebpo eval``.
"""

from __future__ import annotations

from functools import cache
from typing import Any

__all__ = ["compute_score"]


@cache
def _reward(name: str):
    from ebpo.rewards import get_reward, list_rewards

    if name not in list_rewards():
        raise ValueError(
            f"data_source={name!r} is not an ebpo reward (choices: {', '.join(list_rewards())}); write one of "
            f"them as the rows' data_source (examples/verl/prepare_data.py --data-source)"
        )
    return get_reward(name)


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **unused: Any
) -> float:
    """The ``ebpo.rewards`` reward named by ``data_source`` of one response against its ground truth."""
    return float(_reward(str(data_source))(solution_str, str(ground_truth)))
