"""A verl ``compute_score`` whose rewards depend only on the prompt and the sample's position, for
the 2-rank runs of conftest.py, on both trainers (``reward.custom_reward_function.path=<this file>``).

Prompt ``index`` (its ``extra_info.index``) gets ``index mod (N + 1)`` successes among its N samples of a
step: calls for one prompt are counted in the process that scores them (the legacy trainer's, or the v1 CPU
mode's one reward worker), and the k-th call (k mod N) of a step scores 1
when ``k mod N < index mod (N + 1)``. Within a step the N calls of a prompt may come in any order (verl
scores them concurrently), so which sample gets which reward varies, but each group's rewards, as a
multiset, are fixed: the prior, which sees a group through its rewards' count, mean and variance, is then the
same for any number of ranks, any rollout and any batch order. Indices 0 and N (mod N + 1) are saturated
groups (all 0, all 1). N comes from ``+reward.custom_reward_function.reward_kwargs.group_size=N``.
"""

from __future__ import annotations

import threading
from typing import Any

_LOCK = threading.Lock()
_CALLS: dict[int, int] = {}


def successes(index: int, group_size: int) -> int:
    """How many of prompt ``index``'s samples score 1 in every step."""
    return index % (group_size + 1)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: Any = None,
    group_size: int = 0,
    **unused: Any,
) -> float:
    index = int(extra_info["index"])
    with _LOCK:
        position = _CALLS.get(index, 0)
        _CALLS[index] = position + 1
    return 1.0 if position % group_size < successes(index, group_size) else 0.0
