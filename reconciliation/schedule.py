"""How long the reconciler waits before looking at an item again: one schedule for lookups of
UNKNOWN intents and for duplicate checks."""

from __future__ import annotations

#: Seconds before looking again, by lookup number: a lagging read path gets time to catch up
#: without the reconciler hammering the provider. Past the table the wait keeps doubling up to
#: ``LOOKUP_BACKOFF_CAP_SECONDS``, so an escalated item waiting for an operator costs about one
#: lookup an hour, not one a minute (an operator can ask for a fresh one at any time).
LOOKUP_BACKOFF_SECONDS = (1, 2, 4, 8, 15, 30, 60)
LOOKUP_BACKOFF_CAP_SECONDS = 3600


def lookup_delay_seconds(lookups: int) -> int:
    """Seconds to wait after the ``lookups``-th lookup (1-based) before the next one:
    1, 2, 4, 8, 15, 30, 60, then 120, 240 ... capped at 3,600."""
    table = LOOKUP_BACKOFF_SECONDS
    if lookups <= len(table):
        return table[max(lookups, 1) - 1]
    return min(LOOKUP_BACKOFF_CAP_SECONDS, table[-1] * int(2 ** (lookups - len(table))))
