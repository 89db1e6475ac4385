"""Statistics for comparisons: medians, dispersion, a hierarchical bootstrap, a reproducibility verdict.

Why hierarchical: blocks of one engine instance share that instance's luck (memory layout, clocks,
code path taken at load). The seeds saw one config land anywhere in 46.7-73.4 tok/s across 9
instances while blocks inside one instance agreed. Resampling instances first, then blocks inside
each chosen instance, keeps that between-instance variance in the interval instead of hiding it.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from tui.base.defaults import DEFAULT_CV_THRESHOLD_PCT
from tui.base.stats import median, quantile

Verdict = Literal["reproducible", "not reproducible", "single instance"]


def cv_pct(values: Sequence[float]) -> float | None:
    """Coefficient of variation in % (sample standard deviation / mean); None below two values."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    if mean == 0:
        return None
    return statistics.stdev(values) / abs(mean) * 100.0


@dataclass(frozen=True, slots=True)
class Summary:
    n: int
    median: float | None
    cv_pct: float | None
    min: float | None
    max: float | None

    def as_dict(self) -> dict[str, float | int | None]:
        return {"n": self.n, "median": self.median, "cv_pct": self.cv_pct, "min": self.min, "max": self.max}


def summarize(values: Sequence[float | None]) -> Summary:
    """Median, CV% and range of the values that exist (None = not measured, never counted as 0)."""
    present = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not present:
        return Summary(0, None, None, None, None)
    return Summary(len(present), median(present), cv_pct(present), min(present), max(present))


def verdict(instance_values: Sequence[float], threshold_pct: float = DEFAULT_CV_THRESHOLD_PCT) -> Verdict:
    """Reproducible when instance medians scatter at most threshold_pct (CV); one instance proves nothing."""
    cv = cv_pct(instance_values)
    if cv is None:
        return "single instance"
    return "reproducible" if cv <= threshold_pct else "not reproducible"


Groups = Sequence[Sequence[float]]


def _resample_median(groups: Groups, rng: random.Random) -> float:
    picked: list[float] = []
    for _ in groups:
        group = groups[rng.randrange(len(groups))]
        picked.extend(group[rng.randrange(len(group))] for _ in group)
    return statistics.median(picked)


def bootstrap_ratio_ci(
    numerator: Groups,
    denominator: Groups,
    *,
    n_boot: int = 5000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of median(numerator) / median(denominator).

    Each argument is a list of groups (one per engine instance) of block values. Resampling picks
    groups with replacement, then values within each picked group with replacement. A flat sample is
    a list of one-element groups. Fixed seed: the same data always gives the same interval.
    """
    for name, groups in (("numerator", numerator), ("denominator", denominator)):
        if not groups or any(len(g) == 0 for g in groups):
            raise ValueError(f"bootstrap: the {name} has an empty group or no groups")
    if not 0 < confidence < 1:
        raise ValueError(f"bootstrap: confidence must be between 0 and 1, got {confidence}")
    rng = random.Random(seed)
    ratios: list[float] = []
    for _ in range(n_boot):
        den = _resample_median(denominator, rng)
        num = _resample_median(numerator, rng)
        if den != 0:
            ratios.append(num / den)
    if not ratios:
        raise ValueError("bootstrap: the denominator's median is always 0")
    alpha = (1 - confidence) / 2
    lo, hi = quantile(ratios, alpha), quantile(ratios, 1 - alpha)  # numpy's default interpolation
    assert lo is not None and hi is not None  # ratios is not empty
    return lo, hi


def ratio_of_medians(numerator: Sequence[float], denominator: Sequence[float]) -> float | None:
    num, den = median(numerator), median(denominator)
    if num is None or den is None or den == 0:
        return None
    return num / den
