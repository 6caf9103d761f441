"""Bounded exponential backoff with jitter: the one formula for every wait between tries, and
the one floor under a same-key retry after a timed-out attempt."""

from __future__ import annotations

import random

from operations.adapters.errors import AmbiguousOutcome


def backoff_seconds(*, attempt_no: int, base: float, cap: float) -> float:
    """Bounded exponential backoff with jitter: ``d = min(cap, base * 2**(attempt_no - 1))``,
    then a uniform pick in ``[d/2, d]`` ("equal jitter", AWS Architecture Blog, 2015).

    Example with base 0.25 s: about 0.25, 0.5, 1, 2 s ... never above ``cap`` seconds.
    """
    ceiling = min(cap, base * float(2 ** max(0, attempt_no - 1)))
    return ceiling / 2 + random.uniform(0, ceiling / 2)  # noqa: S311 - jitter, not security


def after_timeout_floor_seconds(answer: BaseException, *, deadline_seconds: float) -> float | None:
    """The least delay, in seconds, before a same-key retry after ``answer``: the timed-out
    attempt's own deadline when the call's deadline passed after the request was sent, else
    None (no floor). Issue 38, item 6.

    Args:
        answer: what the adapter raised; a timeout is an ``AmbiguousOutcome`` whose
            ``detail["code"]`` is ``deadline_exceeded`` (``AmbiguousOutcome.timed_out``, raised
            by ``operations.adapters.http_support.send`` for every HTTP adapter).
        deadline_seconds: the per-attempt deadline the worker gave the adapter
            (``ExecutionCall.deadline_seconds``, from ``engine.provider_deadline_seconds``),
            in seconds.

    Why: the provider may still be working on the request when we give up (one that trickles
    its answer holds it about as long again), so a retry 0.2 s later meets the first request
    still in flight: two same-key requests at once, answered "in progress" at best. Waiting at
    least as long as we were willing to wait for the first gives it that time again to finish.
    The floor is not capped by the policy's ``retry.cap_seconds`` (that would undo it for a
    deadline above the cap): the deadline is bounded already, by ``PROVIDER_TIMEOUT_SECONDS``
    and half the lease (``engine.provider_deadline_seconds``).
    """
    if isinstance(answer, AmbiguousOutcome) and answer.timed_out:
        return max(float(deadline_seconds), 0.0)
    return None


__all__ = ["after_timeout_floor_seconds", "backoff_seconds"]
