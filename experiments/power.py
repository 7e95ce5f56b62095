"""Power of the tests a study in ``experiments/`` runs, exactly (noncentral t) where a formula exists.

Paired two-sided t-test of ``n`` per-seed differences with true mean ``δ`` and SD ``σ``: ``T = mean / (s / √n)``
follows the noncentral t distribution with ``n − 1`` df and noncentrality ``δ √n / σ``, so

    power(n) = P(T > t_{1−α/2, n−1}) + P(T < −t_{1−α/2, n−1})

(``paired_power``); ``seeds_for`` is the smallest n with power ≥ the target. An SD estimated from ``df`` degrees of
freedom has the one-sided upper confidence limit ``s · √(df / χ²_{1−c, df})`` (``sd_upper_limit``).
"""
from __future__ import annotations

import math


def paired_power(n: int, difference: float, sd: float, alpha: float) -> float:
    """Power of the two-sided paired t-test of ``n`` pairs at level ``alpha`` against a true ``difference``."""
    from scipy import stats
    if n < 2:
        return 0.0
    df, nc = n - 1, difference * math.sqrt(n) / sd
    t = stats.t.ppf(1 - alpha / 2, df)
    return float(stats.nct.sf(t, df, nc) + stats.nct.cdf(-t, df, nc))


def seeds_for(difference: float, sd: float, alpha: float, power: float = 0.8, smallest: int = 3,
              largest: int = 1000) -> int:
    """The smallest n in [smallest, largest] whose paired test has at least ``power`` (ValueError beyond)."""
    for n in range(smallest, largest + 1):
        if paired_power(n, difference, sd, alpha) >= power:
            return n
    raise ValueError(f"no n ≤ {largest} gives power {power} against {difference} at SD {sd}")


def sd_upper_limit(sd: float, df: int, confidence: float = 0.8) -> float:
    """The one-sided ``confidence`` upper limit of a standard deviation estimated as ``sd`` with ``df`` df."""
    from scipy import stats
    return sd * math.sqrt(df / stats.chi2.ppf(1 - confidence, df))
