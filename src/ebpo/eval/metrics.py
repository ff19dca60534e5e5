"""Evaluation metrics: avg@n Pass@1, unbiased pass@k, maj@k, and their standard errors (docs/design.md §5).

Conventions (one problem has n sampled responses, in sampling order j = 0..n-1):

- A response is *correct* when its reward is > 0 (so both 1/0 and DAPO's +1/-1 rewards work).
- **Pass@1 (avg@n)**: the fraction of correct responses, averaged over problems. The paper reports it
  with n = 32 ("repeat each evaluation set 32 times with different random seeds and report the average").
- **pass@k** (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1): with c correct
  of n, the unbiased estimate of P(at least one of k responses drawn without replacement is correct) is
  ``1 - C(n-c, k) / C(n, k)``, computed in the stable product form
  ``1 - prod_{i=n-c+1}^{n} (1 - k / i)`` (no large binomials).
- **maj@k**: the extracted final answers are clustered with a pairwise ``equivalent(a, b)`` callable (the
  reward's own verifier), the most frequent cluster wins, and maj@k is 1 when the winning cluster's answer
  is correct. Clustering is greedy in sampling order: each answer joins the first existing cluster whose
  representative (its first member) is equivalent to it, ``equivalent(representative, answer)``, with the
  representative in the *gold* slot because math-verify is not symmetric; otherwise it starts a new cluster.
  A cluster's correctness is its representative's. Responses with no extractable answer do not vote; if
  no response votes, maj@k is 0. **Ties** between clusters of equal count go to the cluster that occurs
  first in sampling order. With n > k responses, ``mode="subsets"`` (default) gives the expected maj@k
  over a uniformly random k-subset of the n responses: exact (all C(n, k) subsets) when C(n, k) is at most
  ``num_subsets``, else an unbiased Monte Carlo estimate from ``num_subsets`` seeded random subsets; the
  clusters are formed once over all n answers. ``mode="first"`` votes over the first k responses only.
- **Standard errors**: across problems, ``std(per-problem value, ddof=1) / sqrt(#problems)``; across
  sample seeds (sample index j plays the role of the seed, as in the paper's 32 repeated runs),
  ``std_j(accuracy of run j over all problems, ddof=1) / sqrt(n)``. 0 with fewer than two values.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import combinations
from typing import Any

import numpy as np

__all__ = [
    "ProblemScores",
    "avg_at_n",
    "cluster_answers",
    "maj_at_k",
    "majority_cluster",
    "pass_at_k",
    "pass_at_k_batch",
    "score_problem",
    "standard_error",
    "summarize",
]

MAJ_MODES = ("subsets", "first")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k = 1 - C(n-c, k) / C(n, k) (Chen et al. 2021), as 1 - prod_{i=n-c+1}^{n} (1 - k/i).

    ``n`` samples of which ``c`` are correct; requires 0 <= c <= n and 1 <= k <= n.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    i_C = np.arange(n - c + 1, n + 1, dtype=np.float64)
    return float(1.0 - np.prod(1.0 - k / i_C))


def pass_at_k_batch(num_samples_P: Sequence[int], num_correct_P: Sequence[int], k: int) -> np.ndarray:
    """:func:`pass_at_k` for P problems at once; returns a float64 array (P,)."""
    n_P = np.asarray(num_samples_P, dtype=np.int64)
    c_P = np.asarray(num_correct_P, dtype=np.int64)
    return np.array([pass_at_k(int(n), int(c), k) for n, c in zip(n_P, c_P)], dtype=np.float64)


def avg_at_n(rewards: Sequence[float]) -> float:
    """Pass@1 of one problem as avg@n: the fraction of its n responses with reward > 0."""
    if len(rewards) == 0:
        raise ValueError("avg@n of a problem with no samples")
    return float(np.mean(np.asarray(rewards, dtype=np.float64) > 0))


def standard_error(values: Sequence[float] | np.ndarray) -> float:
    """Standard error of the mean: std(values, ddof=1) / sqrt(len(values)); 0 with fewer than 2 values."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size < 2:
        return 0.0
    return float(arr.std(ddof=1) / math.sqrt(arr.size))


def cluster_answers(
    answers: Sequence[str | None],
    equivalent: Callable[[str, str], bool] | None = None,
    *,
    equivalent_batch: Callable[[Sequence[str], Sequence[str]], list[bool]] | None = None,
) -> list[int]:
    """Cluster id of each answer (``-1`` for ``None``, no answer), ids numbered in order of first occurrence.

    Greedy in order: an answer joins the first cluster whose representative ``rep`` (first member) satisfies
    ``equivalent(rep, answer)``, else it opens a new cluster. Identical strings are merged without calling
    the verifier. ``equivalent_batch(golds, preds) -> list[bool]`` (e.g. ``MathReward.equivalent_batch``),
    when given, replaces ``equivalent``: one call per new distinct answer against all representatives.
    """
    if equivalent is None and equivalent_batch is None:
        raise ValueError("cluster_answers needs equivalent or equivalent_batch")
    representatives: list[str] = []
    known: dict[str, int] = {}
    ids: list[int] = []
    for answer in answers:
        if answer is None:
            ids.append(-1)
            continue
        if answer not in known:
            if equivalent_batch is not None and representatives:
                same = equivalent_batch(representatives, [answer] * len(representatives))
                match = next((cid for cid, ok in enumerate(same) if ok), None)
            elif equivalent is not None:
                match = next(
                    (cid for cid, rep in enumerate(representatives) if equivalent(rep, answer)), None
                )
            else:
                match = None
            if match is None:
                match = len(representatives)
                representatives.append(answer)
            known[answer] = match
        ids.append(known[answer])
    return ids


