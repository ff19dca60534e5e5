"""Online moments for EBPO's global prior: Welford's algorithm with Chan et al.'s parallel combination.

EBPO (paper, Section 3.2 and Algorithm 1; docs/design.md §1) keeps two accumulators across training steps,
``W_glob`` over every reward and ``W_means`` over every group mean, and reads ``mu_glob``, ``sigma2`` and
``tau2`` from them. Both classes here hold (count, mean, M2) in float64 (Python floats are IEEE doubles):

- :class:`Welford`: every value ever seen has weight 1 (the paper's "all history").
- :class:`WeightedWelford`: each value enters with a weight of its own (reliability weights), never aged.
- :class:`EWWelford`: exponentially weighted moments (docs/design.md §2, ``prior_memory`` = a half-life in
  steps); the weight of old data halves every ``half_life`` calls to :meth:`EWWelford.step`.

Updates are vectorised: a batch's mean and M2 are computed with two tensor passes and then combined with
the running state by Chan, Golub and LeVeque's pairwise formula

    n = n_a + n_b,  delta = mean_b - mean_a,
    mean = mean_a + delta * n_b / n,   M2 = M2_a + M2_b + delta^2 * n_a * n_b / n,

so there is never a Python loop over values, and shards merged in any order equal one pass.

Nothing non-finite is ever stored: :meth:`Welford.update` rejects NaN, inf and values whose moments
overflow float64 (|x| around 1e154 and above), :meth:`Welford.merge` rejects a combination that overflows,
and ``load_state_dict`` rejects a non-finite or negative state; each raises ``ValueError`` and leaves the
accumulator as it was.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["EWWelford", "WeightedWelford", "Welford", "batch_moments", "weighted_batch_moments"]


def _as_float64_1d(values: Any) -> torch.Tensor:
    """``values`` (tensor, array, list, scalar) as a flat float64 tensor on its own device.

    Anything but a tensor is read straight into float64 (``torch.as_tensor`` of a Python list would make
    float32 and round 100000001.0 to 1e8).
    """
    if isinstance(values, torch.Tensor):
        if values.dtype == torch.float64 and values.dim() == 1 and not values.requires_grad:
            return values  # already what the callers read (they never write to it)
        return values.detach().reshape(-1).to(torch.float64)
    return torch.as_tensor(values, dtype=torch.float64).reshape(-1)


def _check_finite_values(values_n: torch.Tensor) -> None:
    finite_n = torch.isfinite(values_n)
    if not bool(finite_n.all()):
        position = int((~finite_n).nonzero()[0, 0])
        raise ValueError(
            f"value at position {position} is {values_n[position].item()}: running moments take finite values only"
        )


def _overflow_error(what: str) -> ValueError:
    return ValueError(
        f"{what}: this overflows float64 moments; rescale the values (the accumulator is unchanged)"
    )


def batch_moments(values: Any) -> tuple[int, float, float]:
    """(n, mean, M2) of a batch, two-pass in float64, shifted by the first value for accuracy.

    M2 = sum_i (x_i - mean)^2. Shifting by x_0 before summing keeps the sum small when the values share
    a large offset (e.g. 1e9 + noise), so the mean is exact to float64 rounding of the noise.
    Raises ValueError for a NaN or inf value, and for values whose M2 overflows float64 (naming the
    value of largest magnitude).
    """
    values_n = _as_float64_1d(values)
    n = values_n.numel()
    if n == 0:
        return 0, 0.0, 0.0
    shift = float(values_n[0])
    mean = shift + float((values_n - shift).mean())
    m2 = float(((values_n - mean) ** 2).sum())
    # a NaN or inf value makes the mean or M2 non-finite, so the values need a look only then
    if not (math.isfinite(mean) and math.isfinite(m2)):
        _check_finite_values(values_n)
        position = int(values_n.abs().argmax())
        raise _overflow_error(f"value at position {position} is {values_n[position].item():g}")
    return n, mean, m2


def weighted_batch_moments(values: Any, weights: Any) -> tuple[float, float, float, float]:
    """(W, W2, mean, M2) of a weighted batch in float64: W = sum w, W2 = sum w^2, mean = sum w x / W,
    M2 = sum w (x - mean)^2 (shifted by the first value, as :func:`batch_moments`). ValueError for a
    non-finite value, a weight that is negative or not finite, or lengths that differ; W = 0 gives zeros."""
    values_n = _as_float64_1d(values)
    weights_n = _as_float64_1d(weights)
    if weights_n.numel() != values_n.numel():
        raise ValueError(f"{weights_n.numel()} weights for {values_n.numel()} values; they must match")
    if weights_n.numel() and not bool((torch.isfinite(weights_n) & (weights_n >= 0)).all()):
        position = int((~(torch.isfinite(weights_n) & (weights_n >= 0))).nonzero()[0, 0])
        raise ValueError(
            f"weight at position {position} is {weights_n[position].item()}: weights must be finite and >= 0"
        )
    _check_finite_values(values_n)
    weight = float(weights_n.sum())
    if weight <= 0.0:
        return 0.0, 0.0, 0.0, 0.0
    shift = float(values_n[0])
    mean = shift + float((weights_n * (values_n - shift)).sum()) / weight
    m2 = float((weights_n * (values_n - mean) ** 2).sum())
    if not (math.isfinite(mean) and math.isfinite(m2)):
        position = int(values_n.abs().argmax())
        raise _overflow_error(f"value at position {position} is {values_n[position].item():g}")
    return weight, float((weights_n * weights_n).sum()), mean, m2


def _chan_combine(
    n_a: float, mean_a: float, m2_a: float, n_b: float, mean_b: float, m2_b: float
) -> tuple[float, float, float]:
    """Chan et al. (1979) pairwise combination of two (weight, mean, M2) triples; ValueError on overflow."""
    n = n_a + n_b
    if n_b == 0:
        return n_a, mean_a, m2_a
    if n_a == 0:
        return n_b, mean_b, m2_b
    delta = mean_b - mean_a
    mean = mean_a + delta * (n_b / n)
    m2 = m2_a + m2_b + delta * delta * (n_a * n_b / n)
    if not (math.isfinite(mean) and math.isfinite(m2)):
        raise _overflow_error(f"combining means {mean_a:g} and {mean_b:g} (weights {n_a:g}, {n_b:g})")
    return n, mean, m2


def _checked_state(state: dict[str, Any], keys: tuple[str, ...], owner: str) -> dict[str, float]:
    """``state[key]`` as floats for each key; ValueError naming the key if one is missing, non-finite or,
    for every key but ``mean``, negative."""
    out = {}
    for key in keys:
        if key not in state:
            raise ValueError(
                f"{owner} state has no {key!r} (keys: {sorted(state)}): the checkpoint is not one"
            )
        value = state[key]
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"{owner} state {key}={value!r} is not a number: the checkpoint is corrupt"
            ) from None
        if not math.isfinite(number) or (key != "mean" and number < 0):
            kind = "finite" if key == "mean" else "finite and >= 0"
            raise ValueError(f"{owner} state {key}={value!r} must be {kind}: the checkpoint is corrupt")
        out[key] = number
    return out


def _gather_rows(row: list[float], group: Any) -> list[list[float]] | None:
    """all_gather one float64 row per rank, in rank order; None when torch.distributed is not running."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    row_t = torch.tensor(row, dtype=torch.float64, device=device)
    world_size = dist.get_world_size(group)
    rows = [torch.empty_like(row_t) for _ in range(world_size)]
    dist.all_gather(rows, row_t, group=group)
    return [r.cpu().tolist() for r in rows]


