"""Statistics on known data: medians, CV, verdicts and bootstrap intervals with a fixed seed."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from tui.compare.stats import (
    bootstrap_ratio_ci,
    cv_pct,
    median,
    ratio_of_medians,
    summarize,
    verdict,
)


def test_median_even_and_odd() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert median([]) is None


def test_cv_known_values() -> None:
    # mean 12, sample stdev 2 -> 16.67 %
    assert cv_pct([10.0, 12.0, 14.0]) == pytest.approx(100 * 2 / 12)
    assert cv_pct([5.0, 5.0, 5.0]) == 0.0
    assert cv_pct([5.0]) is None


def test_summarize_ignores_missing_values_instead_of_counting_zero() -> None:
    s = summarize([10.0, None, 14.0, 12.0, float("nan")])
    assert (s.n, s.median, s.min, s.max) == (3, 12.0, 10.0, 14.0)
    assert s.cv_pct == pytest.approx(16.6667, abs=1e-3)
    assert summarize([None]).median is None


def test_seed_report_arms_get_the_seed_verdicts() -> None:
    # llama.cpp MTP n=4 across 5 instances, 95.0-99.8: reproducible at 5 %
    assert verdict([95.0, 96.5, 97.1, 99.8, 96.0]) == "reproducible"
    # vLLM MTP n=1 across instances, 46.7-73.4: not reproducible
    assert verdict([73.4, 46.7, 61.0, 52.3, 70.2]) == "not reproducible"
    assert verdict([57.0]) == "single instance"
    assert verdict([100.0, 104.0], threshold_pct=1.0) == "not reproducible"


def test_bootstrap_constant_arms_give_an_exact_interval() -> None:
    a = [[100.0, 100.0], [100.0, 100.0]]
    b = [[150.0, 150.0], [150.0, 150.0]]
    assert bootstrap_ratio_ci(b, a, seed=1) == (1.5, 1.5)


def test_bootstrap_fixed_seed_is_deterministic_and_brackets_the_ratio() -> None:
    a = [[100.0, 101.0], [99.0, 100.5], [100.2, 99.6]]
    b = [[120.0, 121.5], [119.0, 120.4], [120.8, 119.9]]
    first = bootstrap_ratio_ci(b, a, seed=7, n_boot=2000)
    assert first == bootstrap_ratio_ci(b, a, seed=7, n_boot=2000)
    lo, hi = first
    point = ratio_of_medians([v for g in b for v in g], [v for g in a for v in g])
    assert point is not None
    assert lo <= point <= hi
    # every resampled median lies within each arm's range, so the ratio is bounded by range ratios
    assert 119.0 / 101.0 <= lo < hi <= 121.5 / 99.0


def test_bootstrap_matches_an_independent_flat_computation() -> None:
    """With one value per group the hierarchical resampling is the plain bootstrap; recompute it here."""
    a = [98.0, 103.0, 100.0, 97.0, 104.0, 101.0]
    b = [110.0, 118.0, 113.0, 109.0, 121.0, 115.0]
    lo, hi = bootstrap_ratio_ci([[v] for v in b], [[v] for v in a], seed=3, n_boot=4000)
    # The implementation draws a group, then an element inside it (always index 0 here): mirror those draws.
    rng = random.Random(3)
    ratios = []
    for _ in range(4000):
        den_vals = []
        for _ in a:
            g = rng.randrange(6)
            rng.randrange(1)
            den_vals.append(a[g])
        num_vals = []
        for _ in b:
            g = rng.randrange(6)
            rng.randrange(1)
            num_vals.append(b[g])
        ratios.append(statistics.median(num_vals) / statistics.median(den_vals))
    ratios.sort()
    q = statistics.quantiles(ratios, n=40, method="inclusive")  # 2.5 % steps
    assert lo == pytest.approx(q[0])
    assert hi == pytest.approx(q[-1])


def test_bootstrap_between_instance_scatter_widens_the_interval() -> None:
    """Blocks that agree inside instances must not hide that the instances disagree."""
    steady = [[100.0, 100.1], [100.0, 99.9], [100.1, 100.0]]
    drifting = [[80.0, 80.1], [120.0, 119.9], [100.0, 100.1]]
    lo_s, hi_s = bootstrap_ratio_ci(steady, steady, seed=0)
    lo_d, hi_d = bootstrap_ratio_ci(drifting, steady, seed=0)
    assert hi_d - lo_d > 20 * (hi_s - lo_s)
    assert lo_d < 0.85 and hi_d > 1.15


def test_bootstrap_rejects_bad_input_with_a_message() -> None:
    with pytest.raises(ValueError, match="empty group"):
        bootstrap_ratio_ci([[1.0]], [[]])
    with pytest.raises(ValueError, match="always 0"):
        bootstrap_ratio_ci([[1.0]], [[0.0]])
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ratio_ci([[1.0]], [[1.0]], confidence=1.5)


def test_ratio_of_medians() -> None:
    assert ratio_of_medians([105.5], [79.2]) == pytest.approx(1.332, abs=1e-3)
    assert ratio_of_medians([], [1.0]) is None
    assert not math.isnan(ratio_of_medians([1.0, 3.0], [2.0]) or 0.0)
