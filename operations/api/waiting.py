"""Waiting for an intent's status to change without polling (issue 15, part 2).

``GET /api/v1/intents/{id}?wait=SECONDS`` answers as soon as the intent's status changes, or
when SECONDS run out. The pieces:

* Migration 0028 adds a row trigger on ``operations_intent``: an UPDATE that changes ``status``
  of an intent somebody waits for (a row of ``IntentWaiter``) sends ``pg_notify(CHANNEL, <intent
  id>)``, delivered when that transaction commits (PostgreSQL docs, "NOTIFY": "notifications are
  delivered only between transactions"), so a listener never hears of a change it cannot read
  yet. Intents nobody waits for send nothing: a NOTIFY's commit takes a server-wide lock.
* One ``StatusListener`` per web process: a daemon thread with its own psycopg autocommit
  connection (not Django's) that LISTENs on ``CHANNEL`` and sets the ``threading.Event`` of each
  request waiting for the notified intent. It starts on the first wait and reconnects with
  backoff (``operations.engine.backoff.backoff_seconds``) when its connection is lost.
* ``wait_for_status_change``: registers the request's event in this process, then its
  ``IntentWaiter`` row and reads the status under a share lock of the intent's row in the same
  statement (``_REGISTER``), then waits on the event with Django's connection closed: a waiting
  request holds a thread, never a database connection or a transaction. While the listener is
  not connected it re-reads once a second. The row is deleted when the wait ends.

Why nothing is missed between the registration and a change: the registering statement commits
its row and releases its share lock together. A transition that took the intent's row lock first
makes the registering read wait for its commit and then read the new status; one that comes
after waits for the registration's commit, and its trigger (a statement with its own snapshot)
sees the committed row and notifies.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections

from operations import selectors
from operations.api.listener import (
    CHANNEL,
    StatusListener,
    listener_connection_params,
    listener_fallback_reason,
)
from operations.exceptions import WaitInvalid
from operations.models import TERMINAL_STATUSES, Intent, IntentWaiter

logger = logging.getLogger("operations.api.waiting")

#: The longest wait a request may ask for, in seconds: a waiting request holds a web thread.
MAX_WAIT_SECONDS = 30.0
#: Statuses a wait answers at once: the terminal ones and SUCCEEDED, which only a compensation
#: started by a person leaves (a request would hold a web thread for nothing).
SETTLED_STATUSES = TERMINAL_STATUSES | {Intent.Status.SUCCEEDED}
#: A waiter row outlives its wait by this (seconds); older rows are a crashed process's, swept.
WAITER_GRACE_SECONDS = 60.0
#: While the listener is not connected, a waiting request re-reads the status this often (seconds).
FALLBACK_POLL_SECONDS = 1.0


@dataclass(frozen=True)
class WaitRequest:
    """A parsed ``?wait=SECONDS[&status=STATUS]``: wait at most ``seconds`` (0 < s <= 30) while
    the intent's status is ``status`` (None: the status read at the start of the request)."""

    seconds: float
    status: str | None


def wait_request(query: Mapping[str, str]) -> WaitRequest | None:
    """The wait asked for by a request's query parameters, or None when there is no ``wait``
    (the endpoint then answers as it always did; ``status`` alone is ignored).

    Args:
        query: the query parameters, e.g. ``{"wait": "20", "status": "READY"}``; ``wait`` in
            seconds (a decimal number, fractions allowed), ``status`` an ``Intent.Status`` name.

    Raises:
        WaitInvalid: ``wait`` is not a finite number with 0 < wait <= 30, or ``status`` is not a
            status name. Nothing is read or changed.
    """
    raw = query.get("wait")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_WAIT_SECONDS):
        raise WaitInvalid(
            f"wait must be a number of seconds with 0 < wait <= {MAX_WAIT_SECONDS:g}; got {raw!r}"
        )
    status = query.get("status")
    if status is not None and status not in Intent.Status.values:
        raise WaitInvalid(f"status must be one of {', '.join(Intent.Status.values)}; got {status!r}")
    return WaitRequest(seconds=seconds, status=status)


_listener: StatusListener | None = None
_listener_pid: int | None = None
_listener_lock = threading.Lock()


def status_listener() -> StatusListener:
    """This process's listener, created and started on first use (and again in a forked child,
    which does not inherit the parent's thread). Not started, and said so once in a warning,
    when ``listener_fallback_reason()`` gives a reason: its waits re-read once a second."""
    global _listener, _listener_pid
    with _listener_lock:
        if _listener is None or _listener_pid != os.getpid():
            _listener, _listener_pid = StatusListener(), os.getpid()
            fallback = listener_fallback_reason()
            if fallback:
                logger.warning("status listener not started: %s", fallback)
        listener = _listener
    if listener_fallback_reason() is None:
        listener.start()
    return listener


def stop_status_listener() -> None:
    """Stop this process's listener and close its connection, if it was started (tests: a test
    database cannot be dropped while the listener is connected to it)."""
    with _listener_lock:
        listener = _listener if _listener_pid == os.getpid() else None
    if listener is not None:
        listener.stop()


