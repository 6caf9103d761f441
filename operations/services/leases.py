"""Named leases in the ``operations_lease`` table: "one at a time" that survives a connection
pooler in transaction mode (DESIGN.md, "Topology": no session state in the database connection).

A PostgreSQL *session* advisory lock (``pg_advisory_lock`` ... ``pg_advisory_unlock`` in two
statements) belongs to the server connection; behind PgBouncer in transaction mode the unlock
may run on another one and the lock stays on a pooled connection for ever. A lease is a row
instead: claimed with one ``INSERT .. ON CONFLICT DO UPDATE .. WHERE expires_at < now()``,
released by deleting it, and taken over by the next claimant once it expired (its holder died).
Each statement is its own short transaction with ``lock_timeout`` set, so no call waits for ever.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction

from operations.models import Lease

#: Longest a lease statement waits for a row lock held by a concurrent claim (milliseconds).
LOCK_TIMEOUT_MS = 5000

_CLAIM = f"""
    INSERT INTO {Lease._meta.db_table} AS lease (name, holder, expires_at)
    VALUES (%(name)s, %(holder)s, statement_timestamp() + make_interval(secs => %(ttl)s))
    ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
    WHERE lease.expires_at < statement_timestamp()
    RETURNING holder
"""

_RENEW = f"""
    UPDATE {Lease._meta.db_table}
    SET expires_at = statement_timestamp() + make_interval(secs => %(ttl)s)
    WHERE name = %(name)s AND holder = %(holder)s
"""


@dataclass(frozen=True)
class HeldLease:
    """A lease this process holds: its ``name`` and the ``holder`` token that proves it."""

    name: str
    holder: str


def _check(name: str, ttl_seconds: float) -> None:
    if not name or len(name) > 600:
        raise ValueError(f"a lease name is 1 to 600 characters; got {len(name)}")
    if not (0 < ttl_seconds < 7 * 86400):
        raise ValueError(f"a lease lasts more than 0 and less than 7 days (seconds); got {ttl_seconds!r}")


def _execute(sql: str, params: dict[str, str | float]) -> list[tuple[Any, ...]]:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = {int(LOCK_TIMEOUT_MS)}")
        cursor.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description else [(cursor.rowcount,)]


def lease_try_acquire(*, name: str, ttl_seconds: float) -> HeldLease | None:
    """Claim the lease ``name`` for ``ttl_seconds`` (database clock) unless somebody holds an
    unexpired claim. Returns the held lease, or None when it is held. One statement.

    Raises:
        ValueError: an empty name or one longer than 600 characters, or a ttl not in (0, 7 days).
        django.db.OperationalError: the row lock was not granted within ``LOCK_TIMEOUT_MS``.
    """
    _check(name, ttl_seconds)
    holder = secrets.token_hex(16)
    rows = _execute(_CLAIM, {"name": name, "holder": holder, "ttl": float(ttl_seconds)})
    return HeldLease(name, holder) if rows else None


def lease_acquire(
    *, name: str, ttl_seconds: float, wait_seconds: float, poll_seconds: float = 0.05
) -> HeldLease | None:
    """Claim the lease ``name``, re-trying every ``poll_seconds`` for at most ``wait_seconds``
    while somebody else holds it. No connection or transaction is held between tries. Returns
    None when the wait ran out (never waits longer).

    Raises:
        ValueError: as ``lease_try_acquire``, or a negative ``wait_seconds``/``poll_seconds``.
    """
    if wait_seconds < 0 or poll_seconds <= 0:
        raise ValueError("wait_seconds must be >= 0 and poll_seconds > 0")
    deadline = time.monotonic() + wait_seconds
    while True:
        held = lease_try_acquire(name=name, ttl_seconds=ttl_seconds)
        if held is not None or time.monotonic() >= deadline:
            return held
        time.sleep(min(poll_seconds, max(0.0, deadline - time.monotonic())))


def lease_renew(lease: HeldLease, *, ttl_seconds: float) -> bool:
    """Extend ``lease`` to ``ttl_seconds`` from now. False: it was lost (it expired and
    somebody took it over, or it was released)."""
    _check(lease.name, ttl_seconds)
    ((count,),) = _execute(_RENEW, {"name": lease.name, "holder": lease.holder, "ttl": float(ttl_seconds)})
    return bool(count)


def lease_release(lease: HeldLease) -> bool:
    """Release ``lease`` (delete its row if this claim still holds it). False: it had been
    taken over after it expired, and the new holder keeps it."""
    return bool(Lease.objects.filter(name=lease.name, holder=lease.holder).delete()[0])
