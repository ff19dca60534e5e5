"""``ebpo.diagnostics.measures``: the intervals, the gradient statistics from inner products, the sketch, and
the raw-advantage reading of each estimator."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import ebpo
from ebpo.diagnostics import measures


def test_mean_interval_and_jackknife():
    interval = measures.mean_interval([1.0, 2.0, 3.0])  # mean 2, s = 1, half = 4.303 / sqrt(3)
    assert interval.value == 2.0 and interval.high - 2.0 == pytest.approx(4.303 / math.sqrt(3), abs=1e-3)
    values = np.random.default_rng(0).normal(size=20)
    jack = measures.jackknife_interval(lambda idx: float(values[idx].mean()), 20)
    t = measures.mean_interval(values)  # the jackknife of a mean is the t-interval
    assert (jack.value, jack.low, jack.high) == pytest.approx((t.value, t.low, t.high))


def test_gradient_statistics_from_products_match_the_vectors():
    generator = torch.Generator().manual_seed(1)
    grad_RK = torch.randn(7, 5, generator=generator, dtype=torch.float64) + torch.linspace(
        1, 2, 5, dtype=torch.float64
    )
    ref_RK = grad_RK * 0.5 + torch.randn(7, 5, generator=generator, dtype=torch.float64)
    noise_R = torch.rand(7, generator=generator, dtype=torch.float64)
    products = measures.GradientProducts.of(grad_RK, ref_RK)
    ref2_R = (ref_RK**2).sum(dim=1).numpy()
    cos_R = measures.cosines(products.dot_R, products.norm2_R, ref2_R)
    torch.testing.assert_close(
        torch.from_numpy(cos_R), torch.nn.functional.cosine_similarity(grad_RK, ref_RK)
    )
    # loop reference of the relative squared error and the variance ratio (their docstrings' formulas)
    scale = sum(float(g @ r) for g, r in zip(grad_RK, ref_RK)) / sum(float(g @ g) for g in grad_RK)
    error = sum(float(((scale * g - r) ** 2).sum()) - float(n) for g, r, n in zip(grad_RK, ref_RK, noise_R))
    signal = sum(float(r @ r) - float(n) for r, n in zip(ref_RK, noise_R))
    rel = measures.relative_squared_error(products.dot_R, products.norm2_R, ref2_R, noise_R.numpy())
    assert rel == pytest.approx(error / signal)
    mean_K = grad_RK.mean(dim=0)
    spread = float(((grad_RK - mean_K) ** 2).sum() / 6)  # tr of the sample covariance
    pairs = [(r, s) for r in range(7) for s in range(7) if r != s]
    size = sum(float(grad_RK[r] @ grad_RK[s]) for r, s in pairs) / len(pairs)
    assert measures.variance_ratio(products.gram_RR) == pytest.approx(spread / size)
    assert spread == pytest.approx(
        sum(float(((grad_RK[r] - grad_RK[s]) ** 2).sum()) for r, s in pairs) / len(pairs) / 2
    )
    assert measures.variance_ratio(products.gram_RR[:1, :1]) != measures.variance_ratio(
        products.gram_RR[:1, :1]
    )  # NaN
    opposite = torch.stack([torch.ones(5), -torch.ones(5)]).double()  # no common direction: NaN, not a ratio
    assert math.isnan(measures.variance_ratio((opposite @ opposite.T).numpy()))
    # and a zero gradient aligns with nothing and is no better than nothing
    zero = measures.GradientProducts.of(torch.zeros(7, 5, dtype=torch.float64), ref_RK)
    assert np.all(measures.cosines(zero.dot_R, zero.norm2_R, ref2_R) == 0)
    assert measures.relative_squared_error(
        zero.dot_R, zero.norm2_R, ref2_R, noise_R.numpy()
    ) == pytest.approx(1.0)


def test_sketch_keeps_inner_products_in_expectation_and_is_linear():
    generator = torch.Generator().manual_seed(2)
    x_D = torch.randn(300, generator=generator, dtype=torch.float64)
    y_D = torch.randn(300, generator=generator, dtype=torch.float64)
    y_D = 0.6 * x_D + y_D
    shapes = [(20, 10), (100,)]

    def split(v: torch.Tensor) -> list[torch.Tensor]:
        return [v[:200].view(20, 10), v[200:]]

    dots = []
    for seed in range(400):
        sketch = measures.GradientSketch([200, 100], 32, seed)
        sx, sy = sketch(split(x_D)), sketch(split(y_D))
        torch.testing.assert_close(
            sketch(split(x_D + 2 * y_D)), sx + 2 * sy
        )  # linear, same (h, s) every call
        dots.append(float(sx @ sy))
    exact = float(x_D @ y_D)
    bound = math.sqrt(
        (float(x_D @ x_D) * float(y_D @ y_D) + exact**2) / 32
    )  # the docstring's bound on its sd
    assert float(np.std(dots)) <= 1.15 * bound  # the sd of 400 draws is itself off by about 4%
    assert float(np.mean(dots)) == pytest.approx(exact, abs=4 * bound / math.sqrt(400))
    whole = measures.GradientSketch([200, 100], 0, 0)(split(x_D))  # dim 0: the gradient itself
    torch.testing.assert_close(whole, x_D)
    assert shapes  # the two parameter shapes above: a matrix and a vector


@pytest.mark.parametrize(
    "text",
    ["grpo", "reinforce_pp_baseline", "dr_grpo", "rloo", "jspo", "ebpo", "ebpo:normalize=prior", "ebpo:normalize=group",
     "ebpo:prior_scope=cluster,normalize=batch", "grpo:norm_by_std=false"],
)  # fmt: skip
def test_raw_advantage_reading_matches_each_estimator(text):
    # What the table states: the training advantage is (a - m) / c with a = r - b the raw advantage, m the
    # batch mean of a where the estimator centres (else 0) and c > 0 constant within each group. Checked on
    # random batches after a few steps of history, the twin fed the same batches.
    from ebpo.diagnostics.config import parse_estimator

    name, options = parse_estimator(text)
    read = measures.raw_advantage(name, options)
    estimator = ebpo.get_estimator(name, **options)
    twin = ebpo.get_estimator(read.twin[0], **read.twin[1]) if read.twin else None
    rng = np.random.default_rng(0)
    for _ in range(4):  # four steps of history
        rewards_N = torch.from_numpy((rng.random((6, 4)) < rng.random((6, 1))).astype(float).reshape(-1))
        index_N, cluster_N = torch.arange(6).repeat_interleave(4), [m % 2 for m in range(6) for _ in range(4)]
        adv_N = estimator(rewards_N, index_N, cluster_N).double()
        raw_N = adv_N if twin is None else twin(rewards_N, index_N, cluster_N).double()
        centred_N = (raw_N - raw_N.mean() if read.centres else raw_N).view(6, 4)
        for adv_G, a_G in zip(adv_N.view(6, 4), centred_N):
            if float(a_G.abs().max()) < 1e-9:
                assert float(adv_G.abs().max()) < 1e-5
                continue
            scale = float(adv_G @ a_G / (a_G @ a_G))  # 1 / c
            assert scale > 0
            torch.testing.assert_close(adv_G, scale * a_G, atol=1e-5, rtol=1e-5)