#: One statement, so one transaction in autocommit: the waiter's row, and the intent's status
#: read under a share lock of its row (see the module's docstring for why both together).
_REGISTER = f"""
    WITH waiter AS (
        INSERT INTO {IntentWaiter._meta.db_table} (intent_id, expires_at)
        VALUES (%(intent)s, statement_timestamp() + make_interval(secs => %(ttl)s))
        RETURNING id
    )
    SELECT waiter.id, intent.status
    FROM waiter LEFT JOIN LATERAL (
        SELECT status FROM {Intent._meta.db_table} WHERE id = %(intent)s FOR SHARE
    ) AS intent ON true
"""

#: The wait's own row, and any row of a process that died waiting.
_UNREGISTER = f"""
    DELETE FROM {IntentWaiter._meta.db_table}
    WHERE id = %(id)s OR expires_at < statement_timestamp() - make_interval(secs => %(grace)s)
"""


def _register(intent_id: uuid.UUID, seconds: float) -> tuple[int, str | None]:
    """Write the ``IntentWaiter`` row of a wait of ``seconds`` and read the intent's status
    (None: no such intent); returns (row id, status)."""
    with connection.cursor() as cursor:
        cursor.execute(_REGISTER, {"intent": intent_id, "ttl": seconds + WAITER_GRACE_SECONDS})
        waiter_id, status = cursor.fetchone()
    _release_connection()
    return waiter_id, status


def _unregister(waiter_id: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(_UNREGISTER, {"id": waiter_id, "grace": WAITER_GRACE_SECONDS})


def _current_status(intent_id: uuid.UUID) -> str | None:
    """The intent's status read with Django's connection, which is then closed again (outside a
    transaction), so the waiting request holds no database connection."""
    status = selectors.intent_status(intent_id=intent_id)
    _release_connection()
    return status


def _release_connection() -> None:
    connection = connections[DEFAULT_DB_ALIAS]
    # Inside an atomic block (ATOMIC_REQUESTS, a test's transaction) closing would break the
    # transaction; the API runs in autocommit, where this is always taken.
    if not connection.in_atomic_block:
        connection.close()


_slots: threading.BoundedSemaphore | None = None
_slots_lock = threading.Lock()


def _wait_slots() -> threading.BoundedSemaphore:
    """This process's semaphore of ``EFFECT_LEDGER["WAIT_SLOTS"]`` waiting requests."""
    global _slots
    with _slots_lock:
        if _slots is None:
            _slots = threading.BoundedSemaphore(settings.EFFECT_LEDGER["WAIT_SLOTS"])
        return _slots


def wait_for_status_change(
    *, intent_id: uuid.UUID, status: str, seconds: float, listener: StatusListener | None = None
) -> bool | None:
    """Block until the intent's status is no longer ``status``, or ``seconds`` have passed.

    Returns at once when the intent is settled (``SETTLED_STATUSES``: terminal, or SUCCEEDED)
    or already not in ``status``, and without waiting (None) when this process already has
    ``EFFECT_LEDGER["WAIT_SLOTS"]`` requests waiting: a waiting request holds a web thread, and
    the threads beyond the slots stay free for every other request (the console, ``/healthz``),
    whoever waits. Holds no transaction and no Django connection while blocked; the
    caller re-reads the intent afterwards with Django's connection (which reconnects). Call it
    outside any transaction (the API's detail view is ``non_atomic_requests``): the registering
    statement's share lock on the intent's row lasts until its transaction ends.

    Args:
        intent_id: the intent, already checked to be visible to the caller.
        status: an ``Intent.Status`` value: wait while the intent is in it.
        seconds: the longest wait, 0 < seconds <= ``MAX_WAIT_SECONDS``.
        listener: the process's ``status_listener()`` unless given (tests).

    Returns:
        True when the status read last differs from ``status``, False when it did not change
        (the wait ran out, or the intent is settled in ``status``), None when no slot was free.
    """
    slots = _wait_slots()
    if not slots.acquire(blocking=False):
        return None
    try:
        return _wait(intent_id=intent_id, status=status, seconds=seconds, listener=listener)
    finally:
        slots.release()


def _wait(*, intent_id: uuid.UUID, status: str, seconds: float, listener: StatusListener | None) -> bool:
    deadline = time.monotonic() + seconds
    listener = listener or status_listener()
    # Register first, then read: a notification after the registration sets the event, one before
    # it is already visible to the read. Nothing is lost in between.
    with listener.waiter(intent_id) as event:
        waiter_id, current = _register(intent_id, seconds)
        try:
            while True:
                if current != status:
                    return True
                if current in SETTLED_STATUSES:
                    return False
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                event.wait(remaining if listener.listening else min(remaining, FALLBACK_POLL_SECONDS))
                event.clear()
                current = _current_status(intent_id)
        finally:
            _unregister(waiter_id)


__all__ = [
    "CHANNEL",
    "FALLBACK_POLL_SECONDS",
    "MAX_WAIT_SECONDS",
    "SETTLED_STATUSES",
    "StatusListener",
    "WaitRequest",
    "listener_connection_params",
    "status_listener",
    "stop_status_listener",
    "wait_for_status_change",
    "wait_request",
]
