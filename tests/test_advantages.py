"""Advantage estimators: hand-derived values, loop references, the paper's theorems, state, bad input."""

from __future__ import annotations

import copy
import io
import math
import random
import re
from collections import defaultdict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ebpo
from ebpo.advantages import (
    GroupStats,
    dr_grpo_advantage,
    ebpo_advantage,
    group_ids,
    group_moments,
    shrinkage_baseline,
)

# One batch used for the hand-derived values: three groups of four.
#   a = [1, 0, 0, 1]: mean 0.5,  s^2 = 4 * 0.25 / 3 = 1/3
#   b = [0, 0, 0, 0]: mean 0,    s^2 = 0            (an all-fail group)
#   c = [1, 1, 1, 0]: mean 0.75, s^2 = (3 * 0.0625 + 0.5625) / 3 = 0.25
REWARDS = torch.tensor([1.0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 0])
INDEX = np.array(["a"] * 4 + ["b"] * 4 + ["c"] * 4, dtype=object)


def _close(actual: torch.Tensor, expected: list[float], atol: float = 1e-5) -> None:
    assert actual.dtype == torch.float32
    torch.testing.assert_close(
        actual.double(), torch.tensor(expected, dtype=torch.float64), atol=atol, rtol=0
    )


# ------------------------------------------------------------------------------------------------
# registry
# ------------------------------------------------------------------------------------------------


def test_registry_names_and_errors():
    assert ebpo.list_estimators() == ["dr_grpo", "ebpo", "grpo", "jspo", "reinforce_pp_baseline", "rloo"]
    with pytest.raises(
        ValueError,
        match=r"'gpro'.*dr_grpo, ebpo, grpo, jspo, reinforce_pp_baseline, rloo$",
    ):
        ebpo.get_estimator("gpro")
    with pytest.raises(TypeError, match=r"\['shrink'\].*prior_scope"):
        ebpo.get_estimator("ebpo", shrink=0.5)
    with pytest.raises(TypeError, match="norm_by_std"):
        ebpo.get_estimator("rloo", norm_by_std=False)
    with pytest.raises(ValueError, match=r"normalize 'token'.*batch, group, none, prior$"):
        ebpo.get_estimator("ebpo", normalize="token")
    with pytest.raises(ValueError, match="prior_memory"):
        ebpo.get_estimator("ebpo", prior_memory="forever")
    with pytest.raises(ValueError, match=r"cluster_min_groups.*2\.5"):
        ebpo.get_estimator("ebpo", cluster_min_groups=2.5)  # refused, not truncated to 2


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


def test_register_custom_estimator():
    @ebpo.register_estimator("test_constant_one")
    class ConstantOne(ebpo.AdvantageEstimator):
        def _advantages(self, batch):
            return torch.ones_like(batch.rewards_N), {}

    try:
        assert "test_constant_one" in ebpo.list_estimators()
        _close(ebpo.get_estimator("test_constant_one")(REWARDS, INDEX), [1.0] * 12)
    finally:
        ebpo.advantages.registry._ESTIMATORS.unregister("test_constant_one")


# ------------------------------------------------------------------------------------------------
# hand-derived values
# ------------------------------------------------------------------------------------------------


def test_grpo_hand_values():
    # a: +-0.5 / sqrt(1/3) = +-0.866025; b: 0 / (0 + eps) = 0; c: 0.25 / 0.5 = 0.5 and -0.75 / 0.5 = -1.5
    e = 0.8660254
    _close(ebpo.get_estimator("grpo")(REWARDS, INDEX), [e, -e, -e, e, 0, 0, 0, 0, 0.5, 0.5, 0.5, -1.5])
    # norm_by_std=False is Dr. GRPO: r - mean
    expected = [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, 0.25, 0.25, 0.25, -0.75]
    _close(ebpo.get_estimator("grpo", norm_by_std=False)(REWARDS, INDEX), expected)
    _close(ebpo.get_estimator("dr_grpo")(REWARDS, INDEX), expected)