def majority_cluster(cluster_ids: Sequence[int]) -> int | None:
    """The most frequent cluster id among ``cluster_ids`` (``-1`` entries do not vote); ties go to the
    cluster that occurs first in the sequence; ``None`` when nothing votes."""
    counts: dict[int, int] = {}
    for cid in cluster_ids:
        if cid >= 0:
            counts[cid] = counts.get(cid, 0) + 1  # dict keeps first-occurrence order
    if not counts:
        return None
    return max(counts, key=lambda cid: counts[cid])  # max returns the first of equal maxima


def _subset_indices(n: int, k: int, num_subsets: int, seed: int) -> np.ndarray:
    """(S, k) sorted sample indices: all C(n, k) subsets if there are at most ``num_subsets``, else
    ``num_subsets`` uniformly random ones from ``np.random.default_rng(seed)``."""
    if math.comb(n, k) <= num_subsets:
        return np.array(list(combinations(range(n), k)), dtype=np.int64).reshape(-1, k)
    rng = np.random.default_rng(seed)
    keys_SN = rng.random((num_subsets, n))
    return np.sort(np.argsort(keys_SN, axis=1)[:, :k], axis=1)


def maj_at_k(
    cluster_ids: Sequence[int],
    cluster_correct: Sequence[bool],
    k: int,
    *,
    mode: str = "subsets",
    num_subsets: int = 1000,
    seed: int = 0,
) -> float:
    """maj@k of one problem from its n answers' cluster ids (see the module docstring).

    Args:
        cluster_ids: n cluster ids in sampling order (``-1``: no answer), from :func:`cluster_answers`.
        cluster_correct: correctness of each cluster (indexed by cluster id).
        k: voters per vote, 1 <= k <= n.
        mode: ``"subsets"`` (expected maj@k over random k-subsets; exact when C(n, k) <= num_subsets) or
            ``"first"`` (vote of the first k responses).
    """
    n = len(cluster_ids)
    if not 1 <= k <= n:
        raise ValueError(f"maj@k needs 1 <= k <= n, got k={k}, n={n}")
    if mode not in MAJ_MODES:
        raise ValueError(f"unknown maj@k mode {mode!r}; valid: {', '.join(MAJ_MODES)}")
    ids_N = np.asarray(cluster_ids, dtype=np.int64)
    correct_C = np.append(np.asarray(cluster_correct, dtype=np.float64), 0.0)  # last slot: "no vote"
    num_clusters = len(correct_C) - 1
    if ids_N.size and ids_N.max() >= num_clusters:
        raise ValueError(
            f"cluster id {int(ids_N.max())} has no entry in cluster_correct (len {num_clusters})"
        )
    if num_clusters == 0:
        return 0.0
    if mode == "first":
        subsets_SK = np.arange(k, dtype=np.int64)[None, :]
    else:
        subsets_SK = _subset_indices(n, k, num_subsets, seed)
    num_sets = subsets_SK.shape[0]
    members_SK = ids_N[subsets_SK]
    votes_SKC = members_SK[:, :, None] == np.arange(num_clusters)[None, None, :]
    count_SC = votes_SKC.sum(axis=1)
    # first occurrence (sample index) of each cluster within the subset; n where absent
    first_SC = np.where(votes_SKC, subsets_SK[:, :, None], n).min(axis=1)
    # the winner maximises (count, -first occurrence); absent clusters score 0, present ones > n
    score_SC = count_SC * (n + 1) + (n - first_SC)
    winner_S = np.where(score_SC.max(axis=1) > 0, score_SC.argmax(axis=1), num_clusters)
    return float(correct_C[winner_S].sum() / num_sets)


@dataclass
class ProblemScores:
    """Everything the metrics need about one problem's n responses (one JSONL line of the eval cache).

    Attributes:
        id: the record id.
        rewards: n rewards in sampling order.
        answers: n extracted final answers (``None``: nothing extractable).
        clusters: n cluster ids from :func:`cluster_answers` (``-1`` for ``None``).
        cluster_correct: correctness of each cluster's representative answer.
        lengths: optional n response lengths in tokens.
        truncated: optional n flags, True where the response hit the token limit.
        texts: optional n response texts (kept only when asked for).
    """

    id: str
    rewards: list[float]
    answers: list[str | None]
    clusters: list[int]
    cluster_correct: list[bool]
    lengths: list[int] | None = None
    truncated: list[bool] | None = None
    texts: list[str] | None = field(default=None, repr=False)

    @property
    def num_samples(self) -> int:
        return len(self.rewards)

    @property
    def num_correct(self) -> int:
        return int(sum(r > 0 for r in self.rewards))

    def to_dict(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if value is not None}

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> ProblemScores:
        return cls(**row)


