"""The reservations product: no idempotency keys, no lookup by key, list by our reference.

Every ``POST /v1/reservations`` books a new reservation (a retry after a lost response books
twice); ``GET /v1/reservations?reference=R`` lists them, withdrawn ones silently omitted (so an
empty list proves nothing); ``POST /v1/reservations/{id}/cancel`` is idempotent.
"""

from __future__ import annotations

from typing import Any

from console.lab.sandbox_provider.events import event_data
from console.lab.sandbox_provider.replies import (
    Reply,
    RequestContext,
    error_reply,
    field_of,
    only_fields,
    positive_int,
)
from console.lab.sandbox_provider.store import Pool, new_id


def _reservation_json(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "object": "reservation",
        "resource": row["resource"],
        "start": row["start"],
        "seats": row["seats"],
        "reference": row["reference"],
        "status": row["status"],
        "created": row["created_at"].isoformat(),
        "cancelled": row["cancelled_at"].isoformat() if row["cancelled_at"] else None,
    }


def _reservation_event(row: dict[str, Any]) -> dict[str, Any]:
    return event_data("reservation", row["id"], status=row["status"], reference=row["reference"])


def create_reservation(pool: Pool, ctx: RequestContext, body: dict[str, Any]) -> Reply:
    """``POST /v1/reservations`` ``{resource, start, seats, reference}`` → 200 reservation
    (status ``confirmed``), a new one on every call.

    Raises:
        BadRequest: a field is missing or mistyped.
    """
    only_fields(body, {"resource", "start", "seats", "reference"})
    resource, start = field_of(body, "resource", str), field_of(body, "start", str)
    seats, reference = positive_int(body, "seats"), field_of(body, "reference", str)
    ctx.before_apply()
    with pool.connection() as conn, conn.transaction():
        row = conn.execute(
            "INSERT INTO sandbox.reservations (id, resource, start, seats, reference)"
            " VALUES (%s, %s, %s, %s, %s) RETURNING *",
            [new_id("rsv"), resource, start, seats, reference],
        ).fetchone()
        assert row is not None
        ctx.emit(conn, [("reservation.created", _reservation_event(row))])
    return Reply(200, _reservation_json(row))


def cancel_reservation(pool: Pool, ctx: RequestContext, reservation_id: str) -> Reply:
    """``POST /v1/reservations/{id}/cancel`` → 200 reservation with status ``cancelled``
    (cancelling a cancelled one returns it unchanged); 404 unknown; 410 withdrawn."""
    ctx.before_apply()
    with pool.connection() as conn, conn.transaction():
        row = conn.execute(
            "SELECT * FROM sandbox.reservations WHERE id = %s FOR UPDATE", [reservation_id]
        ).fetchone()
        if row is None:
            return error_reply(404, "resource_missing", f"No such reservation: {reservation_id!r}")
        if row["withdrawn_at"] is not None:
            return error_reply(
                410, "resource_withdrawn", f"The reservation {reservation_id!r} was withdrawn."
            )
        if row["status"] != "cancelled":
            row = conn.execute(
                "UPDATE sandbox.reservations SET status = 'cancelled', cancelled_at = clock_timestamp()"
                " WHERE id = %s RETURNING *",
                [reservation_id],
            ).fetchone()
            assert row is not None
            ctx.emit(conn, [("reservation.cancelled", _reservation_event(row))])
    return Reply(200, _reservation_json(row))


def get_reservation(pool: Pool, reservation_id: str) -> Reply:
    """``GET /v1/reservations/{id}`` → 200 reservation, 404 unknown, 410 withdrawn."""
    with pool.connection() as conn:
        row = conn.execute("SELECT * FROM sandbox.reservations WHERE id = %s", [reservation_id]).fetchone()
    if row is None:
        return error_reply(404, "resource_missing", f"No such reservation: {reservation_id!r}")
    if row["withdrawn_at"] is not None:
        return error_reply(410, "resource_withdrawn", f"The reservation {reservation_id!r} was withdrawn.")
    return Reply(200, _reservation_json(row))


def list_reservations(pool: Pool, *, reference: str | None) -> Reply:
    """``GET /v1/reservations?reference=R`` → ``{"object": "list", "data": [...]}``, oldest
    first, cancelled ones included with their status, withdrawn ones omitted."""
    sql, params = "SELECT * FROM sandbox.reservations WHERE withdrawn_at IS NULL", []
    if reference is not None:
        sql += " AND reference = %s"
        params.append(reference)
    with pool.connection() as conn:
        rows = conn.execute(sql + " ORDER BY created_at LIMIT 100", params).fetchall()
    return Reply(200, {"object": "list", "data": [_reservation_json(r) for r in rows]})
