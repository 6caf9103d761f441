"""Bounded exponential backoff with jitter: the one formula for every wait between tries."""

from __future__ import annotations

import random


def backoff_seconds(*, attempt_no: int, base: float, cap: float) -> float:
    """Bounded exponential backoff with jitter: ``d = min(cap, base * 2**(attempt_no - 1))``,
    then a uniform pick in ``[d/2, d]`` ("equal jitter", AWS Architecture Blog, 2015).

    Example with base 0.25 s: about 0.25, 0.5, 1, 2 s ... never above ``cap`` seconds.
    """
    ceiling = min(cap, base * float(2 ** max(0, attempt_no - 1)))
    return ceiling / 2 + random.uniform(0, ceiling / 2)  # noqa: S311 - jitter, not security


__all__ = ["backoff_seconds"]
