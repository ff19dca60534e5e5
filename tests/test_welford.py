"""Welford and EWWelford: hand values, float64 accuracy at a large offset, Chan merges, EW vs a loop."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from ebpo.welford import EWWelford, Welford, batch_moments


def test_hand_values():
    # [1, 2, 3, 4]: mean 2.5; deviations -1.5, -0.5, 0.5, 1.5 -> M2 = 2.25 + 0.25 + 0.25 + 2.25 = 5;
    # sample variance 5 / 3.
    acc = Welford().update(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert acc.count == 4
    assert acc.mean == pytest.approx(2.5, abs=1e-15)
    assert acc.m2 == pytest.approx(5.0, abs=1e-12)
    assert acc.var == pytest.approx(5.0 / 3.0, abs=1e-12)
    # adding [10]: n = 5, mean = (10 + 10) / 5 = 4; M2 = 5 + (10 - 2.5)^2 * 4 * 1 / 5 = 5 + 45 = 50; var 12.5
    acc.update([10.0])
    assert acc.mean == pytest.approx(4.0, abs=1e-12)
    assert acc.var == pytest.approx(12.5, abs=1e-12)


def test_variance_is_zero_below_two_values():
    acc = Welford()
    assert (acc.count, acc.mean, acc.var) == (0, 0.0, 0.0)
    acc.update(np.array([7.0]))
    assert acc.mean == 7.0 and acc.var == 0.0
    acc.update(torch.zeros(0))  # an empty batch changes nothing
    assert acc.count == 1 and acc.mean == 7.0


def test_large_offset_matches_two_pass_float64():
    # 10^6 values 1e9 + N(0, 1), fed in uneven chunks. The reference is numpy's two-pass mean/var on
    # x - 1e9 (exact in float64: x and 1e9 are within a factor 2, Sterbenz), plus the offset back.
    rng = np.random.default_rng(0)
    values = 1e9 + rng.standard_normal(1_000_000)
    ref_mean = 1e9 + np.mean(values - 1e9)
    ref_var = np.var(values - 1e9, ddof=1)
    acc = Welford()
    cuts = np.sort(rng.choice(np.arange(1, values.size), size=17, replace=False))
    for chunk in np.split(values, cuts):
        acc.update(torch.from_numpy(chunk))
    assert acc.count == 1_000_000
    assert abs(acc.mean - ref_mean) < 1e-6
    assert acc.var == pytest.approx(ref_var, rel=1e-9)
    # the single-batch path agrees as well
    n, mean, m2 = batch_moments(values)
    assert n == values.size and abs(mean - ref_mean) < 1e-6
    assert m2 / (n - 1) == pytest.approx(ref_var, rel=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shards_merged_equal_one_pass(seed):
    rng = np.random.default_rng(seed)
    values = rng.normal(3.0, 2.0, size=int(rng.integers(50, 500)))
    one_pass = Welford().update(values)
    shards = np.array_split(values[rng.permutation(values.size)], int(rng.integers(2, 7)))
    partials = [Welford().update(shard) for shard in shards]
    merged = Welford()
    for i in rng.permutation(len(partials)):  # any merge order
        merged.merge(partials[i])
    merged.merge(Welford())  # merging an empty accumulator is a no-op
    assert merged.count == one_pass.count
    assert merged.mean == pytest.approx(one_pass.mean, rel=1e-12)
    assert merged.var == pytest.approx(one_pass.var, rel=1e-12)
    assert merged.var == pytest.approx(np.var(values, ddof=1), rel=1e-12)


def test_state_dict_round_trip_and_all_reduce_without_distributed():
    acc = Welford().update([0.0, 1.0, 1.0])
    clone = Welford()
    clone.load_state_dict(copy.deepcopy(acc.state_dict()))
    acc.update([5.0, 6.0])
    clone.update([5.0, 6.0])
    assert clone.state_dict() == acc.state_dict()
    before = acc.state_dict()
    acc.all_reduce()  # not initialised: nothing changes
    assert acc.state_dict() == before


def test_merge_rejects_other_types():
    with pytest.raises(TypeError, match="Welford"):
        Welford().merge(EWWelford(2.0))
    with pytest.raises(ValueError, match="half_life"):
        EWWelford(0.0)
    with pytest.raises(ValueError, match="half_life"):
        EWWelford(2.0).merge(EWWelford(3.0))


class _LoopEW:
    """Reference: keep every (value, weight) pair and recompute the weighted moments from scratch."""

    def __init__(self, half_life: float) -> None:
        self.decay = 0.5 ** (1.0 / half_life)
        self.values: list[float] = []
        self.weights: list[float] = []

    def update(self, values) -> None:
        for value in values:
            self.values.append(float(value))
            self.weights.append(1.0)

    def step(self) -> None:
        self.weights = [w * self.decay for w in self.weights]

    def moments(self) -> tuple[float, float, float]:
        total = sum(self.weights)
        mean = sum(w * x for w, x in zip(self.weights, self.values, strict=True)) / total
        m2 = sum(w * (x - mean) ** 2 for w, x in zip(self.weights, self.values, strict=True))
        sq = sum(w * w for w in self.weights)
        denom = total - sq / total
        return total, mean, (m2 / denom if denom > 1e-12 * total else 0.0)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_ewwelford_matches_loop_reference(seed):
    rng = np.random.default_rng(seed)
    half_life = float(rng.uniform(0.5, 10.0))
    acc, ref = EWWelford(half_life), _LoopEW(half_life)
    for _ in range(int(rng.integers(3, 12))):
        for _ in range(int(rng.integers(1, 3))):  # several updates within one step weigh alike
            batch = rng.normal(rng.uniform(-2, 2), 1.0, size=int(rng.integers(1, 20)))
            acc.update(batch)
            ref.update(batch)
        total, mean, var = ref.moments()
        assert acc.count == pytest.approx(total, rel=1e-12)
        assert acc.mean == pytest.approx(mean, rel=1e-10, abs=1e-12)
        assert acc.var == pytest.approx(var, rel=1e-9, abs=1e-12)
        acc.step()
        ref.step()


def test_ewwelford_half_life_and_no_decay_equals_welford():
    # ten values of weight 1; after 4 steps with half_life 2 each weighs 0.5^(4/2) = 0.25 -> W = 2.5
    acc = EWWelford(2.0).update(torch.arange(10.0))
    for _ in range(4):
        acc.step()
    assert acc.count == pytest.approx(2.5, rel=1e-12)
    assert acc.mean == pytest.approx(4.5, rel=1e-12)  # decay leaves the mean alone
    # new data at weight 1 against old data at total weight 2.5: mean = (2.5 * 4.5 + 1 * 100) / 3.5
    acc.update([100.0])
    assert acc.mean == pytest.approx((2.5 * 4.5 + 100.0) / 3.5, rel=1e-12)
    # without step() an EWWelford is a Welford: var = M2 / (n - 1)
    values = np.random.default_rng(0).normal(size=37)
    assert EWWelford(3.0).update(values).var == pytest.approx(Welford().update(values).var, rel=1e-12)


def test_ewwelford_merge_and_state_dict():
    rng = np.random.default_rng(5)
    left, right, both = EWWelford(4.0), EWWelford(4.0), EWWelford(4.0)
    for _ in range(5):
        a, b = rng.normal(size=7), rng.normal(1.0, size=3)
        left.update(a)
        right.update(b)
        both.update(np.concatenate([a, b]))
        for acc in (left, right, both):
            acc.step()
    merged = copy.deepcopy(left).merge(right)
    assert merged.count == pytest.approx(both.count, rel=1e-12)
    assert merged.mean == pytest.approx(both.mean, rel=1e-12)
    assert merged.var == pytest.approx(both.var, rel=1e-10)
    clone = EWWelford(4.0)
    clone.load_state_dict(both.state_dict())
    assert clone.state_dict() == both.state_dict()
    with pytest.raises(ValueError, match="half_life"):
        EWWelford(5.0).load_state_dict(both.state_dict())


@pytest.mark.parametrize("make", [Welford, lambda: EWWelford(3.0)], ids=["Welford", "EWWelford"])
def test_non_finite_and_overflowing_values_are_rejected_and_state_kept(make):
    acc = make().update([1.0, 2.0, 4.0])
    before = copy.deepcopy(acc.state_dict())
    with pytest.raises(ValueError, match="position 1 is nan"):
        acc.update([0.0, float("nan")])
    # 1e200 is finite, but its square is not: M2 would be inf and every later variance inf or NaN
    with pytest.raises(ValueError, match=r"position 2 is 1e\+200\b"):
        acc.update(torch.tensor([0.0, 1.0, 1e200], dtype=torch.float64))
    assert acc.state_dict() == before


def test_merge_that_would_overflow_is_rejected_and_state_kept():
    # two finite accumulators whose means differ by 2e300: delta^2 * n_a * n_b / n = 4e600 overflows
    left, right = Welford().update([1e300, 1e300]), Welford().update([-1e300, -1e300])
    before = copy.deepcopy(left.state_dict())
    with pytest.raises(ValueError, match=r"means 1e\+300 and -1e\+300\b"):
        left.merge(right)
    assert left.state_dict() == before


def test_list_values_are_read_as_float64():
    # torch.as_tensor([...]) makes float32, whose spacing at 1e8 is 8: the mean was 1e8, not 1e8 + 0.5
    assert Welford().update([100000001.0, 100000000.0]).mean == 100000000.5
    assert batch_moments([100000001.0, 100000000.0]) == (2, 100000000.5, 0.5)


@pytest.mark.parametrize(
    "make,key,value",
    [
        (Welford, "m2", float("nan")),
        (Welford, "mean", float("inf")),
        (Welford, "count", -1),
        (lambda: EWWelford(2.0), "weight", float("nan")),
        (lambda: EWWelford(2.0), "weight_sq", -1.0),
        (lambda: EWWelford(2.0), "m2", float("inf")),
    ],
)
def test_load_state_dict_rejects_non_finite_or_negative_values(make, key, value):
    acc = make().update([1.0, 3.0])
    state = copy.deepcopy(acc.state_dict())
    state[key] = value
    fresh = make()
    before = copy.deepcopy(fresh.state_dict())
    with pytest.raises(ValueError, match=rf"{key}.*{value}"):
        fresh.load_state_dict(state)
    assert fresh.state_dict() == before