def test_rloo_hand_values():
    # a, r=1: 1 - (0 + 0 + 1)/3 = 2/3; r=0: 0 - 2/3.  c, r=1: 1 - 2/3 = 1/3; r=0: 0 - 1 = -1.
    t = 2.0 / 3.0
    _close(ebpo.get_estimator("rloo")(REWARDS, INDEX), [t, -t, -t, t, 0, 0, 0, 0, 1 / 3, 1 / 3, 1 / 3, -1.0])
    # a group of one has no leave-one-out baseline: 0. Group [0.9, 0.1]: 0.9 - 0.1 = 0.8 and 0.1 - 0.9
    _close(ebpo.get_estimator("rloo")([0.3, 0.9, 0.1], [0, 1, 1]), [0.0, 0.8, -0.8])


def test_reinforce_pp_baseline_hand_values():
    # a = r - group mean = [.5,-.5,-.5,.5, 0,0,0,0, .25,.25,.25,-.75]; its mean is 0;
    # unbiased var = (4 * .25 + 3 * .0625 + .5625) / 11 = 1.75 / 11 -> std 0.3988620; A = a / std
    std = math.sqrt(1.75 / 11)
    raw = [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, 0.25, 0.25, 0.25, -0.75]
    _close(ebpo.get_estimator("reinforce_pp_baseline")(REWARDS, INDEX), [x / std for x in raw])


def test_jspo_hand_values():
    # noise s_q^2 / G: a = 1/12, b = 0, c = 1/16.
    # prompt a: others b, c. v2 = (0 + 1/16)/2 = 0.03125; their means 0, 0.75 -> centre 0.375,
    #   s2 = 0.375^2 = 0.140625; lambda = 0.03125 / 0.171876 = 0.181817; outside mean = 3/8 = 0.375.
    #   r=1: LOO mean 1/3, baseline = 0.818183/3 + 0.181817*0.375 = 0.340909 -> A = 0.659091
    #   r=0: LOO mean 2/3, baseline = 0.545455 + 0.068181 = 0.613636 -> A = -0.613636
    # prompt b: others a, c. v2 = (1/12 + 1/16)/2 = 0.072917; means 0.5, 0.75 -> s2 = 0.125^2 = 0.015625;
    #   lambda = 0.072917 / 0.088543 = 0.823527; LOO mean 0, outside mean 5/8 -> baseline 0.514704
    # prompt c: others a, b. v2 = 1/24 = 0.041667; means 0.5, 0 -> s2 = 0.0625; lambda = 0.400000;
    #   outside mean 2/8 = 0.25. r=1: LOO 2/3 -> baseline 0.6*2/3 + 0.4*0.25 = 0.5 -> A = 0.5;
    #   r=0: LOO 1 -> baseline 0.6 + 0.1 = 0.7 -> A = -0.7
    lam_b = (7 / 96) / (7 / 96 + 1 / 64 + 1e-6)
    b = -lam_b * 0.625
    expected = [0.659091, -0.613636, -0.613636, 0.659091, b, b, b, b, 0.5, 0.5, 0.5, -0.7]
    est = ebpo.get_estimator("jspo")
    _close(est(REWARDS, INDEX), expected, atol=2e-5)
    assert est.metrics()["jspo/lambda"] == pytest.approx((0.181817 + lam_b + 0.4) / 3, abs=1e-5)


def test_ebpo_hand_values_first_step():
    # W_glob after the batch: 5 ones in 12 -> mu_glob = 5/12; sigma2 = 12/11 * (5/12)(7/12) = 0.265152.
    # W_means: 0.5, 0, 0.75 -> centre 5/12, tau2 = (1/144 + 25/144 + 16/144) / 2 = 0.145833.
    # S = (0.265152/4) / (0.066288 + 0.145833) = 0.3125 for every group (all G = 4).
    # V = 0.6875 * mean + 0.3125 * 5/12: a 0.473958, b 0.130208, c 0.645833.
    mu, S = 5 / 12, 0.3125
    V = {"a": 0.6875 * 0.5 + S * mu, "b": S * mu, "c": 0.6875 * 0.75 + S * mu}
    raw = [r - V[g] for r, g in zip(REWARDS.tolist(), INDEX, strict=True)]
    est = ebpo.get_estimator("ebpo", normalize="none")
    _close(est(REWARDS, INDEX), raw)
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
    _close(ebpo.get_estimator("ebpo")(REWARDS, INDEX), [(x - np.mean(raw)) / (std + 1e-6) for x in raw])


