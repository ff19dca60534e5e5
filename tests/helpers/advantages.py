"""What the advantage tests share: one hand-derived batch, slow loop references of every estimator over
Python lists, and random batches with every kind of group id."""

from __future__ import annotations

import math
import random
from collections import defaultdict

import numpy as np
import torch

# One batch used for the hand-derived values: three groups of four.
#   a = [1, 0, 0, 1]: mean 0.5,  s^2 = 4 * 0.25 / 3 = 1/3
#   b = [0, 0, 0, 0]: mean 0,    s^2 = 0            (an all-fail group)
#   c = [1, 1, 1, 0]: mean 0.75, s^2 = (3 * 0.0625 + 0.5625) / 3 = 0.25
REWARDS = torch.tensor([1.0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 0])
INDEX = np.array(["a"] * 4 + ["b"] * 4 + ["c"] * 4, dtype=object)


def close(actual: torch.Tensor, expected: list[float], atol: float = 1e-5) -> None:
    assert actual.dtype == torch.float32
    torch.testing.assert_close(
        actual.double(), torch.tensor(expected, dtype=torch.float64), atol=atol, rtol=0
    )


def groups_of(rewards: list[float], index: list) -> dict:
    members = defaultdict(list)
    for i, key in enumerate(index):
        members[key].append(i)
    return members


def mean(xs):
    return sum(xs) / len(xs)


def svar(xs):
    if len(xs) < 2:
        return 0.0
    m = mean(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def loop_grpo(rewards, index, norm_by_std=True, eps=1e-6):
    out = [0.0] * len(rewards)
    for members in groups_of(rewards, index).values():
        rs = [rewards[i] for i in members]
        for i in members:
            a = rewards[i] - mean(rs)
            out[i] = a / (math.sqrt(svar(rs)) + eps) if norm_by_std else a
    return out


def loop_rloo(rewards, index):
    out = [0.0] * len(rewards)
    for members in groups_of(rewards, index).values():
        for i in members:
            others = [rewards[j] for j in members if j != i]
            out[i] = rewards[i] - mean(others) if others else 0.0
    return out


def loop_rpp(rewards, index):
    raw = loop_grpo(rewards, index, norm_by_std=False)
    m = mean(raw)
    return [(a - m) / math.sqrt(svar(raw) + 1e-8) for a in raw]


def loop_jspo(rewards, index, eps=1e-6):
    groups = groups_of(rewards, index)
    out = [0.0] * len(rewards)
    for p, members in groups.items():
        others = [q for q in groups if q != p]
        if not others:
            lam, outside = 0.0, 0.0
        else:
            v2 = mean([svar([rewards[i] for i in groups[q]]) / len(groups[q]) for q in others])
            means = [mean([rewards[i] for i in groups[q]]) for q in others]
            s2 = mean([(m - mean(means)) ** 2 for m in means])
            lam = v2 / (v2 + s2 + eps)
            outside = mean([rewards[i] for q in others for i in groups[q]])
        for i in members:
            rest = [rewards[j] for j in members if j != i]
            if rest:
                baseline = (1 - lam) * mean(rest) + lam * outside
            else:
                baseline = outside if others else rewards[i]
            out[i] = rewards[i] - baseline
    return out


class LoopEBPO:
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
            h["means"].append((self.t, mean(rs)))
            h["inv"].append((self.t, 1.0 / len(rs)))
            if len(rs) > 1:
                h["vars"].append((self.t, svar(rs)))

    def _read(self, key):
        h = self.hist[key]
        mu = self._wmean(h["r"])
        sigma2 = self._wvar(h["r"]) if self.o["sigma2"] == "total" else self._wmean(h["vars"])
        tau2 = self._wvar(h["means"])
        if self.o["tau2"] == "latent":  # the within-group variance is subtracted, whichever sigma2
            tau2 = max(tau2 - self._wmean(h["vars"]) * self._wmean(h["inv"]), self.o["tau2_floor"])
        return mu, sigma2, tau2

    def observe(self, rewards, index, cluster=None):
        groups = list(groups_of(rewards, index).values())
        self._add(None, rewards, groups)
        if self.o["prior_scope"] == "cluster":
            for members in groups:
                self._add(("c", cluster[members[0]]), rewards, [members])

    def __call__(self, rewards, index, cluster=None):
        self.observe(rewards, index, cluster)
        raw = [0.0] * len(rewards)
        scale = [1.0] * len(rewards)
        for members in groups_of(rewards, index).values():
            key = None
            if self.o["prior_scope"] == "cluster":
                ckey = ("c", cluster[members[0]])
                weight = sum(self._w(s) for s, _ in self.hist[ckey]["means"])
                key = ckey if weight >= self.o["cluster_min_groups"] else None
            mu, sigma2, tau2 = self._read(key)
            rs = [rewards[i] for i in members]
            G = len(rs)
            S = (sigma2 / G) / (sigma2 / G + tau2) if sigma2 / G + tau2 > 0 else 0.0
            V = (1 - S) * mean(rs) + S * mu
            for i in members:
                raw[i] = rewards[i] - V
                if self.o["normalize"] == "prior":
                    scale[i] = math.sqrt(sigma2) + self.o["eps"]
                else:
                    scale[i] = math.sqrt((1 - S) * svar(rs) + S * sigma2) + self.o["eps"]
        self.t += 1
        if self.o["normalize"] == "none":
            return raw
        if self.o["normalize"] in ("group", "prior"):
            return [a / s for a, s in zip(raw, scale, strict=True)]
        m = mean(raw)
        std = math.sqrt(svar(raw))
        return [(a - m) / (std + self.o["eps"]) for a in raw]


def random_batch(rng: random.Random, binary: bool):
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
