"""Tests for ebpo.simulate.study: Theorem 2 reproduction, the baseline and prior read-out, the whole study."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ebpo import get_estimator
from ebpo.simulate import (
    SimulateConfig,
    Stream,
    estimator_specs,
    make_stream,
    recover_prior,
    run_estimator,
    simulate,
    theorem2,
)

SMALL = dict(steps=24, warmup=4, prompts_per_step=8, pool_size=16, topic_block=3, theorem2_steps=30)


def test_theorem2_ebpo_mse_matches_closed_form():
    # G = 4, sigma2 = 0.04, tau2 = 0.01: sigma2/G = 0.01, S = 0.01 / (0.01 + 0.01) = 0.5,
    # closed form (1 - S) sigma2/G = 0.005 against GRPO's 0.01.
    cfg = SimulateConfig(group_size=4, prompts_per_step=64, theorem2_steps=200, warmup=20)
    t2 = theorem2(cfg, seed=0)
    assert t2["shrinkage_true"] == pytest.approx(0.5)
    assert t2["closed_form_ebpo"] == pytest.approx(0.005)
    assert t2["closed_form_grpo"] == pytest.approx(0.01)
    # 180 measured steps x 64 groups = 11520 squared errors: the relative Monte Carlo standard error of an
    # MSE is about sqrt(2 / 11520) = 1.3%, so 5% is a ~4-sigma tolerance.
    assert t2["groups"] == 180 * 64
    assert abs(t2["rel_err_ebpo_textbook"]) < 0.05
    assert t2["mse_grpo"] == pytest.approx(0.01, rel=0.05)
    assert t2["mse_ebpo_textbook"] < 0.7 * t2["mse_grpo"]  # strictly lower MSE than GRPO (Theorem 2)
    # paper defaults use w = (V_tot/G) / (V_tot/G + Var(means)) with V_tot = 0.05, Var(means) = 0.02:
    # w = 0.0125 / 0.0325 = 0.385, and MSE (1 - w)^2 0.01 + w^2 0.01 = 0.00527 > 0.005
    assert t2["paper_weight_w"] == pytest.approx(0.0125 / 0.0325, abs=0.02)
    assert t2["mse_ebpo_paper"] == pytest.approx(t2["closed_form_ebpo_paper"], rel=0.05)
    assert t2["closed_form_ebpo_paper"] > t2["closed_form_ebpo"]


def test_run_estimator_hand_values():
    # one step, two groups of two: rewards [1, 0] (theta 0.5) and [0, 0] (theta 0.25), no warm-up.
    stream = Stream(
        theta_SM=np.array([[0.5, 0.25]]),
        topic_SM=np.array([[0, 1]]),
        rewards_SMG=np.array([[[1.0, 0.0], [0.0, 0.0]]]),
        oracle_topic_mean_SM=np.array([[0.5, 0.25]]),
        oracle_global_mean_SM=np.array([[0.375, 0.375]]),
    )
    specs = {spec.label: spec for spec in estimator_specs(half_life=10.0)}
    # Dr. GRPO baseline = group mean: [0.5, 0.5 | 0, 0]; squared errors 0, 0, 0.0625, 0.0625 -> MSE 0.03125.
    # Advantages [0.5, -0.5, 0, 0]: half of them zero; the all-fail group's |A| is 0.
    dr, _ = run_estimator(specs["dr_grpo"], stream, warmup=0)
    assert dr["baseline_mse"] == pytest.approx(0.03125)
    assert dr["zero_adv_frac"] == pytest.approx(0.5)
    assert dr["all_fail_abs_adv"] == 0.0
    assert math.isnan(dr["prior_mse"])
    # RLOO baseline = mean of the other sample: [0, 1 | 0, 0]; squared errors 0.25, 0.25, 0.0625, 0.0625
    # -> MSE 0.625 / 4 = 0.15625.
    rloo, _ = run_estimator(specs["rloo"], stream, warmup=0)
    assert rloo["baseline_mse"] == pytest.approx(0.15625)
    # GRPO divides by the group std but reads its baseline from the group mean: same MSE as Dr. GRPO;
    # its advantages [0.707, -0.707, 0, 0] are zero in the all-fail group as well.
    grpo, _ = run_estimator(specs["grpo"], stream, warmup=0)
    assert grpo["baseline_mse"] == pytest.approx(0.03125)
    assert grpo["zero_adv_frac"] == pytest.approx(0.5)


def test_recover_prior_matches_the_estimators_prior():
    # Global scope: the mu recovered from EBPO's baseline is the estimator's own mu_glob after the step.
    # Cluster scope: once a cluster has its own prior, the recovered mu is that cluster's mean.
    rng = np.random.default_rng(0)
    M, G = 12, 4
    index_N = np.repeat(np.arange(M), G)
    cluster_M = np.arange(M) % 3
    cluster_N = np.repeat(cluster_M, G)
    global_est = get_estimator("ebpo", normalize="none")
    cluster_est = get_estimator("ebpo", normalize="none", prior_scope="cluster", cluster_min_groups=4)
    checked = 0
    for step in range(6):
        theta_M = np.array([0.2, 0.5, 0.8])[cluster_M]
        rewards_N = torch.from_numpy((rng.random(M * G) < np.repeat(theta_M, G)).astype(np.float64))
        rbar_M = rewards_N.numpy().reshape(M, G).mean(axis=1)
        for est, key_M in ((global_est, np.zeros(M, dtype=int)), (cluster_est, cluster_M)):
            baseline_M = (rewards_N - est(rewards_N, index_N, cluster_N).double()).numpy()[::G]
            mu_M, shrinkage_M = recover_prior(baseline_M, rbar_M, key_M)
            for key in np.unique(key_M):
                in_key = key_M == key
                if np.isnan(mu_M[in_key]).any():
                    continue
                if est is global_est:
                    expected = est.prior_stats()["mu_glob"]
                elif step >= 1:  # 4 groups per cluster per step: own prior from the first step on
                    expected = est.prior_stats(int(key))["mu_glob"]
                else:
                    continue
                assert mu_M[in_key] == pytest.approx(expected, abs=1e-5)
                assert 0 < shrinkage_M[in_key][0] < 1
                checked += 1
    assert checked >= 12


@pytest.mark.parametrize("options", [{}, {"prior_scope": "cluster", "cluster_min_groups": 2}])
def test_ebpo_batch_advantage_is_batch_normalize_of_the_raw_one(options):
    # the study runs EBPO once with normalize="none" and batch-normalises itself: check that this is
    # exactly what the estimator's default normalize="batch" returns, step after step
    from ebpo.advantages import batch_normalize

    rng = np.random.default_rng(1)
    M, G = 6, 4
    index_N = np.repeat(np.arange(M), G)
    cluster_N = np.repeat(np.arange(M) % 2, G)
    batch_est = get_estimator("ebpo", **options)
    raw_est = get_estimator("ebpo", normalize="none", **options)
    for _ in range(5):
        rewards_N = torch.from_numpy((rng.random(M * G) < 0.4).astype(np.float64))
        expected_N = batch_est(rewards_N, index_N, cluster_N)
        raw_N = raw_est(rewards_N, index_N, cluster_N)
        assert torch.allclose(batch_normalize(raw_N.double()).float(), expected_N, atol=1e-5)


def test_recover_prior_hand_values():
    # S = 0.25, mu = 0.6: V = 0.75 rbar + 0.15. rbar = [0, 0.5, 1] -> V = [0.15, 0.525, 0.9].
    # A key with one distinct rbar cannot identify S: NaN.
    mu_M, shrinkage_M = recover_prior(
        np.array([0.15, 0.525, 0.9, 0.3]), np.array([0.0, 0.5, 1.0, 0.25]), np.array([0, 0, 0, 1])
    )
    assert mu_M[:3].tolist() == pytest.approx([0.6] * 3)
    assert shrinkage_M[:3].tolist() == pytest.approx([0.25] * 3)
    assert np.isnan(mu_M[3]) and np.isnan(shrinkage_M[3])


def test_cluster_prior_reaches_the_propositions_ideal_and_global_prior_does_not():
    # The clustering proposition: a prior adapted to the topic has MSE E_k Var(theta | k), a global one
    # Var(theta). EBPO's cluster scope gets the former on a shuffled stream; the paper's global prior the latter.
    cfg = SimulateConfig(steps=60, warmup=15, prompts_per_step=32)
    stream = make_stream(cfg, "shuffled", "stationary", seed=0)
    specs = estimator_specs(cfg.half_life)
    paper, cluster = specs[5], specs[6]
    assert paper.options == {"normalize": "none"}
    assert cluster.options == {"normalize": "none", "prior_scope": "cluster"}
    oracle = {
        "global": np.mean((stream.oracle_global_mean_SM[15:] - stream.theta_SM[15:]) ** 2),
        "topic": np.mean((stream.oracle_topic_mean_SM[15:] - stream.theta_SM[15:]) ** 2),
    }
    paper_result, _ = run_estimator(paper, stream, cfg.warmup)
    cluster_result, _ = run_estimator(cluster, stream, cfg.warmup)
    assert paper_result["prior_mse"] == pytest.approx(oracle["global"], rel=0.1)
    assert cluster_result["prior_mse"] == pytest.approx(oracle["topic"], rel=0.15)
    assert cluster_result["baseline_mse"] < paper_result["baseline_mse"]


def test_simulate_is_deterministic_by_seed():
    tiny = {**SMALL, "steps": 12, "topic_block": 2, "theorem2_steps": 12}
    a = simulate(SimulateConfig(seeds=[3], **tiny))
    b = simulate(SimulateConfig(seeds=[3], **tiny))
    assert len(a.rows) == 4 * len(estimator_specs(10.0))
    np.testing.assert_equal(a.rows, b.rows)
    assert a.theorem2 == b.theorem2
    # another seed draws another stream, hence other figures
    cfg = SimulateConfig(**tiny)
    for order in ("shuffled", "topic"):
        s3, s4 = make_stream(cfg, order, "improving", 3), make_stream(cfg, order, "improving", 4)
        assert not np.array_equal(s3.rewards_SMG, s4.rewards_SMG)
    assert theorem2(cfg, seed=4) != theorem2(cfg, seed=3)
