"""Tests for ebpo.eval.metrics: hand-derived values, brute-force references, ties, standard errors."""

from __future__ import annotations

import math
import random
from itertools import combinations

import numpy as np
import pytest

from ebpo.eval.metrics import (
    ProblemScores,
    avg_at_n,
    cluster_answers,
    maj_at_k,
    majority_cluster,
    pass_at_k,
    pass_at_k_batch,
    score_problem,
    standard_error,
    summarize,
)


def exact_eq(a: str, b: str) -> bool:
    return a == b


def test_pass_at_k_by_hand():
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # k=1 is the fraction correct: 3/8
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    # c=0 -> 0; n-c < k -> 1 (every 3-subset of 4 with 2 correct holds one)
    assert pass_at_k(6, 0, 3) == 0.0
    assert pass_at_k(4, 2, 3) == 1.0
    # large n stays finite and matches the binomial form computed with Python integers
    exact = 1 - math.comb(1000 - 7, 50) / math.comb(1000, 50)
    assert pass_at_k(1000, 7, 50) == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_pass_at_k_equals_subset_enumeration(seed):
    """pass@k = the fraction of all k-subsets of the n samples that contain a correct one."""
    rng = random.Random(seed)
    for _ in range(10):
        n = rng.randint(1, 9)
        correct = [rng.random() < 0.4 for _ in range(n)]
        for k in range(1, n + 1):
            subsets = list(combinations(range(n), k))
            brute = sum(any(correct[i] for i in s) for s in subsets) / len(subsets)
            assert pass_at_k(n, sum(correct), k) == pytest.approx(brute, abs=1e-12)


def test_pass_at_k_batch_and_errors():
    got = pass_at_k_batch([4, 5, 4], [1, 2, 0], 2)
    assert np.allclose(got, [0.5, 0.7, 0.0])
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(3, 4, 1)


def test_avg_at_n_and_standard_error():
    # rewards > 0 count as correct, so DAPO's -1/+1 works: 2 of 4
    assert avg_at_n([1.0, -1.0, 1.0, -1.0]) == 0.5
    assert avg_at_n([0.0, 0.0, 1.0]) == pytest.approx(1 / 3)
    # values 0, 1: std (ddof=1) = sqrt(0.5); se = sqrt(0.5)/sqrt(2) = 0.5
    assert standard_error([0.0, 1.0]) == pytest.approx(0.5)
    assert standard_error([0.3]) == 0.0
    with pytest.raises(ValueError, match=r"^avg@n\b"):
        avg_at_n([])


def test_cluster_answers_uses_representative_in_gold_slot():
    calls = []

    def equivalent(gold: str, pred: str) -> bool:  # "0.5" is accepted as a prediction of gold "1/2" only
        calls.append((gold, pred))
        return gold == pred or (gold, pred) == ("1/2", "0.5")

    ids = cluster_answers(["1/2", "3", None, "0.5", "3", "0.5"], equivalent)
    assert ids == [0, 1, -1, 0, 1, 0]
    # repeated strings are not re-verified; the second "0.5" and "3" reuse the first decision
    assert ("1/2", "0.5") in calls and all(pred != "1/2" for _, pred in calls)
    assert len(calls) == 2  # "3" vs "1/2", "0.5" vs "1/2" (matched first, so "3" is never tried)


def test_majority_cluster_ties_first_occurrence():
    assert majority_cluster([2, 1, 1, 2]) == 2  # 2 vs 2 votes: cluster 2 occurs first
    assert majority_cluster([0, 1, 1]) == 1
    assert majority_cluster([-1, -1, 3]) == 3
    assert majority_cluster([-1, -1]) is None


def reference_maj(cluster_ids, cluster_correct, subset):
    winner = majority_cluster([cluster_ids[i] for i in sorted(subset)])
    return 0.0 if winner is None else float(cluster_correct[winner])


def test_maj_at_k_by_hand():
    # answers A A B B C, only B correct. maj@5: A and B tie at 2, A first -> 0.
    ids, ok = [0, 0, 1, 1, 2], [False, True, False]
    assert maj_at_k(ids, ok, 5) == 0.0
    # first 3 (A A B): A wins -> 0; first 4 (A A B B): tie, A first -> 0
    assert maj_at_k(ids, ok, 3, mode="first") == 0.0
    # maj@1 = fraction of votes for a correct cluster = 2/5
    assert maj_at_k(ids, ok, 1) == pytest.approx(0.4)
    # maj@2 exact over C(5,2)=10 pairs: B wins in {B,B}=1, {B,C} where B first=2 (2,4),(3,4),
    # {A,B} where B first: none (A indices 0,1 precede B's 2,3) -> 3/10
    assert maj_at_k(ids, ok, 2) == pytest.approx(0.3)
    # no votes at all -> 0
    assert maj_at_k([-1, -1], [], 2) == 0.0
    with pytest.raises(ValueError, match="mode"):
        maj_at_k(ids, ok, 2, mode="bogus")