def test_ebpo_second_step_uses_history():
    # step 1: [1, 1] in group x -> W_glob {1, 1}, W_means {1}.
    # step 2: [0, 0] in y and [1, 0] in z -> W_glob {1,1,0,0,1,0}: mu = 0.5, sigma2 = 6/5 * 0.25 = 0.3;
    #   W_means {1, 0, 0.5}: tau2 = 0.25; S = (0.3/2) / (0.15 + 0.25) = 0.375.
    #   y: V = 0.375 * 0.5 = 0.1875 -> A = -0.1875; z: V = 0.625 * 0.5 + 0.1875 = 0.5 -> A = +-0.5
    est = ebpo.get_estimator("ebpo", normalize="none")
    _close(est([1.0, 1.0], ["x", "x"]), [0.0, 0.0])
    _close(est([0.0, 0.0, 1.0, 0.0], ["y", "y", "z", "z"]), [-0.1875, -0.1875, 0.5, -0.5])
    assert est.metrics()["ebpo/shrinkage"] == pytest.approx(0.375)


def test_all_fail_all_pass_metrics_binary_and_shaped():
    est = ebpo.get_estimator("grpo")
    # binary: groups [0,0] fail, [1,1] pass, [0,1] neither
    est([0.0, 0.0, 1.0, 1.0, 0.0, 1.0], [0, 0, 1, 1, 2, 2])
    assert est.metrics()["groups/all_fail"] == pytest.approx(1 / 3)
    assert est.metrics()["groups/all_pass"] == pytest.approx(1 / 3)
    assert est.metrics()["groups/num"] == 3.0
    # binary batch that is all 0: every group fails, none pass
    est([0.0, 0.0, 0.0, 0.0], [0, 0, 1, 1])
    assert (est.metrics()["groups/all_fail"], est.metrics()["groups/all_pass"]) == (1.0, 0.0)
    # shaped (+1/-1): floor -1, ceiling +1 are the batch min and max
    est([-1.0, -1.0, 1.0, 1.0, -1.0, 0.5], [0, 0, 1, 1, 2, 2])
    assert est.metrics()["groups/all_fail"] == pytest.approx(1 / 3)
    assert est.metrics()["groups/all_pass"] == pytest.approx(1 / 3)
    # shaped, one value everywhere: no telling which end it is, so neither
    est([0.5, 0.5, 0.5, 0.5], [0, 0, 1, 1])
    assert (est.metrics()["groups/all_fail"], est.metrics()["groups/all_pass"]) == (0.0, 0.0)
    assert est.metrics()["adv/zero_frac"] == 1.0 and est.metrics()["adv/abs_mean"] == 0.0


# ------------------------------------------------------------------------------------------------
# loop references
# ------------------------------------------------------------------------------------------------


def _groups(rewards: list[float], index: list) -> dict:
    members = defaultdict(list)
    for i, key in enumerate(index):
        members[key].append(i)
    return members


def _mean(xs):
    return sum(xs) / len(xs)


def _svar(xs):
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def _loop_grpo(rewards, index, norm_by_std=True, eps=1e-6):
    out = [0.0] * len(rewards)
    for members in _groups(rewards, index).values():
        rs = [rewards[i] for i in members]
        for i in members:
            a = rewards[i] - _mean(rs)
            out[i] = a / (math.sqrt(_svar(rs)) + eps) if norm_by_std else a
    return out


def _loop_rloo(rewards, index):
    out = [0.0] * len(rewards)
    for members in _groups(rewards, index).values():
        for i in members:
            others = [rewards[j] for j in members if j != i]
            out[i] = rewards[i] - _mean(others) if others else 0.0
    return out


def _loop_rpp(rewards, index):
    raw = _loop_grpo(rewards, index, norm_by_std=False)
    m = _mean(raw)
    return [(a - m) / math.sqrt(_svar(raw) + 1e-8) for a in raw]