class Welford:
    """Running count, mean and M2 of every value ever seen (Welford 1962; Chan et al. 1979).

    ``var`` is the sample variance M2 / (n - 1), and 0 when n < 2 (docs/design.md §1, step 2).
    """

    def __init__(self) -> None:
        self.count: int = 0
        self._mean: float = 0.0
        self.m2: float = 0.0

    @property
    def mean(self) -> float:
        """Mean of all values seen (0.0 before any)."""
        return self._mean

    @property
    def var(self) -> float:
        """Sample variance M2 / (n - 1); 0.0 when fewer than two values were seen."""
        if self.count < 2:
            return 0.0
        return max(self.m2, 0.0) / (self.count - 1)

    def update(self, values: Any) -> Welford:
        """Add a batch of values (any shape; flattened): batch (n, mean, M2), then Chan combination."""
        n_b, mean_b, m2_b = batch_moments(values)
        n, self._mean, self.m2 = _chan_combine(self.count, self._mean, self.m2, n_b, mean_b, m2_b)
        self.count = int(n)
        return self

    def merge(self, other: Welford) -> Welford:
        """Fold ``other`` into this accumulator (Chan et al.); equal to one pass over both data."""
        if not isinstance(other, Welford):
            raise TypeError(f"Welford.merge needs a Welford, got {type(other).__name__}")
        n, self._mean, self.m2 = _chan_combine(
            self.count, self._mean, self.m2, other.count, other._mean, other.m2
        )
        self.count = int(n)
        return self

    def all_reduce(self, group: Any = None) -> Welford:
        """Make every data-parallel rank hold the merge of all ranks' accumulators.

        all_gathers the (count, mean, M2) triples and Chan-merges them in rank order, so all ranks end with
        bit-identical state. A no-op when ``torch.distributed`` is not initialised. Call it on per-step
        deltas (accumulate a step's local data in a fresh ``Welford``, all_reduce it, then ``merge`` it into
        the persistent prior): on an accumulator that already holds shared history, that history would be
        counted once per rank.
        """
        rows = _gather_rows([float(self.count), self._mean, self.m2], group)
        if rows is None:
            return self
        merged = Welford()
        for count, mean, m2 in rows:
            part = Welford()
            part.count, part._mean, part.m2 = int(round(count)), mean, m2
            merged.merge(part)
        self.count, self._mean, self.m2 = merged.count, merged._mean, merged.m2
        return self

    def state_dict(self) -> dict[str, float]:
        return {"count": self.count, "mean": self._mean, "m2": self.m2}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore ``state_dict()``; ValueError (state unchanged) if a value is missing, non-finite or negative."""
        checked = _checked_state(state, ("count", "mean", "m2"), "Welford")
        self.count = int(checked["count"])
        self._mean = checked["mean"]
        self.m2 = checked["m2"]

    def __repr__(self) -> str:
        return f"Welford(count={self.count}, mean={self._mean:.6g}, var={self.var:.6g})"


class WeightedWelford:
    """Running mean and variance of weighted values (reliability weights), weights never aged.

    Each value enters with the weight it is given (1 by default). ``var`` uses reliability weights,
    M2 / (W - W2 / W) with W the total weight and W2 the sum of squared weights, which is the sample
    variance M2 / (n - 1) when all weights are 1 (so a ``WeightedWelford`` fed only weight 1 equals
    :class:`Welford`); it is 0 when W - W2 / W <= 0 (fewer than two effective values). ``count`` is W.
    EBPO's prior uses it for groups that enter with a weight (``prior_staleness="decay"``).
    """

    def __init__(self) -> None:
        self.weight: float = 0.0
        self.weight_sq: float = 0.0
        self._mean: float = 0.0
        self.m2: float = 0.0

    @property
    def count(self) -> float:
        """Total weight W of the data (the plain count when every weight is 1)."""
        return self.weight

    @property
    def mean(self) -> float:
        """Weighted mean sum_i w_i x_i / W (0.0 before any value)."""
        return self._mean

    @property
    def var(self) -> float:
        """Reliability-weighted sample variance M2 / (W - W2 / W); 0.0 with under two effective values."""
        if self.weight <= 0.0:
            return 0.0
        denom = self.weight - self.weight_sq / self.weight
        if denom <= 1e-12 * self.weight:
            return 0.0
        return max(self.m2, 0.0) / denom

    def update(self, values: Any, weights: Any = None) -> WeightedWelford:
        """Add a batch of values, each with weight 1 or with ``weights`` (same length, finite, >= 0).

        Weighted batch moments: W_b = sum w, mean_b = sum w x / W_b, M2_b = sum w (x - mean_b)^2, then Chan's
        combination with W in place of n. Values of weight 0 change nothing.
        """
        if weights is None:
            n_b, mean_b, m2_b = batch_moments(values)
            weight_b, weight_sq_b = float(n_b), float(n_b)
        else:
            weight_b, weight_sq_b, mean_b, m2_b = weighted_batch_moments(values, weights)
        self.weight, self._mean, self.m2 = _chan_combine(
            self.weight, self._mean, self.m2, weight_b, mean_b, m2_b
        )
        self.weight_sq += weight_sq_b
        return self

    def _check_mergeable(self, other: Any) -> None:
        if type(other) is not type(self):
            raise TypeError(
                f"{type(self).__name__}.merge needs a {type(self).__name__}, got {type(other).__name__}"
            )

    def merge(self, other: WeightedWelford) -> WeightedWelford:
        """Weighted Chan combination with ``other`` (of the same class)."""
        self._check_mergeable(other)
        self.weight, self._mean, self.m2 = _chan_combine(
            self.weight, self._mean, self.m2, other.weight, other._mean, other.m2
        )
        self.weight_sq += other.weight_sq
        return self

    def _empty_like(self) -> WeightedWelford:
        return type(self)()

    def all_reduce(self, group: Any = None) -> WeightedWelford:
        """As :meth:`Welford.all_reduce`, gathering (W, W2, mean, M2) and merging in rank order."""
        rows = _gather_rows([self.weight, self.weight_sq, self._mean, self.m2], group)
        if rows is None:
            return self
        merged = self._empty_like()
        for weight, weight_sq, mean, m2 in rows:
            part = self._empty_like()
            part.weight, part.weight_sq, part._mean, part.m2 = weight, weight_sq, mean, m2
            merged.merge(part)
        self.weight, self.weight_sq, self._mean, self.m2 = (
            merged.weight,
            merged.weight_sq,
            merged._mean,
            merged.m2,
        )
        return self

    def state_dict(self) -> dict[str, float]:
        return {"weight": self.weight, "weight_sq": self.weight_sq, "mean": self._mean, "m2": self.m2}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore ``state_dict()``; ValueError (state unchanged) on a missing, non-finite or negative value."""
        checked = _checked_state(state, ("weight", "weight_sq", "mean", "m2"), type(self).__name__)
        self.weight = checked["weight"]
        self.weight_sq = checked["weight_sq"]
        self._mean = checked["mean"]
        self.m2 = checked["m2"]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(weight={self.weight:.6g}, mean={self._mean:.6g})"