@pytest.mark.parametrize("seed", range(4))
def test_maj_at_k_matches_loop_reference(seed):
    rng = random.Random(seed)
    for _ in range(15):
        n = rng.randint(1, 8)
        num_clusters = rng.randint(1, 4)
        ids = [rng.randrange(-1, num_clusters) for _ in range(n)]
        ok = [rng.random() < 0.5 for _ in range(num_clusters)]
        for k in range(1, n + 1):
            subsets = list(combinations(range(n), k))
            brute = sum(reference_maj(ids, ok, s) for s in subsets) / len(subsets)
            assert maj_at_k(ids, ok, k, num_subsets=10_000) == pytest.approx(brute, abs=1e-12)
            assert maj_at_k(ids, ok, k, mode="first") == reference_maj(ids, ok, range(k))


def test_maj_at_k_monte_carlo_close_to_exact():
    rng = random.Random(0)
    ids = [rng.randrange(0, 3) for _ in range(20)]
    ok = [True, False, False]
    exact = sum(reference_maj(ids, ok, s) for s in combinations(range(20), 5)) / math.comb(20, 5)
    # 15504 subsets > 4000 -> Monte Carlo; its se <= 0.5/sqrt(4000) ~ 0.008
    estimate = maj_at_k(ids, ok, 5, num_subsets=4000, seed=1)
    assert abs(estimate - exact) < 0.04
    assert estimate == maj_at_k(ids, ok, 5, num_subsets=4000, seed=1)  # seeded


def test_score_problem_and_summarize_by_hand():
    # problem a: 4 samples, rewards 1 0 1 0, answers 5 6 5 None -> clusters 0 1 0 -1, cluster 0 correct
    a = score_problem(
        "a", [1, 0, 1, 0], ["5", "6", "5", None], exact_eq, lengths=[3, 4, 5, 8], truncated=[0, 0, 0, 1]
    )
    assert a.clusters == [0, 1, 0, -1] and a.cluster_correct == [True, False]
    # problem b: all wrong, answers 7 7 8 9
    b = score_problem(
        "b", [0, 0, 0, 0], ["7", "7", "8", "9"], exact_eq, lengths=[2, 2, 2, 2], truncated=[0, 0, 0, 0]
    )
    with pytest.warns(UserWarning, match="n = 4 samples per problem is below k: pass@8 not reported"):
        s = summarize([a, b], ks=(1, 2, 8), maj_ks=(4,))
    assert s["pass@1"] == pytest.approx(0.25)  # (0.5 + 0) / 2
    assert s["pass@1/se_problems"] == pytest.approx(0.25)  # std([0.5, 0]) = 0.3536, / sqrt 2
    # per-seed accuracies: sample 0 -> (1+0)/2, 1 -> 0, 2 -> 0.5, 3 -> 0: mean .25, std(ddof=1)=0.2887, /2
    assert s["pass@1/se_seeds"] == pytest.approx(math.sqrt(1 / 12) / 2)
    # pass@2: a: 1 - C(2,2)/C(4,2) = 5/6, b: 0 -> 5/12; k=8 > n=4 is skipped
    assert s["pass@2"] == pytest.approx(5 / 12)
    assert "pass@8" not in s
    assert s["maj@4"] == pytest.approx(0.5)  # a: cluster "5" wins (2 votes) and is correct; b: "7" wrong
    assert s["reward/mean"] == pytest.approx(0.25)
    assert s["response_length/mean"] == pytest.approx((5 + 2) / 2)
    assert s["response/clip_ratio"] == pytest.approx(0.125)
    assert s["num_problems"] == 2 and s["num_samples"] == 4


def test_problem_scores_round_trip():
    p = score_problem("x", [1.0, 0.0], ["1", None], exact_eq, texts=["\\boxed{1}", "?"])
    q = ProblemScores.from_dict(p.to_dict())
    assert q == p
    assert "lengths" not in p.to_dict()


def test_summarize_pass_at_k_equals_brute_force_average():
    rng = random.Random(3)
    problems = []
    for i in range(6):
        rewards = [float(rng.random() < 0.3) for _ in range(6)]
        problems.append(score_problem(str(i), rewards, [str(int(r)) for r in rewards], exact_eq))
    s = summarize(problems, ks=(3,))
    brute = np.mean(
        [np.mean([any(p.rewards[j] > 0 for j in sub) for sub in combinations(range(6), 3)]) for p in problems]
    )
    assert s["pass@3"] == pytest.approx(brute)


def test_summarize_warns_which_metrics_n_is_too_small_for(recwarn):
    """With n below k, pass@k and maj@k cannot be computed: a warning names each one left out."""
    problems = [score_problem("a", [1, 0, 0], ["1", "2", "2"], exact_eq)]
    with pytest.warns(UserWarning) as caught:
        s = summarize(problems, ks=(1, 2, 16), maj_ks=(3, 16))
    (warning,) = caught
    assert str(warning.message) == (
        "n = 3 samples per problem is below k: pass@16, maj@16 not reported; sample n >= 16 to get them"
    )
    assert {"pass@2", "maj@3"} <= set(s) and not {"pass@16", "maj@16"} & set(s)
    summarize(problems, ks=(1, 3), maj_ks=(3,))  # every k fits: no warning
    assert len(recwarn) == 0
