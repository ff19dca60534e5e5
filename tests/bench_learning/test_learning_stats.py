"""The learning benchmark's statistics: t-intervals, paired differences, AUC, steps to threshold."""

from __future__ import annotations

import math
import random
import sys

import pytest
from benchmarks.learning.stats import (
    MeanCI,
    curve_mean,
    mean_ci,
    median_censored,
    paired_ci,
    steps_to_threshold,
    t_quantile,
    validation_auc,
)

from ebpo import stats as ebpo_stats


def test_mean_ci_by_hand():
    # 0.2, 0.4, 0.6: mean 0.4, s = sqrt((0.04 + 0 + 0.04) / 2) = 0.2, half = 4.303 * 0.2 / sqrt(3) = 0.4969
    ci = mean_ci([0.2, 0.4, 0.6])
    assert ci.n == 3 and ci.mean == pytest.approx(0.4)
    assert ci.half_width == pytest.approx(4.303 * 0.2 / math.sqrt(3), rel=1e-3)
    assert ci.format() == "40.0 ± 49.7" and not ci.excludes_zero
    one = mean_ci([0.25])
    assert one.n == 1 and math.isnan(one.half_width) and one.format() == "25.0" and not one.excludes_zero
    assert mean_ci([]).format() == "-"
    assert mean_ci([0.1, None, float("nan"), 0.3]).n == 2  # missing values are not zeros
    assert mean_ci([0.5, 0.5]).half_width == 0.0


def test_paired_ci_by_hand_uses_common_seeds_only():
    # differences per seed: 0.1, 0.2, 0.1 (seed 3 has no reference, seed 4 no value)
    # mean 0.1333, s = sqrt((0.0011 + 0.0044 + 0.0011) / 2) = 0.0577, half = 4.303 * 0.0577 / sqrt(3) = 0.1434
    values = {0: 0.5, 1: 0.6, 2: 0.7, 3: 0.9}
    reference = {0: 0.4, 1: 0.4, 2: 0.6, 4: 0.1}
    ci = paired_ci(values, reference)
    assert ci.n == 3 and ci.mean == pytest.approx(0.4 / 3)
    assert ci.half_width == pytest.approx(4.303 * math.sqrt(1 / 300) / math.sqrt(3), rel=1e-3)
    assert ci.format(signed=True) == "+13.3 ± 14.3" and not ci.excludes_zero
    # differences 0.10, 0.11, 0.12: mean 0.11, s = 0.01, half = 4.303 * 0.01 / sqrt(3) = 0.0248 < 0.11
    tight = paired_ci({0: 0.3, 1: 0.31, 2: 0.32}, {0: 0.2, 1: 0.2, 2: 0.2})
    assert tight.excludes_zero and tight.half_width == pytest.approx(0.0248, abs=1e-4)


def test_a_difference_is_signed_and_bold_only_when_its_interval_excludes_zero():
    # 0.012 ± 0.005 -> [0.007, 0.017] excludes 0; 0.012 ± 0.02 does not; one seed has no interval
    assert MeanCI(0.012, 0.005, 3).format_difference() == "**+1.2 ± 0.5**"
    assert MeanCI(0.012, 0.02, 3).format_difference() == "+1.2 ± 2.0"
    assert MeanCI(-0.004, float("nan"), 1).format_difference() == "-0.4"
    assert MeanCI(0.5, 0.1, 4).format_difference(scale=1.0, digits=2) == "**+0.50 ± 0.10**"


def test_t_quantile_is_ebpos_and_matches_scipy_with_or_without_it(monkeypatch):
    stats = pytest.importorskip("scipy.stats")
    assert t_quantile is ebpo_stats.t_quantile  # imported, not a copy
    for df in (*range(1, 31), 100):
        assert t_quantile(df) == pytest.approx(stats.t.ppf(0.975, df), abs=1e-9)
    monkeypatch.setitem(sys.modules, "scipy", None)  # import scipy now fails: the same exact values
    assert t_quantile(3) == pytest.approx(3.1824463052837078, abs=1e-9)  # scipy 1.17's t.ppf(0.975, 3)
    assert t_quantile(100) == pytest.approx(1.9839715185235518, abs=1e-9)  # scipy's; not df 30's 2.042
    with pytest.raises(ValueError, match="df >= 1"):
        t_quantile(0)


def test_mean_ci_equals_scipys_t_interval_on_random_samples():
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(0)
    for _ in range(20):
        xs = [rng.random() for _ in range(rng.randint(2, 12))]
        low, high = stats.t.interval(0.95, len(xs) - 1, loc=sum(xs) / len(xs), scale=stats.sem(xs))
        assert mean_ci(xs).half_width == pytest.approx((high - low) / 2, rel=1e-9)


