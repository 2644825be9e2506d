"""Repeats (seeds) of one configuration reduced to a mean and a 95 % confidence interval,
the same way in ``bench report`` and ``bench compare``."""

from __future__ import annotations

import math
from collections.abc import Iterable

#: two-sided 95 % Student t quantiles by degrees of freedom (normal beyond the table)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}


def t95(n: int) -> float:
    """The 95 % two-sided t quantile for a mean of ``n`` repeats (conservative between rows)."""
    df = n - 1
    if df in T95:
        return T95[df]
    larger = [d for d in T95 if d > df]
    return T95[min(larger)] if larger else 1.96


def half_width(std: float, n: int) -> float:
    """95 % half-width of a mean of ``n`` values with sample std ``std``; NaN for one value."""
    return t95(n) * std / math.sqrt(n) if n >= 2 else math.nan


def mean_ci(values: Iterable[float]) -> tuple[float, float, int]:
    """(mean, 95 % half-width, count) of the finite values."""
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not xs:
        return math.nan, math.nan, 0
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return mean, half_width(std, len(xs)), len(xs)
