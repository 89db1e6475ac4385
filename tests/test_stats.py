"""Statistics on known data: medians, CV, verdicts and bootstrap intervals with a fixed seed."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable

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


def _exact_distribution(groups: list[list[float]]) -> dict[float, int]:
    """Every equally likely outcome of one hierarchical resample, enumerated: each group slot takes any
    group, then each of that group's values any of its values. Counts of each resampled median."""
    counts: dict[float, int] = {}
    for chosen in itertools.product(groups, repeat=len(groups)):
        for picks in itertools.product(*(itertools.product(g, repeat=len(g)) for g in chosen)):
            m = statistics.median([v for pick in picks for v in pick])
            counts[m] = counts.get(m, 0) + 1
    return counts


def _cdf(num: dict[float, int], den: dict[float, int]) -> Callable[[float, bool], float]:
    """P(num/den < x) (strict) or <= x, over the exact joint distribution of the two independent medians."""
    total = sum(num.values()) * sum(den.values())
    pairs = [(n / d, cn * cd) for n, cn in num.items() for d, cd in den.items()]

    def cdf(x: float, strict: bool) -> float:
        return sum(w for r, w in pairs if (r < x if strict else r <= x)) / total

    return cdf


def test_bootstrap_interval_matches_the_exact_bootstrap_distribution() -> None:
    """The bootstrap's interval against an exact enumeration of its distribution: no random draws replayed.

    Three instances that differ between them more than inside: a flat resampling, or one of groups only,
    or of values inside fixed groups only, each gives another distribution, and fails here.
    """
    num = [[100.0, 104.0], [80.0, 82.0], [120.0, 125.0]]
    den = [[100.0, 101.0], [90.0, 93.0], [110.0, 108.0]]
    lo, hi = bootstrap_ratio_ci(num, den, seed=11, n_boot=20_000)
    cdf = _cdf(_exact_distribution(num), _exact_distribution(den))
    # lo must be the exact distribution's 2.5 % quantile and hi its 97.5 % quantile; 20 000 resamples put
    # the sampled quantile's probability within ~0.0011 (one standard error) of the target, 0.01 is ~9.
    tol = 0.01
    assert cdf(lo, True) <= 0.025 + tol and cdf(lo, False) >= 0.025 - tol, (lo, cdf(lo, True), cdf(lo, False))
    assert cdf(hi, True) <= 0.975 + tol and cdf(hi, False) >= 0.975 - tol, (hi, cdf(hi, True), cdf(hi, False))


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
    assert ratio_of_medians([1.0, 3.0], [2.0]) == 1.0  # median of an even count: the mean of the middle two
    assert ratio_of_medians([1.0], [0.0]) is None
