"""What the estimators accept and return, checked in one place, and the group ids they work on.

The contract's inputs (docs/design.md, "Advantage estimators"): ``rewards`` are N sequence rewards (a 1-D
tensor or anything ``torch.as_tensor`` takes; Python lists and arrays are read straight into float64),
``index`` N group ids (any hashable: ints, strings, numpy object arrays; groups need not be contiguous),
``cluster`` optional N cluster keys. :func:`prepare` turns them into a :class:`Batch` or raises
``ValueError``: a reward that is NaN, inf or larger in magnitude than :data:`MAX_ABS_REWARD` (naming the
first bad position), lengths that differ, a ``rewards`` that is not 1-D. :func:`check_advantages` refuses an
advantage float32 cannot hold, naming its sample. An option an estimator cannot use raises
:class:`OptionError`, which names the option so that a framework can prefix its own key.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable
from typing import Any, NamedTuple

import numpy as np
import torch

from ebpo.advantages.core import GroupStats

__all__ = [
    "FLOAT32_MAX",
    "MAX_ABS_REWARD",
    "Batch",
    "OptionError",
    "check_advantages",
    "check_eps",
    "group_ids",
    "is_real",
    "prepare",
    "to_hashable",
]

MAX_ABS_REWARD = 1e30
"""Largest |reward| accepted. Far above any reward in practice, and small enough that every intermediate
value stays finite: an unnormalised advantage is at most 2e30 (float32 holds 3.4e38) and a running M2 grows
like n * (2e30)^2, finite for any n below 1e247. Rewards beyond it are rejected, never rescaled: rescaling
one batch would put it on another scale than the prior's history."""

FLOAT32_MAX = float(torch.finfo(torch.float32).max)


class OptionError(ValueError):
    """An estimator option that cannot be used; ``option`` names it (frameworks prefix their own key)."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


def to_hashable(key: Any) -> Hashable:
    """numpy scalars -> Python scalars so that np.str_('a'), 'a' and checkpoints agree."""
    if isinstance(key, np.generic):
        return key.item()
    return key


def group_ids(index: Any) -> tuple[torch.Tensor, int]:
    """Map N group ids to (inverse LongTensor[N] with values in 0..M-1, M).

    ``index`` may be a 1-D tensor or numpy array of ints / strings, a numpy object array, or any sequence
    of hashables. Integer and fixed-width string arrays are factorised with ``unique`` (group numbers in
    sorted order); anything else with a dict (numbers in order of first appearance). Object arrays are
    first cut into runs of equal neighbours (vectorised), so only one key per run goes through the dict:
    verl-style batches, where a group's samples sit together, cost O(M) Python work, not O(N). Only
    equality of ids matters to the estimators, never their order.
    """
    if isinstance(index, torch.Tensor):
        if index.ndim != 1:
            raise ValueError(f"index must be 1-D, got shape {tuple(index.shape)}")
        if not index.dtype.is_floating_point and not index.dtype.is_complex:
            uniques, inverse_N = torch.unique(index, return_inverse=True)
            return inverse_N.long(), int(uniques.numel())
        index = index.tolist()
    if isinstance(index, np.ndarray):
        if index.ndim != 1:
            raise ValueError(f"index must be 1-D, got shape {index.shape}")
        if index.dtype.kind in "biuUS":
            uniques, inverse = np.unique(index, return_inverse=True)
            return torch.from_numpy(inverse.reshape(-1).astype(np.int64)), int(uniques.size)
        runs = _runs(index)
        if runs is not None:
            starts, lengths = runs
            run_ids, num_groups = _factorize_hashables(index[starts].tolist())
            return torch.from_numpy(np.repeat(run_ids, lengths)), num_groups
        index = index.tolist()
    inverse, num_groups = _factorize_hashables(index)
    return torch.from_numpy(inverse), num_groups


def _runs(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(start, length) of each run of equal neighbours in an object array; None if keys do not compare."""
    num = keys.size
    if num == 0:
        return None
    try:
        change = np.empty(num, dtype=bool)
        change[0] = True
        change[1:] = np.asarray(keys[1:] != keys[:-1], dtype=bool)
    except (TypeError, ValueError):
        return None
    starts = np.flatnonzero(change)
    lengths = np.diff(np.append(starts, num))
    return starts, lengths


