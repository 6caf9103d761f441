"""Storage of the events the sandbox provider sends to the ledger (table ``sandbox.events``,
used by ``events.py``): written in the effect's transaction, claimed when due, one row per event
with its delivery state.
"""

from __future__ import annotations

import json
from typing import Any

from psycopg import Connection
from psycopg.rows import DictRow

from console.lab.sandbox_provider.store import Pool

#: Seconds a claimed event stays out of other senders' reach while it is being sent; a sender
#: that dies mid-send leaves it pending, due again after this.
EVENT_CLAIM_SECONDS = 30.0


def insert_event(
    conn: Connection[DictRow],
    *,
    event_id: str,
    source: str,
    event_type: str,
    object_id: str,
    body: str,
    state: str,
    copies: int,
    send_order: int,
    delay_seconds: float,
) -> None:
    """Store one event to send, on ``conn`` (inside the effect's transaction).

    Args:
        body: the exact JSON text to POST.
        state: ``pending`` (to send) or ``lost`` (the loss fault: never sent unless redelivered).
        copies: how many successful deliveries to make (1 + the duplicates fault).
        send_order: tie-break among events due at the same time (the reorder fault reverses it).
        delay_seconds: the lag fault; the first attempt is not before ``now() + delay``.
    """
    conn.execute(
        "INSERT INTO sandbox.events (id, source, type, object_id, body, state, copies, send_order,"
        " next_attempt_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, now() + make_interval(secs => %s))",
        [event_id, source, event_type, object_id, body, state, copies, send_order, delay_seconds],
    )


def claim_due_events(pool: Pool, *, limit: int = 20) -> list[dict[str, Any]]:
    """Claim up to ``limit`` pending events whose time has come, in sending order.

    Claiming pushes ``next_attempt_at`` ``EVENT_CLAIM_SECONDS`` ahead (``FOR UPDATE SKIP LOCKED``:
    two senders on one database never claim the same event at once); ``record_attempt`` then
    sets the real next time.

    Returns:
        rows of ``sandbox.events``, ordered by due time, then ``send_order``, then creation.
    """
    with pool.connection() as conn:
        rows = conn.execute(
            "WITH due AS (SELECT seq, next_attempt_at AS due_at FROM sandbox.events"
            "  WHERE state = 'pending' AND next_attempt_at <= clock_timestamp()"
            "  ORDER BY next_attempt_at, send_order, seq LIMIT %s FOR UPDATE SKIP LOCKED)"
            " UPDATE sandbox.events e SET next_attempt_at = clock_timestamp() + make_interval(secs => %s)"
            " FROM due WHERE e.seq = due.seq RETURNING e.*, due.due_at",
            [limit, EVENT_CLAIM_SECONDS],
        ).fetchall()
    return sorted(rows, key=lambda r: (r["due_at"], r["send_order"], r["seq"]))


def claim_event_for_redelivery(pool: Pool, event_id: str) -> dict[str, Any] | None:
    """Make event ``event_id`` owe one more delivery and claim it for sending now.

    Returns:
        its row, or ``None`` when no such event exists.
    """
    with pool.connection() as conn:
        row: dict[str, Any] | None = conn.execute(
            "UPDATE sandbox.events SET state = 'pending', copies = delivered + 1,"
            " next_attempt_at = clock_timestamp() + make_interval(secs => %s) WHERE id = %s RETURNING *",
            [EVENT_CLAIM_SECONDS, event_id],
        ).fetchone()
    return row


def record_attempt(
    pool: Pool,
    seq: int,
    *,
    status: int | None,
    error: str | None,
    retry_in_seconds: float,
    give_up_after_seconds: float,
) -> None:
    """Record one delivery attempt of event ``seq``.

    A 2xx ``status`` counts a delivery; the event is ``delivered`` once it has its ``copies``,
    else it is due again at once (the duplicates fault). Anything else (another status, or
    ``status`` ``None`` with ``error`` when unreachable) makes it due again in
    ``retry_in_seconds``, or ``failed`` when it is older than ``give_up_after_seconds``.
    """
    ok = status is not None and 200 <= status < 300
    with pool.connection() as conn:
        if ok:
            conn.execute(
                "UPDATE sandbox.events SET attempts = attempts + 1, delivered = delivered + 1,"
                " last_attempt_at = clock_timestamp(), last_status = %s, last_error = NULL,"
                " delivered_at = clock_timestamp(),"
                " state = CASE WHEN delivered + 1 >= copies THEN 'delivered' ELSE 'pending' END,"
                " next_attempt_at = clock_timestamp() WHERE seq = %s",
                [status, seq],
            )
        else:
            conn.execute(
                "UPDATE sandbox.events SET attempts = attempts + 1, last_attempt_at = clock_timestamp(),"
                " last_status = %s, last_error = %s,"
                " state = CASE WHEN created_at < clock_timestamp() - make_interval(secs => %s)"
                "   THEN 'failed' ELSE 'pending' END,"
                " next_attempt_at = clock_timestamp() + make_interval(secs => %s) WHERE seq = %s",
                [status, error, give_up_after_seconds, retry_in_seconds, seq],
            )


def list_events(
    pool: Pool, *, source: str | None = None, event_type: str | None = None
) -> list[dict[str, Any]]:
    """Every event generated since the last reset, oldest first, with its delivery state.

    Returns:
        ``[{id, source, type, object_id, state, copies, delivered, attempts, last_status,
        last_error, created, next_attempt_at, last_attempt_at, delivered_at, body}]``: ``body``
        is the JSON object sent, times are ISO 8601 text.
    """
    sql, params = "SELECT * FROM sandbox.events WHERE TRUE", []
    if source:
        sql += " AND source = %s"
        params.append(source)
    if event_type:
        sql += " AND type = %s"
        params.append(event_type)
    with pool.connection() as conn:
        rows = conn.execute(sql + " ORDER BY seq", params).fetchall()
    events = []
    for row in rows:
        events.append(
            {
                "id": row["id"],
                "source": row["source"],
                "type": row["type"],
                "object_id": row["object_id"],
                "state": row["state"],
                "copies": row["copies"],
                "delivered": row["delivered"],
                "attempts": row["attempts"],
                "last_status": row["last_status"],
                "last_error": row["last_error"],
                "created": row["created_at"].isoformat(),
                "next_attempt_at": row["next_attempt_at"].isoformat(),
                "last_attempt_at": row["last_attempt_at"].isoformat() if row["last_attempt_at"] else None,
                "delivered_at": row["delivered_at"].isoformat() if row["delivered_at"] else None,
                "body": json.loads(row["body"]),
            }
        )
    return events