def _loop_jspo(rewards, index, eps=1e-6):
    groups = _groups(rewards, index)
    out = [0.0] * len(rewards)
    for p, members in groups.items():
        others = [q for q in groups if q != p]
        if not others:
            lam, outside = 0.0, 0.0
        else:
            v2 = _mean([_svar([rewards[i] for i in groups[q]]) / len(groups[q]) for q in others])
            means = [_mean([rewards[i] for i in groups[q]]) for q in others]
            s2 = _mean([(m - _mean(means)) ** 2 for m in means])
            lam = v2 / (v2 + s2 + eps)
            outside = _mean([rewards[i] for q in others for i in groups[q]])
        for i in members:
            rest = [rewards[j] for j in members if j != i]
            if rest:
                baseline = (1 - lam) * _mean(rest) + lam * outside
            else:
                baseline = outside if others else rewards[i]
            out[i] = rewards[i] - baseline
    return out


class _LoopEBPO:
    """Reference EBPO over Python lists: every history item kept with the step it arrived at; moments are
    recomputed from scratch with weights 0.5 ** (age / half_life)."""

    DEFAULTS = {
        "prior_scope": "global",
        "cluster_min_groups": 16,
        "prior_memory": "all",
        "tau2": "raw",
        "tau2_floor": 1e-4,
        "sigma2": "total",
        "normalize": "batch",
        "eps": 1e-6,
    }

    def __init__(self, **options):
        self.o = {**self.DEFAULTS, **options}
        self.t = 0
        # per prior key (None = global): lists of (step, value)
        self.hist = defaultdict(lambda: {"r": [], "means": [], "vars": [], "inv": []})

    def _w(self, step):
        hl = self.o["prior_memory"]
        return 1.0 if hl == "all" else 0.5 ** ((self.t - step) / hl)

    def _wmean(self, items):
        ws = [self._w(s) for s, _ in items]
        return sum(w * x for w, (_, x) in zip(ws, items, strict=True)) / sum(ws) if items else 0.0

    def _wvar(self, items):
        if not items:
            return 0.0
        ws = [self._w(s) for s, _ in items]
        total, m = sum(ws), self._wmean(items)
        denom = total - sum(w * w for w in ws) / total
        if denom <= 1e-12 * total:
            return 0.0
        return sum(w * (x - m) ** 2 for w, (_, x) in zip(ws, items, strict=True)) / denom

    def _add(self, key, rewards, groups):
        h = self.hist[key]
        for members in groups:
            rs = [rewards[i] for i in members]
            h["r"] += [(self.t, r) for r in rs]
            h["means"].append((self.t, _mean(rs)))
            h["inv"].append((self.t, 1.0 / len(rs)))
            if len(rs) > 1:
                h["vars"].append((self.t, _svar(rs)))

    def _read(self, key):
        h = self.hist[key]
        mu = self._wmean(h["r"])
        sigma2 = self._wvar(h["r"]) if self.o["sigma2"] == "total" else self._wmean(h["vars"])
        tau2 = self._wvar(h["means"])
        if self.o["tau2"] == "latent":
            tau2 = max(tau2 - sigma2 * self._wmean(h["inv"]), self.o["tau2_floor"])
        return mu, sigma2, tau2

    def observe(self, rewards, index, cluster=None):
        groups = list(_groups(rewards, index).values())
        self._add(None, rewards, groups)
        if self.o["prior_scope"] == "cluster":
            for members in groups:
                self._add(("c", cluster[members[0]]), rewards, [members])

    def __call__(self, rewards, index, cluster=None):
        self.observe(rewards, index, cluster)
        raw = [0.0] * len(rewards)
        scale = [1.0] * len(rewards)
        for members in _groups(rewards, index).values():
            key = None
            if self.o["prior_scope"] == "cluster":
                ckey = ("c", cluster[members[0]])
                weight = sum(self._w(s) for s, _ in self.hist[ckey]["means"])
                key = ckey if weight >= self.o["cluster_min_groups"] else None
            mu, sigma2, tau2 = self._read(key)
            rs = [rewards[i] for i in members]
            G = len(rs)
            S = (sigma2 / G) / (sigma2 / G + tau2) if sigma2 / G + tau2 > 0 else 0.0
            V = (1 - S) * _mean(rs) + S * mu
            for i in members:
                raw[i] = rewards[i] - V
                if self.o["normalize"] == "prior":
                    scale[i] = math.sqrt(sigma2) + self.o["eps"]
                else:
                    scale[i] = math.sqrt((1 - S) * _svar(rs) + S * sigma2) + self.o["eps"]
        self.t += 1
        if self.o["normalize"] == "none":
            return raw
        if self.o["normalize"] in ("group", "prior"):
            return [a / s for a, s in zip(raw, scale, strict=True)]
        m = _mean(raw)
        std = math.sqrt(_svar(raw))
        return [(a - m) / (std + self.o["eps"]) for a in raw]


