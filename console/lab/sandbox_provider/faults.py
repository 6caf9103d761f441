"""Fault injection: queued faults (``POST /_sandbox/faults``) and the per-request header
``X-Sandbox-Fault``.

A queued fault applies to the next ``times`` matching product POSTs, in the order queued; the
header wins over the queue for its own request. Faults live in the provider's memory: a restart
or ``POST /_sandbox/reset`` clears them.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import asdict, dataclass
from typing import Any

from console.lab.sandbox_provider.replies import BadRequest

PRODUCTS = ("payments", "email", "reservations")


class FaultMode(enum.StrEnum):
    """What the provider does to a faulted request."""

    CRASH_BEFORE_EFFECT = "crash_before_effect"  # drop the connection, apply nothing
    CRASH_AFTER_EFFECT = "crash_after_effect"  # apply, then drop the connection unanswered
    DELAY_AFTER_EFFECT = "delay_after_effect"  # sleep delay_seconds, then apply and answer
    ERROR_500_BEFORE_EFFECT = "error_500_before_effect"  # answer 500, apply nothing
    ERROR_500_AFTER_EFFECT = "error_500_after_effect"  # apply, then answer 500
    IN_PROGRESS = "in_progress"  # answer 409 request_in_progress, apply nothing
    HOLD_BEFORE_EFFECT = "hold_before_effect"  # hold the connection delay_seconds, apply nothing, drop
    HOLD_AFTER_EFFECT = "hold_after_effect"  # apply, hold the connection delay_seconds, drop
    # Serve the request as usual (apply, replay or refuse), then hold its answer delay_seconds and
    # send it: a slow answer also for a replay (delay_after_effect sleeps only before applying).
    HOLD_ANSWER = "hold_answer"

    @property
    def applies_effect(self) -> bool:
        """Whether the effect is applied under this fault."""
        return self in {
            FaultMode.CRASH_AFTER_EFFECT,
            FaultMode.DELAY_AFTER_EFFECT,
            FaultMode.ERROR_500_AFTER_EFFECT,
            FaultMode.HOLD_AFTER_EFFECT,
        }


#: Seconds a delay or hold lasts when the fault does not say.
DEFAULT_DELAY_SECONDS = {FaultMode.DELAY_AFTER_EFFECT: 5.0}
DEFAULT_HOLD_SECONDS = 30.0


@dataclass
class Fault:
    """One queued fault.

    Attributes:
        product: ``payments``, ``email``, ``reservations`` or ``*``.
        mode: see ``FaultMode``.
        times: how many more matching requests it applies to.
        reference: when set, only requests whose body ``reference`` equals it match.
        delay_seconds: the sleep of ``delay_after_effect`` / the hold of ``hold_*``.
    """

    product: str
    mode: FaultMode
    times: int = 1
    reference: str | None = None
    delay_seconds: float | None = None

    @property
    def seconds(self) -> float:
        """The effective delay or hold, in seconds."""
        if self.delay_seconds is not None:
            return self.delay_seconds
        return DEFAULT_DELAY_SECONDS.get(self.mode, DEFAULT_HOLD_SECONDS)

    def matches(self, product: str, reference: str | None) -> bool:
        """Whether a POST to ``product`` with body ``reference`` is subject to this fault."""
        if self.product not in ("*", product):
            return False
        return self.reference is None or self.reference == reference

    def as_json(self) -> dict[str, Any]:
        """The fault as JSON (``mode`` as text)."""
        return {**asdict(self), "mode": str(self.mode)}


def parse_mode(raw: Any) -> FaultMode:
    """Return the ``FaultMode`` named ``raw``.

    Raises:
        BadRequest: unknown mode, listing the known ones.
    """
    try:
        return FaultMode(raw)
    except ValueError:
        known = ", ".join(m.value for m in FaultMode)
        raise BadRequest(f"unknown fault mode {raw!r}; known: {known}", param="mode") from None


def parse_seconds(raw: Any, *, param: str) -> float | None:
    """Return ``raw`` as non-negative seconds, ``None`` when absent.

    Raises:
        BadRequest: not a number, or negative.
    """
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw < 0:
        raise BadRequest(f"{param} must be a non-negative number of seconds", param=param)
    return float(raw)


def parse_fault(body: dict[str, Any]) -> Fault:
    """Build a ``Fault`` from ``POST /_sandbox/faults`` JSON:
    ``{"product", "mode", "times"?: int >= 1, "match"?: {"reference"}, "delay_seconds"?}``.

    Raises:
        BadRequest: any field missing or malformed.
    """
    unknown = sorted(set(body) - {"product", "mode", "times", "match", "delay_seconds"})
    if unknown:  # e.g. a top-level "reference" would otherwise silently match every request
        raise BadRequest(f"unknown field(s) {', '.join(unknown)}; to match a reference use "
                         '{"match": {"reference": "..."}}', param=unknown[0])  # fmt: skip
    product = body.get("product", "*")
    if product not in (*PRODUCTS, "*"):
        raise BadRequest(f"product must be one of {', '.join(PRODUCTS)} or '*'", param="product")
    times = body.get("times", 1)
    if isinstance(times, bool) or not isinstance(times, int) or times < 1:
        raise BadRequest("times must be an integer >= 1", param="times")
    match = body.get("match", {})
    if (
        not isinstance(match, dict)
        or set(match) - {"reference"}
        or not isinstance(match.get("reference", ""), str)
    ):  # anything else would silently match every request
        raise BadRequest('match must be {"reference": "..."} (or {} for any request)', param="match")
    return Fault(
        product=product,
        mode=parse_mode(body.get("mode")),
        times=times,
        reference=match.get("reference"),
        delay_seconds=parse_seconds(body.get("delay_seconds"), param="delay_seconds"),
    )


class FaultBook:
    """The queue of injected faults, safe to use from many request threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []

    def add(self, fault: Fault) -> None:
        """Queue ``fault`` behind the others."""
        with self._lock:
            self._faults.append(fault)

    def clear(self) -> None:
        """Drop every queued fault."""
        with self._lock:
            self._faults.clear()

    def pending(self) -> list[dict[str, Any]]:
        """The queued faults as JSON, in order."""
        with self._lock:
            return [f.as_json() for f in self._faults]

    def take(self, product: str, reference: str | None) -> Fault | None:
        """Consume one use of the first fault matching the request, atomically.

        Returns:
            a copy of the fault with ``times=1``, or ``None`` when none matches.
        """
        with self._lock:
            for fault in self._faults:
                if fault.matches(product, reference):
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                    return Fault(fault.product, fault.mode, 1, fault.reference, fault.delay_seconds)
        return None
