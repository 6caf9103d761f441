"""Delivery timing: what the broker may hold, and what a delivery does without a database.

PostgreSQL is the source of truth and the broker carries only wake-ups (DESIGN.md, Dispatch):

- A delay (a retry's backoff, ``Intent.not_before``) lives in the database, copied to the outbox
  row's ``due_at``. The relay publishes a row at most ``MAX_COUNTDOWN_SECONDS`` before it is
  due, so no message waits in the broker for longer than that. RabbitMQ closes the channel of
  a consumer that holds a message unacknowledged past its ``consumer_timeout`` (30 minutes by
  default; PRECONDITION_FAILED), and Redis delivers again a message held past its
  ``visibility_timeout``: Celery's ETA/countdown messages are held unacknowledged until due.
- A delivery that fails because the database is unreachable is retried by the task with a
  short countdown (``database_retry_countdown``), never acknowledged and dropped.
- A due READY intent that nobody claimed within ``stalled_ready_seconds()`` is presumed to
  have lost its message and gets a fresh one (``reconciliation.services.redispatch_stalled_ready``).
"""

from __future__ import annotations

import psycopg
from django.conf import settings
from django.db import DatabaseError

from operations.engine.backoff import backoff_seconds

#: The longest countdown (seconds) any message is published with, from any path. Far below
#: RabbitMQ's default consumer_timeout (1,800 s) and the Redis visibility_timeout (3,600 s).
MAX_COUNTDOWN_SECONDS = 30.0

#: Countdown (seconds) of the first re-delivery while the database is unreachable; it doubles
#: up to ``DATABASE_RETRY_MAX_SECONDS``.
DATABASE_RETRY_BASE_SECONDS = 0.5
DATABASE_RETRY_MAX_SECONDS = 2.0

#: ``Retry-After`` (seconds) of the API's 503 while the database is unreachable.
DATABASE_RETRY_AFTER_SECONDS = 5

# Server answers that mean "not serving now" rather than "your statement failed": class 08
# (connection exception), admin/crash shutdown, starting up, too many connections
# (PostgreSQL Appendix A, error codes).
_UNAVAILABLE_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300"})


def bounded_countdown(seconds: float) -> float:
    """Clamp a countdown to ``[0, MAX_COUNTDOWN_SECONDS]`` seconds.

    Every publication goes through this; a delay longer than the bound stays in the database
    (the outbox row's ``due_at``) until the relay finds the row within the bound.
    """
    return min(max(0.0, float(seconds)), MAX_COUNTDOWN_SECONDS)


def database_retry_countdown(retries: int) -> float:
    """Seconds before re-delivering a message whose task found the database unreachable.

    ``DATABASE_RETRY_BASE_SECONDS * 2**retries`` capped at ``DATABASE_RETRY_MAX_SECONDS``, with
    equal jitter (a uniform pick in ``[d/2, d]``, AWS Architecture Blog, 2015) so that workers
    do not all reconnect at the same instant when the database comes back.

    Args:
        retries: how many times this message was already re-delivered (``task.request.retries``).
    """
    return backoff_seconds(
        attempt_no=retries + 1, base=DATABASE_RETRY_BASE_SECONDS, cap=DATABASE_RETRY_MAX_SECONDS
    )


def database_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` says the database cannot be reached, not that a statement failed.

    Covers Django's ``OperationalError`` / ``InterfaceError`` (and psycopg's own) raised for a
    refused, reset, closed or timed-out connection (no SQLSTATE: no server answered) or a server
    answering with a connection exception (class 08) or a shutdown / start-up / too-many-
    connections code. A deadlock, a statement timeout or a bad password is not "unreachable":
    retrying it blindly would loop or hide a configuration error.
    """
    if not isinstance(exc, DatabaseError | psycopg.Error):
        return False
    cause = exc.__cause__ if isinstance(exc, DatabaseError) and exc.__cause__ is not None else exc
    if not isinstance(cause, psycopg.OperationalError | psycopg.InterfaceError):
        return False
    sqlstate = getattr(cause, "sqlstate", None)
    if sqlstate is None:
        return True
    return sqlstate.startswith("08") or sqlstate in _UNAVAILABLE_SQLSTATES


def _publish_seconds() -> float:
    """The longest one publication can take: each connection try may last the broker connection
    timeout, and the transport retries ``max_retries`` times, at most ``interval_max`` apart."""
    options = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}) or {}
    retries = int(options.get("max_retries", 0) or 0)
    timeout = float(getattr(settings, "CELERY_BROKER_CONNECTION_TIMEOUT", 4.0) or 4.0)
    return timeout * (1 + retries) + retries * float(options.get("interval_max", 0) or 0)


def stalled_ready_seconds() -> float:
    """Seconds a due READY intent may go unclaimed before its delivery is presumed lost.

    The sum of the longest waits a message that was not lost can have between "due" and
    "claimed" (everything from settings, so the sweep follows the configuration):

    - one relay period (``EFFECT_LEDGER["RELAY_PERIOD_SECONDS"]``): a row whose post-commit kick
      failed waits for the periodic relay;
    - one publication (``_publish_seconds``: ``CELERY_BROKER_CONNECTION_TIMEOUT`` and the
      transport's ``max_retries`` / ``interval_max``);
    - prefetch: a worker process reserves ``CELERY_WORKER_PREFETCH_MULTIPLIER`` messages ahead,
      and each waits behind at most that many running tasks, each of which ends within its
      lease (``EFFECT_LEDGER["LEASE_SECONDS"]``) or loses it;
    - a delivery re-tried while the database was unreachable comes back within
      ``DATABASE_RETRY_MAX_SECONDS`` of the database's return;
    - one more relay period as margin.

    With the defaults (relay 2 s, connection timeout 4 s, one publish retry at most 0.5 s
    apart, prefetch 1, lease 30 s): 2 + 8.5 + 30 + 2 + 2 = 44.5 s. A backlog deeper than that
    makes the sweep add wake-ups for intents that are only queued; the claim's compare-and-swap
    absorbs them as duplicate deliveries.
    """
    conf = settings.EFFECT_LEDGER
    relay = float(conf["RELAY_PERIOD_SECONDS"])
    prefetch = max(1, int(getattr(settings, "CELERY_WORKER_PREFETCH_MULTIPLIER", 1) or 1))
    return (
        relay
        + _publish_seconds()
        + prefetch * float(conf["LEASE_SECONDS"])
        + DATABASE_RETRY_MAX_SECONDS
        + relay
    )
