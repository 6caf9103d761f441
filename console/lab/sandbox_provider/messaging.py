"""The email product: no idempotency keys, an eventually consistent lookup by Message-ID.

Every ``POST /v1/emails`` sends a new email, duplicates included (that is the point: a client
that retries after a lost response sends twice). ``GET /v1/emails?message_id=M`` only shows
emails older than the lookup lag, like a search index that trails the mail log; when every
matching email past the lag was withdrawn it answers 410, so a reader can tell "withdrawn" from
"not (yet) seen".
"""

from __future__ import annotations

import threading
from typing import Any

from console.lab.sandbox_provider.events import event_data
from console.lab.sandbox_provider.replies import (
    BadRequest,
    Reply,
    RequestContext,
    error_reply,
    field_of,
    only_fields,
)
from console.lab.sandbox_provider.store import Pool, new_id


class EmailSettings:
    """The email lookup lag in seconds, changeable at runtime (``POST /_sandbox/config``)."""

    def __init__(self, lookup_lag_seconds: float = 0.0) -> None:
        self._lock = threading.Lock()
        self._lag = lookup_lag_seconds

    @property
    def lookup_lag_seconds(self) -> float:
        """Seconds an email stays invisible to ``GET /v1/emails?message_id=``."""
        with self._lock:
            return self._lag

    @lookup_lag_seconds.setter
    def lookup_lag_seconds(self, value: float) -> None:
        with self._lock:
            self._lag = value


def _email_json(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "object": "email",
        "message_id": row["message_id"],
        "to": row["recipient"],
        "subject": row["subject"],
        "reference": row["reference"],
        "status": row["status"],
        "created": row["created_at"].isoformat(),
    }


def _email_event(row: dict[str, Any], status: str) -> dict[str, Any]:
    return event_data(
        "email", row["id"], status=status, reference=row["reference"], message_id=row["message_id"]
    )


def send_email(pool: Pool, ctx: RequestContext, body: dict[str, Any]) -> Reply:
    """``POST /v1/emails`` ``{to, subject, body, reference?}`` with header ``Message-ID`` → 200
    email (a new one on every call). Without ``Message-ID`` the provider makes one up.

    Raises:
        BadRequest: a field is missing or mistyped.
    """
    only_fields(body, {"to", "subject", "body", "reference"})
    to = field_of(body, "to", str)
    if "@" not in to:
        raise BadRequest("to must be an email address", param="to")
    subject, text = field_of(body, "subject", str), field_of(body, "body", str)
    reference = field_of(body, "reference", str, required=False)
    email_id = new_id("em")
    message_id = ctx.headers.get("message-id", "").strip() or f"<{email_id}@sandbox.local>"
    ctx.before_apply()
    with pool.connection() as conn, conn.transaction():
        row = conn.execute(
            "INSERT INTO sandbox.emails (id, message_id, recipient, subject, body, reference)"
            " VALUES (%s, %s, %s, %s, %s, %s) RETURNING *",
            [email_id, message_id, to, subject, text, reference],
        ).fetchone()
        assert row is not None
        ctx.emit(
            conn,
            [("email.sent", _email_event(row, "sent")), ("email.delivered", _email_event(row, "delivered"))],
        )
    return Reply(200, _email_json(row))


def get_email(pool: Pool, email_id: str) -> Reply:
    """``GET /v1/emails/{id}`` → 200 email, 404 unknown, 410 withdrawn (no lag on this path)."""
    with pool.connection() as conn:
        row = conn.execute("SELECT * FROM sandbox.emails WHERE id = %s", [email_id]).fetchone()
    if row is None:
        return error_reply(404, "resource_missing", f"No such email: {email_id!r}")
    if row["withdrawn_at"] is not None:
        return error_reply(410, "resource_withdrawn", f"The email {email_id!r} was withdrawn.")
    return Reply(200, _email_json(row))


def list_emails(pool: Pool, settings: EmailSettings, *, message_id: str | None) -> Reply:
    """``GET /v1/emails?message_id=M`` → ``{"object": "list", "data": [...]}`` with the emails
    older than the lookup lag, withdrawn ones omitted; 410 ``resource_withdrawn`` when
    ``message_id`` is given and every matching email past the lag was withdrawn.
    """
    sql = "SELECT * FROM sandbox.emails WHERE created_at <= clock_timestamp() - make_interval(secs => %s)"
    params: list[Any] = [settings.lookup_lag_seconds]
    if message_id is not None:
        sql += " AND message_id = %s"
        params.append(message_id)
    with pool.connection() as conn:
        rows = conn.execute(sql + " ORDER BY created_at LIMIT 100", params).fetchall()
    visible = [r for r in rows if r["withdrawn_at"] is None]
    if message_id is not None and rows and not visible:
        return error_reply(
            410, "resource_withdrawn", f"Every email with Message-ID {message_id} was withdrawn."
        )
    return Reply(200, {"object": "list", "data": [_email_json(r) for r in visible]})