def test_validation_auc_by_hand():
    # steps 0, 5, 10 with 0.2, 0.4, 0.4: trapezoids 5 * 0.3 + 5 * 0.4 = 3.5 over 10 steps = 0.35
    assert validation_auc([[0, 0.2], [5, 0.4], [10, 0.4]], 10) == pytest.approx(0.35)
    # uneven spacing 0, 4, 10: 4 * (0.1 + 0.3) / 2 + 6 * (0.3 + 0.3) / 2 = 0.8 + 1.8 = 2.6 / 10
    assert validation_auc([[10, 0.3], [0, 0.1], [4, 0.3]], 10) == pytest.approx(0.26)  # order does not matter
    assert validation_auc([[0, 0.5], [7, 0.5]], 7) == pytest.approx(0.5)  # a flat curve: its value
    assert math.isnan(validation_auc([[5, 0.2], [10, 0.3]], 10))  # no step 0
    assert math.isnan(validation_auc([[0, 0.2], [5, 0.3]], 10))  # does not reach the last step


def test_steps_to_threshold_and_censored_median():
    curve = [[0, 0.20], [5, 0.25], [10, 0.30], [15, 0.29]]
    # +5 points: 0.25 first at step 5; +10 points: 0.30 at step 10; +20 points never
    assert steps_to_threshold(curve, 0.05) == 5 and steps_to_threshold(curve, 0.10) == 10
    assert steps_to_threshold(curve, 0.20) is None
    assert steps_to_threshold([[5, 0.9]], 0.0) is None  # no step-0 value to start from
    # 5 seeds: 10, 20, 40, never, never -> sorted 10, 20, 40, inf, inf: median 40, reached 3 of 5
    assert median_censored([40, None, 10, None, 20], 150) == "40 (3/5)"
    assert median_censored([None, None, 10], 150) == "> 150 (1/3)"
    assert median_censored([10, 20], 150) == "15 (2/2)" and median_censored([10, None], 150) == "> 150 (1/2)"
    assert median_censored([], 150) == "-"


def test_curve_mean_skips_step_zero():
    assert curve_mean([[0, 9.0], [1, 1.0], [2, 3.0]]) == pytest.approx(2.0)
    assert math.isnan(curve_mean([[0, 1.0]]))


def _gym_analysis():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "docs" / "results" / "gym" / "analyze.py"
    spec = importlib.util.spec_from_file_location("gym_analyze", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.golden
def test_the_s2_replication_table_gives_each_block_and_the_pooled_seeds():
    # docs/results/gym/README.md quotes these rows: EBPO - GRPO at G = 2 on validation AUC (points), per block
    # and pooled. The first two blocks ship in the repository; the third lies in ../shared.
    analyze = _gym_analysis()
    third = analyze.shared_dir() / analyze.THIRD_BLOCK[1]  # $EBPO_SHARED, else ../shared beside the clone
    if not third.is_file():
        pytest.skip(
            f"the third S2 verdict block is not at {third} (a clone without ../shared; set EBPO_SHARED)"
        )
    table, missing = analyze.replication(third)
    assert missing is None
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line for line in table.splitlines()}
    g2_auc = rows[("(3a) EBPO (arm a) - GRPO, G = 2", "validation AUC")].split("|")[3:8]
    assert [c.strip() for c in g2_auc] == [
        "+0.8 ± 0.5 [+0.23, +1.32] (n = 10)",
        "+1.0 ± 0.5 [+0.53, +1.46] (n = 10)",
        "+0.2 ± 0.5 [-0.29, +0.76] (n = 10)",
        "+0.9 ± 0.3 [+0.56, +1.21] (n = 20)",
        "+0.7 ± 0.3 [+0.38, +0.95] (n = 30)",
    ]
    g2_test = rows[("(3a) EBPO (arm a) - GRPO, G = 2", "test Pass@1")].split("|")[5:8]
    assert [c.strip() for c in g2_test] == [
        "-0.1 ± 0.7 [-0.80, +0.58] (n = 10)",
        "+0.4 ± 0.4 [-0.06, +0.79] (n = 20)",
        "+0.2 ± 0.4 [-0.14, +0.56] (n = 30)",
    ]


def test_the_s2_replication_table_without_the_third_block_says_so(tmp_path):
    analyze = _gym_analysis()
    table, missing = analyze.replication(tmp_path / "absent.csv")
    assert missing.startswith("the third block (seeds 61-70) is not at ") and "EBPO_SHARED" in missing
    assert table.splitlines()[0] == "| comparison | metric | seeds 0-9 | seeds 10-19 | seeds 0-19 |"
