"""The pure group maths (``ebpo.advantages.core``): the paper's Theorem 2 and Corollary on
``shrinkage_baseline``, and EBPO with zero shrinkage reducing to Dr. GRPO."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ebpo
from ebpo.advantages import dr_grpo_advantage, ebpo_advantage, group_ids, group_moments, shrinkage_baseline
from helpers.advantages import random_batch


def test_theorem2_baseline_mse_is_one_minus_S_sigma2_over_G():
    # Gaussian model: theta_m ~ N(mu, tau2); r_mi ~ N(theta_m, sigma2), i = 1..G. With the true (mu, sigma2,
    # tau2), MSE(V_eb, theta) = (1-S)^2 sigma2/G + S^2 tau2 = (1 - S) sigma2 / G < sigma2 / G (GRPO's).
    gen = torch.Generator().manual_seed(0)
    mu, sigma2, tau2, G, M = 0.4, 0.25, 0.02, 4, 400_000
    theta_M = mu + math.sqrt(tau2) * torch.randn(M, generator=gen, dtype=torch.float64)
    mean_M = theta_M + math.sqrt(sigma2 / G) * torch.randn(M, generator=gen, dtype=torch.float64)
    count_M = torch.full((M,), float(G), dtype=torch.float64)

    def s(x):
        return torch.tensor(x, dtype=torch.float64)

    shrinkage, V_eb = shrinkage_baseline(mean_M, count_M, s(mu), s(sigma2), s(tau2))
    S = (sigma2 / G) / (sigma2 / G + tau2)  # 0.0625 / 0.0825 = 0.757576
    assert float(shrinkage[0]) == pytest.approx(S)
    mse_eb = float(((V_eb - theta_M) ** 2).mean())
    mse_grpo = float(((mean_M - theta_M) ** 2).mean())
    # Monte Carlo standard error of a mean of squared Gaussians: sqrt(2 / M) relative
    rel_se = math.sqrt(2 / M)
    assert mse_eb == pytest.approx((1 - S) * sigma2 / G, rel=5 * rel_se)  # 0.015152
    assert mse_grpo == pytest.approx(sigma2 / G, rel=5 * rel_se)
    assert mse_eb < mse_grpo


@settings(max_examples=60, deadline=None)
@given(
    mu_low=st.floats(0.0, 0.9),
    gap=st.floats(0.01, 0.5),
    sigma2=st.floats(1e-3, 1.0),
    tau2=st.floats(0.0, 1.0),
    G=st.integers(1, 32),
)
def test_corollary_penalty_grows_with_mu_glob(mu_low, gap, sigma2, tau2, G):
    # an all-fail group (mean 0) at fixed S: raw advantage -S * mu_glob, more negative for larger mu_glob
    count, mean = torch.tensor([float(G)], dtype=torch.float64), torch.zeros(1, dtype=torch.float64)

    def s(x):
        return torch.tensor(x, dtype=torch.float64)

    S_low, V_low = shrinkage_baseline(mean, count, s(mu_low), s(sigma2), s(tau2))
    _, V_high = shrinkage_baseline(mean, count, s(mu_low + gap), s(sigma2), s(tau2))
    assert float(V_high) - float(V_low) == pytest.approx(float(S_low) * gap, rel=1e-9, abs=1e-15)
    assert float(V_high) > float(V_low)  # penalty -V grows with mu_glob (S > 0 since sigma2 > 0)


def test_ebpo_with_zero_shrinkage_and_no_normalisation_is_dr_grpo():
    rng = random.Random(7)
    for _ in range(5):
        rewards, _, passed, _ = random_batch(rng, binary=True)
        rewards_N = torch.tensor(rewards, dtype=torch.float64)
        group_N, M = group_ids(passed)
        stats = group_moments(rewards_N, group_N, M)
        zeros = torch.zeros(M, dtype=torch.float64)
        # sigma2 = 0 forces S = 0 whatever mu_glob and tau2 are
        adv, shrinkage, _ = ebpo_advantage(
            rewards_N, group_N, stats, zeros + 0.7, zeros, zeros + 0.3, normalize="none"
        )
        assert (shrinkage == 0).all()
        torch.testing.assert_close(adv, dr_grpo_advantage(rewards_N, group_N, M), atol=0, rtol=0)
        torch.testing.assert_close(
            ebpo.get_estimator("dr_grpo")(rewards, passed).double(), adv, atol=1e-6, rtol=1e-6
        )
