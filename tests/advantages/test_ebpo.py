"""EBPO (``ebpo.advantages.ebpo``): its options, values derived by hand, the loop reference over steps, the
paper's Theorem 1 and Corollary through the estimator, its state, cluster scope and bad checkpoints."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ebpo
from helpers.advantages import INDEX, REWARDS, LoopEBPO, close, random_batch


def test_ebpo_options_are_one_dataclass_the_estimator_reads():
    from dataclasses import fields

    from ebpo.advantages import EBPOEstimator, EBPOOptions
    from ebpo.advantages.checks import OptionError
    from ebpo.advantages.registry import option_names

    assert option_names("ebpo") == [f.name for f in fields(EBPOOptions)]
    assert all(len(f.metadata["help"]) > 20 for f in fields(EBPOOptions))  # each option's help, once
    options = EBPOOptions(prior_scope="cluster", prior_memory="50", cluster_min_groups=2)
    same = ebpo.get_estimator("ebpo", prior_scope="cluster", prior_memory=50, cluster_min_groups=2)
    assert repr(EBPOEstimator(options)) == repr(same) and EBPOEstimator(options).half_life == 50.0
    assert EBPOEstimator(options, normalize="prior").normalize == "prior" and options.normalize == "batch"
    for option, value in (("tau2_floor", float("nan")), ("eps", "tiny"), ("cluster_min_groups", True)):
        with pytest.raises(OptionError) as err:
            EBPOOptions(**{option: value})
        assert err.value.option == option and option in str(err.value)


def test_ebpo_hand_values_first_step():
    # W_glob after the batch: 5 ones in 12 -> mu_glob = 5/12; sigma2 = 12/11 * (5/12)(7/12) = 0.265152.
    # W_means: 0.5, 0, 0.75 -> centre 5/12, tau2 = (1/144 + 25/144 + 16/144) / 2 = 0.145833.
    # S = (0.265152/4) / (0.066288 + 0.145833) = 0.3125 for every group (all G = 4).
    # V = 0.6875 * mean + 0.3125 * 5/12: a 0.473958, b 0.130208, c 0.645833.
    mu, S = 5 / 12, 0.3125
    V = {"a": 0.6875 * 0.5 + S * mu, "b": S * mu, "c": 0.6875 * 0.75 + S * mu}
    raw = [r - V[g] for r, g in zip(REWARDS.tolist(), INDEX, strict=True)]
    est = ebpo.get_estimator("ebpo", normalize="none")
    close(est(REWARDS, INDEX), raw)
    # Theorem 1 on this batch: the all-fail group gets -S * mu_glob = -0.130208, not GRPO's 0
    assert raw[4] == pytest.approx(-0.130208, abs=1e-6)
    metrics = est.metrics()
    assert metrics["ebpo/mu_glob"] == pytest.approx(mu)
    assert metrics["ebpo/sigma2"] == pytest.approx(12 / 11 * (5 / 12) * (7 / 12))
    assert metrics["ebpo/tau2"] == pytest.approx(42 / 144 / 2)
    assert metrics["ebpo/shrinkage"] == pytest.approx(S)
    assert metrics["ebpo/baseline_mean"] == pytest.approx(sum(V.values()) / 3)
    assert metrics["groups/all_fail"] == pytest.approx(1 / 3)
    assert metrics["groups/all_pass"] == 0.0
    # batch normalisation (paper default): raw mean is 0 here, unbiased std = sqrt(1.863932 / 11)
    std = float(np.std(raw, ddof=1))
    close(ebpo.get_estimator("ebpo")(REWARDS, INDEX), [(x - np.mean(raw)) / (std + 1e-6) for x in raw])


def test_ebpo_second_step_uses_history():
    # step 1: [1, 1] in group x -> W_glob {1, 1}, W_means {1}.
    # step 2: [0, 0] in y and [1, 0] in z -> W_glob {1,1,0,0,1,0}: mu = 0.5, sigma2 = 6/5 * 0.25 = 0.3;
    #   W_means {1, 0, 0.5}: tau2 = 0.25; S = (0.3/2) / (0.15 + 0.25) = 0.375.
    #   y: V = 0.375 * 0.5 = 0.1875 -> A = -0.1875; z: V = 0.625 * 0.5 + 0.1875 = 0.5 -> A = +-0.5
    est = ebpo.get_estimator("ebpo", normalize="none")
    close(est([1.0, 1.0], ["x", "x"]), [0.0, 0.0])
    close(est([0.0, 0.0, 1.0, 0.0], ["y", "y", "z", "z"]), [-0.1875, -0.1875, 0.5, -0.5])
    assert est.metrics()["ebpo/shrinkage"] == pytest.approx(0.375)


def test_ebpo_keeps_current_only_the_accumulators_its_options_read():
    """W_within is read only with sigma2=pooled or tau2=latent and W_inv_size only with tau2=latent: other
    options leave them as they were (in the state all the same), and what they read is the same either way."""
    rewards, index = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0], [0, 0, 1, 1, 2, 2]
    paper = ebpo.get_estimator("ebpo")
    paper(rewards, index)
    prior = paper.state_dict()["prior"]
    assert (prior["W_glob"]["count"], prior["W_means"]["count"]) == (6, 3)
    assert (prior["W_within"]["count"], prior["W_inv_size"]["count"]) == (0, 0)
    both = ebpo.get_estimator("ebpo", sigma2="pooled", tau2="latent")
    both(rewards, index)
    prior = both.state_dict()["prior"]
    assert (prior["W_within"]["count"], prior["W_inv_size"]["count"]) == (3, 3)
    latent = ebpo.get_estimator("ebpo", tau2="latent")  # sigma2=total: the latent tau2 still reads W_within
    latent(rewards, index)
    assert latent.state_dict()["prior"]["W_within"]["count"] == 3
    # a checkpoint that holds them (written by either) loads into either and trains alike
    again = ebpo.get_estimator("ebpo")
    again.load_state_dict(both.state_dict() | {"options": paper.state_dict()["options"]})
    paper(rewards, index)
    again(rewards, index)
    assert paper.prior_stats() == again.prior_stats()


def test_latent_tau2_subtracts_the_within_group_variance_whatever_sigma2():
    # Groups [1, 0], [1, 1], [0, 0, 0, 1]: means 1/2, 1, 1/4 -> centre 7/12,
    #   Var(means) = (1/144 + 25/144 + 1/9) / 2 = 21/144 = 0.145833.
    # within-group sample variances 1/2, 0, 1/4 -> pooled sigma2_within = 1/4; E[1/G] = (1/2 + 1/2 + 1/4)/3 = 5/12.
    # latent tau2 = 21/144 - (1/4)(5/12) = 21/144 - 15/144 = 1/24, for sigma2=total and pooled alike.
    # (Subtracting the total variance, 8/7 * 1/4 = 2/7 here, would give 21/144 - (2/7)(5/12) = 0.026786.)
    rewards, index = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0], [0, 0, 1, 1, 2, 2, 2, 2]
    for sigma2, expected_sigma2 in (("pooled", 0.25), ("total", 8 / 7 * 0.5 * 0.5)):
        est = ebpo.get_estimator("ebpo", tau2="latent", sigma2=sigma2)
        est(rewards, index)
        prior = est.prior_stats()
        assert prior["tau2"] == pytest.approx(1 / 24) and prior["sigma2"] == pytest.approx(expected_sigma2)


# Beta(a, a) latent rates: mean 1/2, Var = 1 / (4 (2a + 1)) = 0.04 at a = 2.625; Bernoulli rewards given the rate.
BETA_A, TRUE_TAU2 = 2.625, 0.04


@pytest.mark.parametrize("G", [2, 4, 8])
def test_latent_tau2_recovers_the_between_prompt_variance_of_a_hierarchical_model(G):
    # 300 seeded replicates, each an estimator fed 4 steps of 64 prompts whose rates p ~ Beta(a, a) and whose
    # G rewards are Bernoulli(p). Var(group means) estimates tau2 + E[p (1 - p)] / G and the pooled group
    # variances estimate E[p (1 - p)], so the latent tau2 is unbiased: its mean over the replicates lies within
    # three standard errors (the replicates' sd / sqrt(300); an unbiased estimate falls outside once in 370
    # seeds) of 0.04, with sigma2=pooled and sigma2=total alike. Subtracting the total variance instead
    # estimates tau2 (1 - 1/G) (0.020, 0.030, 0.035): more than five standard errors away (about 22, 18 and 17
    # here), so the test tells the two apart.
    rng = np.random.default_rng([51, G])
    replicates, num_prompts, steps = 300, 64, 4
    estimates = []
    for _ in range(replicates):
        pooled = ebpo.get_estimator("ebpo", tau2="latent", sigma2="pooled")
        total = ebpo.get_estimator("ebpo", tau2="latent", sigma2="total")
        for _ in range(steps):
            p_M = rng.beta(BETA_A, BETA_A, size=num_prompts)
            rewards_MG = (rng.random((num_prompts, G)) < p_M[:, None]).astype(np.float64)
            index = np.repeat(np.arange(num_prompts), G)
            pooled(rewards_MG.ravel(), index)
            total(rewards_MG.ravel(), index)
        assert total.prior_stats()["tau2"] == pooled.prior_stats()["tau2"]
        estimates.append(pooled.prior_stats()["tau2"])
    mean, se = float(np.mean(estimates)), float(np.std(estimates, ddof=1) / np.sqrt(replicates))
    assert abs(mean - TRUE_TAU2) < 3 * se, (mean, se)
    assert abs(mean - TRUE_TAU2 * (1 - 1 / G)) > 5 * se, (mean, se)


EBPO_OPTIONS = [
    {},
    {"normalize": "none"},
    {"normalize": "group"},
    {"normalize": "prior"},
    {"normalize": "prior", "sigma2": "pooled", "prior_scope": "cluster", "cluster_min_groups": 2},
    {"sigma2": "pooled", "tau2": "latent", "tau2_floor": 1e-3},
    {"prior_memory": 2.5, "normalize": "none"},
    {"prior_scope": "cluster", "cluster_min_groups": 3, "normalize": "none"},
    {
        "prior_scope": "cluster",
        "cluster_min_groups": 4,
        "prior_memory": 3.0,
        "sigma2": "pooled",
        "tau2": "latent",
    },
]


@pytest.mark.parametrize(
    "options", EBPO_OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "paper"
)
@pytest.mark.parametrize("seed", range(4))
def test_ebpo_matches_loop_reference_over_steps(options, seed):
    rng = random.Random(seed)
    est, ref = ebpo.get_estimator("ebpo", **options), LoopEBPO(**options)
    for step in range(4):
        rewards, index, passed, cluster = random_batch(rng, binary=seed % 2 == 0)
        if step == 1:  # DAPO-style dropped groups: observe() feeds the prior without advantages
            est.observe(rewards, passed, cluster=cluster)
            ref.observe(rewards, index, cluster)
            rewards, index, passed, cluster = random_batch(rng, binary=seed % 2 == 0)
        adv = est(rewards, passed, cluster=np.array(cluster, dtype=object))
        expected = torch.tensor(ref(rewards, index, cluster), dtype=torch.float64)
        torch.testing.assert_close(adv.double(), expected, atol=5e-5, rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    history=st.lists(st.tuples(st.integers(1, 8), st.integers(0, 8)), min_size=1, max_size=6),
    G=st.integers(2, 8),
)
def test_theorem1_all_fail_group_gets_minus_S_mu_glob(history, G):
    # history: (group size, successes) pairs, at least one success so that mu_glob > 0
    est = ebpo.get_estimator("ebpo", normalize="none")
    rewards, index = [1.0], ["seed"]
    for g, (size, wins) in enumerate(history):
        rewards += [1.0] * min(wins, size) + [0.0] * (size - min(wins, size))
        index += [g] * size
    est.observe(rewards, index)
    fail = est([0.0] * G + [1.0, 0.0], ["fail"] * G + ["mixed", "mixed"])
    prior = est.prior_stats()
    S = (prior["sigma2"] / G) / (prior["sigma2"] / G + prior["tau2"])
    assert prior["mu_glob"] > 0 and prior["sigma2"] > 0
    torch.testing.assert_close(
        fail[:G].double(), torch.full((G,), -S * prior["mu_glob"], dtype=torch.float64)
    )
    assert (fail[:G] < 0).all()  # non-vanishing: GRPO would give exactly 0 here
    assert (ebpo.get_estimator("grpo")([0.0] * G + [1.0, 0.0], ["f"] * G + ["m", "m"])[:G] == 0).all()


@pytest.mark.parametrize("scale", [2.0, 5.0])
def test_corollary_through_the_estimator(scale):
    # The same history with rewards scaled by c > 1: mu_glob scales by c, sigma2 and tau2 by c^2, so S is
    # unchanged and the all-fail group's penalty S * mu_glob is exactly c times larger.
    rng = random.Random(3)
    history = [float(rng.random() < 0.4) for _ in range(64)]
    groups = [i // 4 for i in range(64)]
    penalties = []
    for c in (1.0, scale):
        est = ebpo.get_estimator("ebpo", normalize="none")
        est.observe([c * r for r in history], groups)
        penalties.append(-float(est([0.0] * 4 + [c, 0.0], [0] * 4 + [1, 1])[0]))
    assert penalties[0] > 0
    assert penalties[1] == pytest.approx(scale * penalties[0], rel=1e-5)


def test_a_state_saved_under_other_options_is_refused():
    # that a state_dict round trip continues identically is check_estimator's (tests/test_testing.py)
    est = ebpo.get_estimator("ebpo", prior_memory=4.0)
    est([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1])
    with pytest.raises(ValueError, match="prior_memory"):
        ebpo.get_estimator("ebpo", prior_memory=9.0).load_state_dict(est.state_dict())


@pytest.mark.parametrize(
    ("option", "saved", "requested"),
    [
        ("prior_scope", "global", "cluster"),
        ("cluster_min_groups", 16, 4),
        ("prior_memory", "all", 50.0),
        ("tau2", "raw", "latent"),
        ("tau2_floor", 1e-4, 1e-3),
        ("sigma2", "total", "pooled"),
        ("normalize", "batch", "prior"),
        ("eps", 1e-6, 1e-5),
    ],
)
def test_every_option_is_compared_on_load_and_a_difference_named(option, saved, requested):
    written = ebpo.get_estimator("ebpo")
    written([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1])
    state = copy.deepcopy(written.state_dict())
    target = ebpo.get_estimator("ebpo", **{option: requested})
    before = copy.deepcopy(target.state_dict())
    with pytest.raises(ValueError) as err:
        target.load_state_dict(state)
    assert str(err.value) == (
        f"EBPO checkpoint was written with other options: {option}={saved!r} (this estimator: {requested!r}); "
        "build the estimator with the checkpoint's options to continue its prior, or start without the "
        "checkpoint's state"
    )
    assert target.state_dict() == before  # nothing taken


def test_options_differing_together_are_named_in_one_line_and_a_missing_one_is_its_default():
    written = ebpo.get_estimator("ebpo")
    written([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1])
    with pytest.raises(ValueError) as err:
        ebpo.get_estimator("ebpo", tau2="latent", prior_scope="cluster").load_state_dict(written.state_dict())
    assert str(err.value).startswith(
        "EBPO checkpoint was written with other options: prior_scope='global' (this estimator: 'cluster'), "
        "tau2='raw' (this estimator: 'latent'); "
    )
    # an option a state does not record (written before it existed) counts as its default
    older = copy.deepcopy(written.state_dict())
    del older["options"]["eps"]
    again = ebpo.get_estimator("ebpo")
    again.load_state_dict(older)
    assert again.prior_stats() == written.prior_stats()
    with pytest.raises(ValueError, match=r"options: eps=1e-06 \(this estimator: 0\.001\)"):
        ebpo.get_estimator("ebpo", eps=1e-3).load_state_dict(older)


def test_cluster_scope_falls_back_to_global_below_threshold():
    # cluster "geo" has 2 groups (< 3 needed) and uses the global prior; "alg" has 3 groups and uses its own.
    est = ebpo.get_estimator("ebpo", prior_scope="cluster", cluster_min_groups=3, normalize="none")
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    index = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    cluster = ["geo", "geo", "geo", "geo", "alg", "alg", "alg", "alg", "alg", "alg"]
    adv = est(rewards, index, cluster=cluster)
    glob, alg = est.prior_stats(), est.prior_stats("alg")
    assert est.prior_stats("geo")["num_groups"] == 2 and alg["num_groups"] == 3
    # global: mu = 5/10; alg: rewards 1,1,1,1,0,0 -> mu 2/3, sigma2 = 6/5 * 2/9 = 4/15, tau2 of (1,1,0) = 1/3
    assert alg["mu_glob"] == pytest.approx(2 / 3) and alg["tau2"] == pytest.approx(1 / 3)
    for members, prior in (([2, 3], glob), ([8, 9], alg)):  # all-fail groups: raw advantage -S * mu
        S = (prior["sigma2"] / 2) / (prior["sigma2"] / 2 + prior["tau2"])
        for i in members:
            assert float(adv[i]) == pytest.approx(-S * prior["mu_glob"], rel=1e-6)
    assert est.metrics()["ebpo/cluster_prior_frac"] == pytest.approx(3 / 5)
    with pytest.raises(ValueError, match=r"prior_scope='cluster'.*cluster="):
        est(rewards, index)
    with pytest.raises(ValueError, match=r"\bsample 0\b"):
        est([1.0, 0.0], [0, 0], cluster=["geo", "alg"])


def test_a_batch_rejected_midway_leaves_the_prior_unchanged():
    # cluster keys that vary within a group are found after the global prior was already updated: the
    # estimator must roll the update back.
    est = ebpo.get_estimator("ebpo", prior_scope="cluster")
    est([1.0, 0.0], [0, 0], cluster=["geo", "geo"])
    before = copy.deepcopy(est.state_dict())
    with pytest.raises(ValueError, match=r"\bsample 0\b"):
        est([1.0, 0.0], [0, 0], cluster=["geo", "alg"])
    with pytest.raises(ValueError, match=r"\bsample 0\b"):
        est.observe([1.0, 0.0], [0, 0], cluster=["geo", "alg"])
    assert est.state_dict() == before


@pytest.mark.parametrize(
    "path,value",
    [
        (("prior", "W_glob", "m2"), float("nan")),
        (("prior", "W_means", "mean"), float("inf")),
        (("prior", "W_glob", "count"), -3),
        (("cluster_priors", 0, 1, "W_within", "m2"), float("-inf")),
    ],
)
def test_load_state_dict_rejects_a_non_finite_or_negative_state(path, value):
    est = ebpo.get_estimator("ebpo", prior_scope="cluster")
    est([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1], cluster=["geo", "geo", "alg", "alg"])
    good = copy.deepcopy(est.state_dict())
    bad = copy.deepcopy(good)
    node = bad
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    target = ebpo.get_estimator("ebpo", prior_scope="cluster")
    target.load_state_dict(copy.deepcopy(good))
    with pytest.raises(ValueError, match=rf"{path[-2]}: .*{path[-1]}={value}"):
        target.load_state_dict(bad)
    assert target.state_dict() == good  # a rejected checkpoint changes nothing


def test_normalize_prior_flows_through_the_trainer_config():
    # the trainer passes algorithm.ebpo (EBPOOptions; algorithm.estimator_options with estimator ebpo) to
    # get_estimator; verl's +algorithm.ebpo.normalize and TRL's EBPOConfig.normalize do the same
    from ebpo.errors import ConfigError
    from ebpo.trainer import load_config

    for spelling in ("ebpo", "estimator_options"):
        cfg = load_config(None, [f"algorithm.{spelling}.normalize=prior"])
        est = ebpo.get_estimator(cfg.algorithm.estimator, **cfg.algorithm.estimator_kwargs())
        assert est.normalize == "prior"
        with pytest.raises(ConfigError, match=r"algorithm\.ebpo\.normalize 'priors'.*\bbatch, group\b"):
            load_config(None, [f"algorithm.{spelling}.normalize=priors"])
