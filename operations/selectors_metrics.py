"""Reads behind the ledger gauges of ``/metrics`` and the dashboard."""

from __future__ import annotations

from typing import Any

from django.db import connection

from operations.models import Intent


def ledger_gauges() -> dict[str, Any]:
    """Counts by state, outbox backlog and the oldest UNKNOWN age, in seconds (database clock).

    Each query is served by an index (the status index or a partial queue index).
    """
    by_status = {status.value: 0 for status in Intent.Status}
    with connection.cursor() as cursor:
        cursor.execute("SELECT status, count(*) FROM operations_intent GROUP BY status")
        for status, count in cursor.fetchall():
            by_status[status] = count
        cursor.execute(
            "SELECT count(*), COALESCE(EXTRACT(EPOCH FROM statement_timestamp() - min(created_at)), 0)"
            " FROM operations_outboxmessage WHERE sent_at IS NULL"
        )
        pending, oldest = cursor.fetchone()
        cursor.execute(
            "SELECT COALESCE(EXTRACT(EPOCH FROM statement_timestamp() - min(updated_at)), 0)"
            " FROM operations_intent WHERE status = 'UNKNOWN'"
        )
        (unknown_oldest,) = cursor.fetchone()
    return {
        "by_status": by_status,
        "outbox_pending": int(pending),
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