def _random_batch(rng: random.Random, binary: bool):
    """Groups of unequal size (1..7), ids shuffled so groups are not contiguous; ids as ints, strings,
    tuples or a numpy object array; cluster keys constant within a group."""
    num_groups = rng.randint(1, 9)
    kind = rng.choice(["int", "str", "object", "tuple"])
    rewards, index, cluster = [], [], []
    for g in range(num_groups):
        size = rng.randint(1, 7)
        p = rng.random()
        key = {"int": 1000 - 7 * g, "str": f"uid-{g}", "object": f"o{g}" if g % 2 else g, "tuple": (g, "t")}[
            kind
        ]
        topic = rng.choice(["alg", "geo", "calc"])
        for _ in range(size):
            rewards.append(float(rng.random() < p) if binary else rng.gauss(p, 1.0))
            index.append(key)
            cluster.append(topic)
    order = list(range(len(rewards)))
    rng.shuffle(order)
    rewards = [rewards[i] for i in order]
    index = [index[i] for i in order]
    cluster = [cluster[i] for i in order]
    if kind == "object":
        arr = np.empty(len(index), dtype=object)
        arr[:] = index
        passed = arr
    elif kind == "int":
        passed = np.array(index)
    else:
        passed = index
    return rewards, index, passed, cluster


STATELESS = {
    "grpo": _loop_grpo,
    "dr_grpo": lambda r, i: _loop_grpo(r, i, norm_by_std=False),
    "rloo": _loop_rloo,
    "reinforce_pp_baseline": _loop_rpp,
    "jspo": _loop_jspo,
}


@pytest.mark.parametrize("name", sorted(STATELESS))
@pytest.mark.parametrize("seed", range(6))
def test_stateless_estimators_match_loop_reference(name, seed):
    rng = random.Random(seed)
    est = ebpo.get_estimator(name)
    for _ in range(3):
        rewards, index, passed, _ = _random_batch(rng, binary=rng.random() < 0.5)
        adv = est(torch.tensor(rewards), passed)
        torch.testing.assert_close(
            adv.double(),
            torch.tensor(STATELESS[name](rewards, index), dtype=torch.float64),
            atol=2e-5,
            rtol=1e-5,
        )
        assert torch.isfinite(adv).all()


@pytest.mark.parametrize("seed", range(8))
def test_group_metrics_match_loop_reference(seed):
    """groups/all_fail and groups/all_pass (binary rewards: read off the group means; shaped: group min and
    max against the batch's), adv/zero_frac and adv/abs_mean, against a loop over the groups."""
    rng = random.Random(seed)
    for name in ("grpo", "ebpo", "rloo"):
        est = ebpo.get_estimator(name)
        for _ in range(3):
            rewards, index, passed, _ = _random_batch(rng, binary=rng.random() < 0.5)
            if rng.random() < 0.25:  # whole groups at the floor or the ceiling
                rewards = [float(r > 0.5) for r in rewards]
            adv = est(torch.tensor(rewards), passed).tolist()
            groups = _groups(rewards, index).values()
            binary = all(r in (0.0, 1.0) for r in rewards)
            floor, ceiling = (0.0, 1.0) if binary else (min(rewards), max(rewards))
            informative = floor < ceiling
            fail = sum(informative and all(rewards[i] == floor for i in g) for g in groups) / len(groups)
            passes = sum(informative and all(rewards[i] == ceiling for i in g) for g in groups) / len(groups)
            metrics = est.metrics()
            assert (metrics["groups/all_fail"], metrics["groups/all_pass"]) == (fail, passes)
            assert metrics["groups/num"] == len(groups)
            assert metrics["adv/zero_frac"] == sum(abs(a) < 1e-8 for a in adv) / len(adv)
            assert metrics["adv/abs_mean"] == pytest.approx(_mean([abs(a) for a in adv]), rel=1e-6)


