"""Reads behind the ledger gauges of ``/metrics`` and the dashboard."""

from __future__ import annotations

from typing import Any

from django.db import connection

from operations.models import Intent


def ledger_gauges() -> dict[str, Any]:
    """Counts by state, outbox backlog and the oldest UNKNOWN age, in seconds (database clock).

    ``outbox_pending`` and ``outbox_oldest_pending_seconds`` (how long the oldest unsent row has
    been due) are the relay's lag; ``outbox_scheduled`` counts rows whose due time has not come.
    Each query is served by an index (the status index or a partial queue index).
    """
    by_status = {status.value: 0 for status in Intent.Status}
    with connection.cursor() as cursor:
        cursor.execute("SELECT status, count(*) FROM operations_intent GROUP BY status")
        for status, count in cursor.fetchall():
            by_status[status] = count
        # A row waiting for its due time (a retry's backoff) is scheduled, not lag: the backlog
        # and its age count only rows that are due (shared/cases C15).
        cursor.execute(
            """
            SELECT count(*) FILTER (WHERE due_at <= statement_timestamp()),
                   count(*) FILTER (WHERE due_at > statement_timestamp()),
                   COALESCE(EXTRACT(EPOCH FROM statement_timestamp()
                            - min(due_at) FILTER (WHERE due_at <= statement_timestamp())), 0)
            FROM operations_outboxmessage WHERE sent_at IS NULL
            """
        )
        pending, scheduled, oldest = cursor.fetchone()
        cursor.execute(
            "SELECT COALESCE(EXTRACT(EPOCH FROM statement_timestamp() - min(updated_at)), 0)"
            " FROM operations_intent WHERE status = 'UNKNOWN'"
        )
        (unknown_oldest,) = cursor.fetchone()
    return {
        "by_status": by_status,
        "outbox_pending": int(pending),
        "outbox_scheduled": int(scheduled),
        "outbox_oldest_pending_seconds": float(oldest),
        "unknown_oldest_seconds": float(unknown_oldest),
    }


#: UNKNOWN age buckets for metrics and the dashboard: (label, upper bound in seconds or None).
UNKNOWN_AGE_BUCKETS: tuple[tuple[str, int | None], ...] = (
    ("lt_1m", 60),
    ("lt_10m", 600),
    ("lt_1h", 3600),
    ("ge_1h", None),
)


def unknown_age_buckets() -> dict[str, int]:
    """UNKNOWN intents counted by how long they have been UNKNOWN (database clock); one query
    over the partial index ``intent_unknown_age``."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT
                count(*) FILTER (WHERE age < 60),
                count(*) FILTER (WHERE age >= 60 AND age < 600),
                count(*) FILTER (WHERE age >= 600 AND age < 3600),
                count(*) FILTER (WHERE age >= 3600)
            FROM (
                SELECT EXTRACT(EPOCH FROM statement_timestamp() - updated_at) AS age
                FROM operations_intent WHERE status = 'UNKNOWN'
            ) AS unknown
            """
        )
        row = cursor.fetchone()
    return {label: int(count) for (label, _), count in zip(UNKNOWN_AGE_BUCKETS, row, strict=True)}