class EWWelford(WeightedWelford):
    """Exponentially weighted running mean and variance; old data's weight halves every ``half_life`` steps.

    Each value enters with weight 1 (or the weight it is given). :meth:`step` (called once per training
    step, *after* the step has read the prior; EBPO's estimator calls it at the end of each ``__call__``)
    multiplies every existing weight by ``d = 0.5 ** (1 / half_life)``: the weighted mean is unchanged, and
    the total weight W, the weighted M2 and the sum of squared weights W2 become d * W, d * M2 and d^2 * W2.
    Updates never decay, so several ``update`` calls within one step weigh alike.

    ``var`` uses reliability weights, M2 / (W - W2 / W), which is the sample variance M2 / (n - 1) when all
    weights are 1 (so an ``EWWelford`` that never steps equals :class:`Welford`); it is 0 when
    W - W2 / W <= 0 (fewer than two effective values). ``count`` is the total weight W.
    """

    def __init__(self, half_life: float) -> None:
        if not (isinstance(half_life, int | float) and math.isfinite(half_life) and half_life > 0):
            raise ValueError(f"EWWelford half_life must be a positive number of steps, got {half_life!r}")
        super().__init__()
        self.half_life = float(half_life)
        self.decay = 0.5 ** (1.0 / self.half_life)

    def step(self) -> EWWelford:
        """Age the data by one step: every weight times decay = 0.5 ** (1 / half_life)."""
        self.weight *= self.decay
        self.weight_sq *= self.decay * self.decay
        self.m2 *= self.decay
        return self

    def _check_mergeable(self, other: Any) -> None:
        if not isinstance(other, EWWelford):
            raise TypeError(f"EWWelford.merge needs an EWWelford, got {type(other).__name__}")
        if other.half_life != self.half_life:
            raise ValueError(f"cannot merge EWWelford half_life={other.half_life} into {self.half_life}")

    def _empty_like(self) -> EWWelford:
        return EWWelford(self.half_life)

    def state_dict(self) -> dict[str, float]:
        return {"half_life": self.half_life, **super().state_dict()}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore ``state_dict()``; ValueError (state unchanged) on another half-life or a missing,
        non-finite or negative value."""
        if float(state["half_life"]) != self.half_life:
            raise ValueError(
                f"checkpoint EWWelford half_life={state['half_life']} differs from this one's {self.half_life}"
            )
        super().load_state_dict(state)

    def __repr__(self) -> str:
        return f"EWWelford(half_life={self.half_life}, weight={self.weight:.6g}, mean={self._mean:.6g})"