def test_ebpo_keeps_current_only_the_accumulators_its_options_read():
    """W_within is read only with sigma2=pooled and W_inv_size only with tau2=latent: other options leave
    them as they were (in the state all the same), and what they read is the same either way."""
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
    # a checkpoint that holds them (written by either) loads into either and trains alike
    again = ebpo.get_estimator("ebpo")
    again.load_state_dict(both.state_dict() | {"options": paper.state_dict()["options"]})
    paper(rewards, index)
    again(rewards, index)
    assert paper.prior_stats() == again.prior_stats()


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
    est, ref = ebpo.get_estimator("ebpo", **options), _LoopEBPO(**options)
    for step in range(4):
        rewards, index, passed, cluster = _random_batch(rng, binary=seed % 2 == 0)
        if step == 1:  # DAPO-style dropped groups: observe() feeds the prior without advantages
            est.observe(rewards, passed, cluster=cluster)
            ref.observe(rewards, index, cluster)
            rewards, index, passed, cluster = _random_batch(rng, binary=seed % 2 == 0)
        adv = est(rewards, passed, cluster=np.array(cluster, dtype=object))
        expected = torch.tensor(ref(rewards, index, cluster), dtype=torch.float64)
        torch.testing.assert_close(adv.double(), expected, atol=5e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# the paper's theorems as properties
# ------------------------------------------------------------------------------------------------


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


def test_ebpo_with_zero_shrinkage_and_no_normalisation_is_dr_grpo():
    rng = random.Random(7)
    for _ in range(5):
        rewards, _, passed, _ = _random_batch(rng, binary=True)
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


# ------------------------------------------------------------------------------------------------
# state and cluster scope
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [{}, {"prior_scope": "cluster", "cluster_min_groups": 2, "prior_memory": 4.0, "tau2": "latent"}],
    ids=["paper", "cluster-ew-latent"],
)
def test_state_dict_round_trip_continues_identically(options):
    rng = random.Random(11)
    batches = [_random_batch(rng, binary=True) for _ in range(6)]
    est = ebpo.get_estimator("ebpo", **options)
    for rewards, _, passed, cluster in batches[:3]:
        est(rewards, passed, cluster=cluster)
    buffer = io.BytesIO()
    torch.save(est.state_dict(), buffer)
    buffer.seek(0)
    resumed = ebpo.get_estimator("ebpo", **options)
    resumed.load_state_dict(torch.load(buffer))  # weights_only=True: plain types only
    for rewards, _, passed, cluster in batches[3:]:
        a, b = est(rewards, passed, cluster=cluster), resumed(rewards, passed, cluster=cluster)
        assert torch.equal(a, b)
        assert est.metrics() == resumed.metrics()
    with pytest.raises(ValueError, match="prior_memory"):
        ebpo.get_estimator("ebpo", prior_memory=9.0).load_state_dict(est.state_dict())


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


def test_observe_feeds_prior_like_call_and_stateless_observe_is_a_noop():
    a, b = ebpo.get_estimator("ebpo"), ebpo.get_estimator("ebpo")
    a.observe(REWARDS, INDEX)
    b(REWARDS, INDEX)
    assert a.prior_stats() == b.prior_stats()
    grpo = ebpo.get_estimator("grpo")
    grpo.observe(REWARDS, INDEX)
    assert grpo.state_dict() == {}
    with pytest.raises(ValueError, match="position 1"):
        grpo.observe([0.0, float("nan")], [0, 0])


# ------------------------------------------------------------------------------------------------
# bad and degenerate input
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "jspo", "ebpo"])
def test_bad_and_degenerate_input(name):
    est = ebpo.get_estimator(name)
    with pytest.raises(ValueError, match="position 3"):
        est(torch.tensor([0.0, 1.0, 0.0, float("nan"), float("inf")]), [0, 0, 1, 1, 1])
    with pytest.raises(ValueError, match="position 0"):
        est([float("-inf")], [0])
    with pytest.raises(ValueError, match=r"index .*2.*rewards .*3"):
        est([0.0, 1.0, 1.0], [0, 1])
    with pytest.raises(ValueError, match=r"^rewards .*\(2, 2\)$"):
        est(torch.zeros(2, 2), [0, 1])
    with pytest.raises(TypeError, match="position 1"):
        est([0.0, 1.0], [0, [1]])
    state = copy.deepcopy(est.state_dict())
    empty = est(torch.zeros(0), [])
    assert empty.shape == (0,) and empty.dtype == torch.float32
    assert est.state_dict() == state  # an empty batch leaves the state alone
    cases = [
        ([0.3, 0.9, 0.5], ["x", "y", "z"]),  # groups of one
        ([1.0, 1.0, 0.0, 0.0], [0, 0, 1, 1]),  # all-equal groups
        ([0.5] * 6, [0, 0, 1, 1, 2, 2]),  # zero variance over the whole batch
        ([1.0], [0]),  # a single sample
    ]
    for rewards, index in cases:
        adv = est(rewards, index)
        assert adv.shape == (len(rewards),) and torch.isfinite(adv).all()
        assert all(math.isfinite(v) for v in est.metrics().values())
    fresh = ebpo.get_estimator(name)
    assert (fresh([0.5] * 6, [0, 0, 1, 1, 2, 2]) == 0).all()  # no signal anywhere: zeros
    assert fresh.metrics()["adv/zero_frac"] == 1.0


