"""EBPO's ``prior_staleness``: how groups sampled by older weights (``lag=``) enter the prior; values by hand."""

from __future__ import annotations

import pytest
import torch

import ebpo
from ebpo.advantages import EBPOOptions
from ebpo.advantages.checks import OptionError

# two groups of 2: a fresh one [1, 1] and one sampled 4 versions ago [0, 0]
REWARDS = [1.0, 1.0, 0.0, 0.0]
INDEX = [0, 0, 1, 1]
LAG = [0, 0, 4, 4]


def test_all_reads_the_lag_only_for_its_metrics():
    with_lag, without = ebpo.get_estimator("ebpo"), ebpo.get_estimator("ebpo")
    for step in range(3):
        rewards = [float((step + i) % 3 == 0) for i in range(8)]
        index = [i // 4 for i in range(8)]
        adv = with_lag(rewards, index, lag=[step] * 4 + [step + 2] * 4)
        assert torch.equal(adv, without(rewards, index))
    assert with_lag.state_dict() == without.state_dict()
    # groups of lag 2 and 4 in the last call: mean 3, max 4; nothing left out or down-weighted
    assert with_lag.metrics()["ebpo/staleness_mean"] == 3.0
    assert with_lag.metrics()["ebpo/staleness_max"] == 4.0
    assert with_lag.metrics()["ebpo/stale_groups_left_out"] == 0.0
    assert "ebpo/staleness_mean" not in without.metrics()


def test_max_lag_leaves_stale_groups_out_of_the_prior_but_gives_them_advantages():
    est = ebpo.get_estimator("ebpo", prior_staleness="max_lag", staleness_max_lag=3, normalize="none")
    adv = est(REWARDS, INDEX, lag=LAG)
    # only [1, 1] entered: mu_glob = 1, sigma2 = var(1, 1) = 0, tau2 = 0 (one group mean) -> S = 0: a = r - rbar
    assert est.prior_stats() == {"mu_glob": 1.0, "sigma2": 0.0, "tau2": 0.0, "num_groups": 1}
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]
    assert est.metrics()["ebpo/stale_groups_left_out"] == 1.0
    # lag 3 is still in (lag <= staleness_max_lag)
    est.observe([0.0, 1.0], [7, 7], lag=[3, 3])
    assert est.prior_stats()["num_groups"] == 2


def test_decay_weighs_a_group_by_half_to_the_lag_over_the_half_life():
    est = ebpo.get_estimator("ebpo", prior_staleness="decay", staleness_half_life=4.0)
    est.observe(REWARDS, INDEX, lag=LAG)
    stats = est.prior_stats()
    # weights 1 (lag 0) and 0.5 (lag 4 = one half-life): W = 2 * 1 + 2 * 0.5 = 3, mu_glob = 2 / 3;
    # group means 1 and 0 weigh 1 and 0.5: mean 2/3, M2 = 1 (1/3)^2 + 0.5 (2/3)^2 = 1/3,
    # W - W2 / W = 1.5 - 1.25 / 1.5 = 2/3, tau2 = (1/3) / (2/3) = 0.5; num_groups = total weight 1.5
    assert stats["mu_glob"] == pytest.approx(2 / 3, rel=1e-12)
    assert stats["tau2"] == pytest.approx(0.5, rel=1e-12)
    assert stats["num_groups"] == pytest.approx(1.5, rel=1e-12)
    est(REWARDS, INDEX, lag=LAG)
    assert est.metrics()["ebpo/stale_groups_down_weighted"] == 1.0


def test_decay_with_every_lag_zero_equals_all():
    decay, plain = ebpo.get_estimator("ebpo", prior_staleness="decay"), ebpo.get_estimator("ebpo")
    generator = torch.Generator().manual_seed(0)
    for _ in range(4):
        rewards = (torch.rand(32, generator=generator) < 0.4).double()
        index = torch.arange(32) // 4
        assert torch.allclose(decay(rewards, index, lag=[0] * 32), plain(rewards, index), atol=1e-6)
    for key, value in plain.prior_stats().items():
        assert decay.prior_stats()[key] == pytest.approx(value, rel=1e-12)


def test_a_group_lag_is_its_oldest_response():
    est = ebpo.get_estimator("ebpo", prior_staleness="max_lag", staleness_max_lag=2)
    est.observe(REWARDS, INDEX, lag=[0, 3, 0, 0])  # group 0 has one response of lag 3: the group is out
    assert est.prior_stats()["mu_glob"] == 0.0 and est.prior_stats()["num_groups"] == 1


def test_a_bad_lag_is_refused_and_leaves_the_prior_as_it_was():
    est = ebpo.get_estimator("ebpo", prior_staleness="decay")
    est.observe(REWARDS, INDEX, lag=LAG)
    saved = est.state_dict()
    with pytest.raises(ValueError, match="lag of sample 2 is -1"):
        est(REWARDS, INDEX, lag=[0, 0, -1, 0])
    with pytest.raises(ValueError, match="lag has 3 entries but rewards has 4"):
        est.observe(REWARDS, INDEX, lag=[0, 0, 0])
    assert est.state_dict() == saved


@pytest.mark.parametrize(
    "options, key",
    [
        ({"prior_staleness": "newest"}, "prior_staleness"),
        ({"staleness_max_lag": -1}, "staleness_max_lag"),
        ({"staleness_max_lag": 1.5}, "staleness_max_lag"),
        ({"staleness_half_life": 0.0}, "staleness_half_life"),
        ({"staleness_half_life": float("inf")}, "staleness_half_life"),
    ],
)
def test_bad_staleness_options_name_the_option(options, key):
    with pytest.raises(OptionError) as err:
        EBPOOptions(**options)
    assert err.value.option == key


def test_a_decay_prior_resumes_exactly():
    options = {"prior_staleness": "decay", "staleness_half_life": 2.0, "prior_scope": "cluster"}
    straight, resumed = ebpo.get_estimator("ebpo", **options), ebpo.get_estimator("ebpo", **options)
    cluster = ["a", "a", "b", "b"]
    straight(REWARDS, INDEX, cluster, lag=LAG)
    resumed.load_state_dict(straight.state_dict())
    assert torch.equal(
        straight([0.0, 1.0, 1.0, 1.0], INDEX, cluster, lag=[1, 1, 0, 0]),
        resumed([0.0, 1.0, 1.0, 1.0], INDEX, cluster, lag=[1, 1, 0, 0]),
    )
    assert straight.state_dict() == resumed.state_dict()
