"""Percentiles and small timing helpers (every duration in this package is in seconds unless a
name ends in ``_ms``)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def summary_ms(seconds: Sequence[float]) -> dict[str, float | None]:
    """p50 / p95 / p99 / max of durations given in seconds, returned in milliseconds."""
    return {
        f"{name}_ms": (None if value is None else round(value * 1000, 2))
        for name, value in (
            ("p50", percentile(seconds, 50)),
            ("p95", percentile(seconds, 95)),
            ("p99", percentile(seconds, 99)),
            ("max", max(seconds) if seconds else None),
        )
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator`` rounded to 3 places, None when either is missing or zero."""
    if not numerator or not denominator:
        return None
    return round(numerator / denominator, 3)