def test_group_ids_accepts_every_id_kind():
    expected_groups = [[0, 2], [1, 3], [4]]

    def partition(inverse):
        blocks = defaultdict(list)
        for i, g in enumerate(inverse.tolist()):
            blocks[g].append(i)
        return sorted(blocks.values())

    obj = np.empty(5, dtype=object)
    obj[:] = ["u1", 7, "u1", 7, ("t", 1)]
    for index in (
        torch.tensor([5, 9, 5, 9, -1]),
        np.array([5, 9, 5, 9, -1]),
        np.array(["b", "a", "b", "a", "c"]),
        obj,
        ["b", "a", "b", "a", "c"],
        [(1, 2), (3,), (1, 2), (3,), None],
    ):
        inverse, num = group_ids(index)
        assert inverse.dtype == torch.long and num == 3
        assert partition(inverse) == expected_groups


def test_output_follows_input_device_and_dtype():
    adv = ebpo.get_estimator("ebpo")(REWARDS.to(torch.float64), list(INDEX))
    assert adv.dtype == torch.float32 and adv.device == REWARDS.device
    # GroupStats is a NamedTuple of (M,) tensors
    stats = group_moments(REWARDS.double(), group_ids(INDEX)[0], 3)
    assert isinstance(stats, GroupStats)
    torch.testing.assert_close(stats.var_M, torch.tensor([1 / 3, 0.0, 0.25], dtype=torch.float64))


# ------------------------------------------------------------------------------------------------
# huge finite rewards: never emit or store a non-finite value
# ------------------------------------------------------------------------------------------------

ALL_ESTIMATORS = [
    ("grpo", {}),
    ("dr_grpo", {}),
    ("rloo", {}),
    ("reinforce_pp_baseline", {}),
    ("jspo", {}),
    ("ebpo", {}),
    ("ebpo", {"normalize": "none"}),
    ("ebpo", {"normalize": "group"}),
    ("ebpo", {"normalize": "prior"}),
    ("ebpo", {"prior_scope": "cluster", "cluster_min_groups": 1, "prior_memory": 3.0}),
]


@pytest.mark.parametrize("name,options", ALL_ESTIMATORS, ids=lambda x: str(x))
@pytest.mark.parametrize("huge", [1e39, -1e39, 1e155, 1e300])
def test_huge_rewards_are_rejected_naming_the_sample_and_leave_state_alone(name, options, huge):
    # Unchecked, 1e39 overflows the float32 output to +-inf (dr_grpo, rloo, jspo, ebpo none) and 1e155
    # overflows the float64 variance (NaN everywhere, and EBPO's prior would stay NaN for good).
    est = ebpo.get_estimator(name, **options)
    history = ([1.0, 0.0, 0.0, 0.0, 1.0, 1.0], [0, 0, 0, 1, 1, 1], ["a"] * 3 + ["b"] * 3)
    est(history[0], history[1], cluster=history[2])
    before = copy.deepcopy(est.state_dict())
    for rewards in (
        torch.tensor([0.0, 1.0, huge, 0.0], dtype=torch.float64),
        np.array([0.0, 1.0, huge, 0.0]),
        [0.0, 1.0, huge, 0.0],  # a Python list must not go through float32 ("inf" in the message)
    ):
        with pytest.raises(
            ValueError,
            match=re.escape(f"position 2 is {huge:g}"),
        ):
            est(rewards, [0, 0, 1, 1], cluster=["a", "a", "b", "b"])
        with pytest.raises(ValueError, match="position 2"):
            est.observe(rewards, [0, 0, 1, 1], cluster=["a", "a", "b", "b"])
        assert est.state_dict() == before  # a rejected batch does not touch the prior
    # the estimator carries on as if the bad batches never came
    fresh = ebpo.get_estimator(name, **options)
    fresh(history[0], history[1], cluster=history[2])
    batch = ([0.0, 1.0, 1.0, 1.0], [0, 0, 1, 1], ["a", "a", "b", "b"])
    adv, expected = est(*batch[:2], cluster=batch[2]), fresh(*batch[:2], cluster=batch[2])
    assert torch.isfinite(adv).all() and torch.equal(adv, expected)