def _factorize_hashables(keys: Any) -> tuple[np.ndarray, int]:
    """Number distinct keys in order of first appearance: (int64 array of ids, count)."""
    mapping: dict[Hashable, int] = {}
    try:
        if isinstance(keys, list) and len(set(keys)) == len(keys):  # all distinct (verl's runs): 0, 1, ...
            return np.arange(len(keys), dtype=np.int64), len(keys)
        inverse = [mapping.setdefault(key, len(mapping)) for key in keys]
    except TypeError:
        for position, key in enumerate(keys):
            if not isinstance(key, Hashable):
                raise TypeError(
                    f"group id at position {position} is {type(key).__name__} {key!r}, which is not hashable"
                ) from None
        raise
    return np.array(inverse, dtype=np.int64), len(mapping)


class Batch(NamedTuple):
    """A validated batch: float64 rewards, group ids 0..M-1, and optional per-sample cluster keys; in an
    estimator's ``_advantages``, also the batch's :class:`GroupStats` (computed once per call, shared by the
    estimator and the metrics)."""

    rewards_N: torch.Tensor  # (N,) float64
    group_N: torch.Tensor  # (N,) long, values in 0..num_groups-1
    num_groups: int
    cluster: list[Hashable] | None  # N keys, or None
    stats: GroupStats | None = None


def prepare(rewards: Any, index: Any, cluster: Any) -> Batch:
    """Check the contract's inputs (module docstring) and compute group ids: the :class:`Batch` an estimator
    works on."""
    if isinstance(rewards, torch.Tensor):
        rewards_t = rewards
    else:  # torch.as_tensor of a list would make float32: 1e39 -> inf, 100000001.0 -> 1e8
        rewards_t = torch.as_tensor(rewards, dtype=torch.float64)
    if rewards_t.ndim != 1:
        raise ValueError(
            f"rewards must be a 1-D tensor of N sequence rewards, got shape {tuple(rewards_t.shape)}"
        )
    if rewards_t.dtype == torch.float64 and not rewards_t.requires_grad:
        rewards_N = rewards_t  # only read, never written to
    else:
        rewards_N = rewards_t.detach().to(torch.float64)
    num = rewards_N.numel()
    # one reduction: the largest |reward| is NaN when any reward is, so the comparison fails for NaN too
    if num and not float(rewards_N.abs().max()) <= MAX_ABS_REWARD:
        bad_N = ~(rewards_N.abs() <= MAX_ABS_REWARD)  # true for NaN, +-inf and huge values
        position = int(bad_N.nonzero()[0, 0])
        raise ValueError(
            f"reward at position {position} is {rewards_N[position].item():g}: rewards must be finite with "
            f"|reward| <= {MAX_ABS_REWARD:g} (check the reward function for this sample; rescale rewards "
            "that are meant to be this large)"
        )
    if len(index) != num:
        raise ValueError(f"index has {len(index)} entries but rewards has {num}; they must match")
    if cluster is not None and len(cluster) != num:
        raise ValueError(f"cluster has {len(cluster)} entries but rewards has {num}; they must match")
    if num == 0:
        return Batch(rewards_N, torch.zeros(0, dtype=torch.long, device=rewards_N.device), 0, None)
    group_N, num_groups = group_ids(index)
    keys = None
    if cluster is not None:
        source = cluster.tolist() if isinstance(cluster, np.ndarray | torch.Tensor) else list(cluster)
        keys = [to_hashable(key) for key in source]
    return Batch(rewards_N, group_N.to(rewards_N.device), num_groups, keys)


def check_advantages(
    name: str, adv_N: torch.Tensor, abs_adv_N: torch.Tensor, rewards_N: torch.Tensor
) -> None:
    """ValueError naming the first sample whose advantage is not finite or beyond float32's range
    (``abs_adv_N``: the advantages' absolute values)."""
    if not float(abs_adv_N.max()) <= FLOAT32_MAX:  # the max is NaN when any advantage is
        bad_N = ~(abs_adv_N <= FLOAT32_MAX)  # true for NaN, +-inf and values float32 turns into inf
        position = int(bad_N.nonzero()[0, 0])
        largest = int(rewards_N.abs().argmax())
        raise ValueError(
            f"{name}: advantage of sample {position} is {adv_N[position].item():g}, which float32 cannot hold "
            f"(largest |reward| {rewards_N[largest].item():g} at position {largest}); rescale the rewards or "
            "use a larger eps"
        )


def check_eps(name: str, eps: Any) -> float:
    """``eps`` as a float; :class:`OptionError` (prefixed with the estimator's ``name``) unless it is a finite
    number > 0."""
    if not is_real(eps) or not (math.isfinite(eps) and eps > 0):
        raise OptionError(
            "eps",
            f"{name}: eps must be > 0 and finite, got {eps!r} (it keeps 0 / 0 out of groups whose rewards "
            "are all equal)",
        )
    return float(eps)


def is_real(value: Any) -> bool:
    """A real number, not a bool (``True`` is an ``int`` to Python, never a sensible option value)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
