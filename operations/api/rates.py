"""Request rates written as ``"600/min"`` (the API's limits, ``operations.api.throttling``); pure, so
the settings can validate them at start-up."""

from __future__ import annotations

import re

_RATE = re.compile(r"^\s*(\d+)\s*/\s*(s|sec|second|m|min|minute|h|hour|d|day)\s*$")
_PERIOD_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def rate_parse(text: str) -> tuple[int, int] | None:
    """``"600/min"`` as (requests, period in seconds); ``"off"`` (or ``"none"``) as None: no limit.

    Periods: ``s``/``sec``/``second``, ``m``/``min``/``minute``, ``h``/``hour``, ``d``/``day``
    (the spellings DRF's ``parse_rate`` reads by their first letter).

    Raises:
        ValueError: anything else, or fewer than one request per period.
    """
    if text.strip().lower() in {"off", "none"}:
        return None
    match = _RATE.match(text)
    if not match:
        raise ValueError(f"not a rate: {text!r} (use e.g. '600/min', '20/s', '10000/hour' or 'off')")
    requests = int(match.group(1))
    if requests < 1:
        raise ValueError(f"a rate allows at least one request per period, got {text!r}")
    return requests, _PERIOD_SECONDS[match.group(2)[0]]