@pytest.mark.parametrize("name,options", ALL_ESTIMATORS, ids=lambda x: str(x))
def test_largest_allowed_rewards_give_finite_advantages_and_state(name, options):
    est = ebpo.get_estimator(name, **options)
    for rewards in ([1e30, -1e30, 0.0, 1e30], [-1e30, -1e30, 1e30, 1e30], [1e30, 0.0, 0.0, 0.0]):
        adv = est(rewards, [0, 0, 1, 1], cluster=["a", "a", "b", "b"])
        assert torch.isfinite(adv).all()
        assert all(math.isfinite(v) for v in est.metrics().values())
    flat = [v for v in _floats(est.state_dict())]
    assert all(math.isfinite(v) for v in flat)


def _floats(tree):
    """Every float or int leaf of a nested state dict."""
    if isinstance(tree, dict):
        for value in tree.values():
            yield from _floats(value)
    elif isinstance(tree, list | tuple):
        for value in tree:
            yield from _floats(value)
    elif isinstance(tree, int | float) and not isinstance(tree, bool):
        yield float(tree)


def test_python_list_rewards_keep_float64_precision():
    # float32 has a spacing of 8 at 1e8, so 100000001 became 1e8 on the way in and both advantages were 0.
    # In float64: group mean 100000000.5, advantages +-0.5 (Dr. GRPO: r - mean).
    _close(ebpo.get_estimator("dr_grpo")([100000001.0, 100000000.0], [0, 0]), [0.5, -0.5])
    est = ebpo.get_estimator("ebpo", normalize="none")
    est([100000001.0, 100000000.0], [0, 0])
    assert est.prior_stats()["mu_glob"] == 100000000.5


@pytest.mark.parametrize("name", ["grpo", "jspo", "ebpo"])
def test_eps_must_be_positive(name):
    # eps = 0 turned an all-equal group into 0 / 0 = NaN (GRPO's std, JSPO's lambda, EBPO's batch std).
    with pytest.raises(ValueError, match=rf"^{name}: eps .*0\.0"):
        ebpo.get_estimator(name, eps=0.0)


def test_output_that_float32_cannot_hold_is_rejected_and_state_restored():
    # normalize="prior" divides by sqrt(sigma2) + eps. Rewards 0.1 everywhere: sigma2 = 0 exactly, but the
    # group mean 0.3000..04 / 3 = 0.10000000000000002 leaves a = -1.4e-17; with eps = 1e-300 that is
    # -1.4e283, far beyond float32. The call must raise, naming the sample, and keep the prior unchanged.
    est = ebpo.get_estimator("ebpo", normalize="prior", eps=1e-300)
    before = copy.deepcopy(est.state_dict())
    with pytest.raises(ValueError, match=r"sample 0 is -1\.\d+e\+283"):
        est([0.1, 0.1, 0.1], [0, 0, 0])
    assert est.state_dict() == before


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
    from ebpo.trainer.config import load_config

    for spelling in ("ebpo", "estimator_options"):
        cfg = load_config(None, [f"algorithm.{spelling}.normalize=prior"])
        est = ebpo.get_estimator(cfg.algorithm.estimator, **cfg.algorithm.estimator_kwargs())
        assert est.normalize == "prior"
        with pytest.raises(ConfigError, match=r"algorithm\.ebpo\.normalize 'priors'.*\bbatch, group\b"):
            load_config(None, [f"algorithm.{spelling}.normalize=priors"])