def score_problem(
    problem_id: str,
    rewards: Sequence[float],
    answers: Sequence[str | None],
    equivalent: Callable[[str, str], bool] | None = None,
    *,
    equivalent_batch: Callable[[Sequence[str], Sequence[str]], list[bool]] | None = None,
    **extra: Any,
) -> ProblemScores:
    """Cluster one problem's answers and attach each cluster's correctness (its representative's reward > 0).

    ``equivalent`` / ``equivalent_batch``: as in :func:`cluster_answers`. ``extra`` goes to
    :class:`ProblemScores` (``lengths``, ``truncated``, ``texts``).
    """
    if len(rewards) != len(answers):
        raise ValueError(f"problem {problem_id}: {len(rewards)} rewards but {len(answers)} answers")
    clusters = cluster_answers(answers, equivalent, equivalent_batch=equivalent_batch)
    cluster_correct: list[bool] = []
    for cid, reward in zip(clusters, rewards):
        if cid == len(cluster_correct):  # first member of a new cluster
            cluster_correct.append(bool(reward > 0))
    return ProblemScores(
        id=str(problem_id),
        rewards=[float(r) for r in rewards],
        answers=list(answers),
        clusters=clusters,
        cluster_correct=cluster_correct,
        **extra,
    )


def summarize(
    problems: Sequence[ProblemScores],
    *,
    ks: Sequence[int] = (1,),
    maj_ks: Sequence[int] = (),
    maj_mode: str = "subsets",
    num_subsets: int = 1000,
    seed: int = 0,
) -> dict[str, float]:
    """Benchmark-level metrics over problems (fractions in [0, 1]).

    Keys: ``pass@1`` (avg@n averaged over problems), ``pass@1/se_problems``, ``pass@1/se_seeds`` (only
    when every problem has the same n), ``pass@{k}`` and ``pass@{k}/se_problems`` for each k in ``ks``,
    ``maj@{k}`` and ``maj@{k}/se_problems`` for each k in ``maj_ks`` (a k larger than the smallest n is
    skipped, with a ``UserWarning`` naming the skipped metrics), ``reward/mean``, ``response_length/mean``
    and ``response/clip_ratio`` (when lengths are known), ``num_problems``, ``num_samples`` (smallest n).
    """
    if not problems:
        raise ValueError("summarize: no problems")
    n_min = min(p.num_samples for p in problems)
    if n_min == 0:
        empty = next(p.id for p in problems if p.num_samples == 0)
        raise ValueError(f"problem {empty} has no samples")
    pass1_P = np.array([avg_at_n(p.rewards) for p in problems])
    out: dict[str, float] = {
        "pass@1": float(pass1_P.mean()),
        "pass@1/se_problems": standard_error(pass1_P),
    }
    if all(p.num_samples == n_min for p in problems):
        correct_PN = np.array([[r > 0 for r in p.rewards] for p in problems], dtype=np.float64)
        out["pass@1/se_seeds"] = standard_error(correct_PN.mean(axis=0))  # one accuracy per sample seed
    skipped = [f"pass@{k}" for k in sorted(set(ks)) if k > n_min]
    skipped += [f"maj@{k}" for k in sorted(set(maj_ks)) if k > n_min]
    if skipped:
        largest = max(int(name.split("@")[1]) for name in skipped)
        warnings.warn(
            f"n = {n_min} samples per problem is below k: {', '.join(skipped)} not reported; "
            f"sample n >= {largest} to get them",
            stacklevel=2,
        )
    n_P = [p.num_samples for p in problems]
    c_P = [p.num_correct for p in problems]
    for k in sorted(set(ks)):
        if k == 1 or k > n_min:
            continue
        pass_k_P = pass_at_k_batch(n_P, c_P, k)
        out[f"pass@{k}"] = float(pass_k_P.mean())
        out[f"pass@{k}/se_problems"] = standard_error(pass_k_P)
    for k in sorted(set(maj_ks)):
        if k > n_min:
            continue
        maj_P = np.array(
            [
                maj_at_k(p.clusters, p.cluster_correct, k, mode=maj_mode, num_subsets=num_subsets, seed=seed)
                for p in problems
            ]
        )
        out[f"maj@{k}"] = float(maj_P.mean())
        out[f"maj@{k}/se_problems"] = standard_error(maj_P)
    out["reward/mean"] = float(np.mean([np.mean(p.rewards) for p in problems]))
    lengths_P = [p.lengths for p in problems if p.lengths is not None]
    if len(lengths_P) == len(problems):
        out["response_length/mean"] = float(np.mean([np.mean(lengths) for lengths in lengths_P]))
    truncated_P = [p.truncated for p in problems if p.truncated is not None]
    if len(truncated_P) == len(problems):
        out["response/clip_ratio"] = float(np.mean([np.mean(truncated) for truncated in truncated_P]))
    out["num_problems"] = float(len(problems))
    out["num_samples"] = float(n_min)
    return out
