"""Reads behind the ledger gauges of ``/metrics`` and the dashboard."""

from __future__ import annotations

from typing import Any

from django.db import connection

from operations.access.tenants import EVERY_TENANT, TenantScope
from operations.selectors.status_counts import intent_status_counts

#: ``AND`` clause keeping the rows of a scope's tenants: parameters ``_in_scope(scope)``.
IN_SCOPE_SQL = " AND (%s OR tenant = ANY(%s))"


def _in_scope(scope: TenantScope) -> list[Any]:
    return [scope.every, sorted(scope.names)]


def ledger_gauges(*, scope: TenantScope = EVERY_TENANT) -> dict[str, Any]:
    """Counts by state, outbox backlog, the oldest UNKNOWN age and the oldest HELD age, in
    seconds (database clock), and how many HELD intents are likely duplicates waiting for a person.

    ``status_counts`` is ``intent_status_counts()`` (the open states exact, the settled ones from
    the status rollup, with its age); ``by_status`` its counts by state (None: not computed yet).

    ``outbox_pending`` and ``outbox_oldest_pending_seconds`` (how long the oldest unsent row has
    been due) are the relay's lag; ``outbox_scheduled`` counts rows whose due time has not come.
    Each query is served by a partial index; none reads the whole table.

    ``scope``: the tenants whose intents are counted (a console reader's, issue 18 item 5); the
    outbox is the relay's, shared by every tenant, and is counted only for a scope of every
    tenant (0 otherwise).
    """
    status_counts = intent_status_counts(scope=scope)
    with connection.cursor() as cursor:
        # A row waiting for its due time (a retry's backoff) is scheduled, not lag: the backlog
        # and its age count only rows that are due (shared/cases C15).
        cursor.execute(
            """
            SELECT count(*) FILTER (WHERE due_at <= statement_timestamp()),
                   count(*) FILTER (WHERE due_at > statement_timestamp()),
                   COALESCE(EXTRACT(EPOCH FROM statement_timestamp()
                            - min(due_at) FILTER (WHERE due_at <= statement_timestamp())), 0)
            FROM operations_outboxmessage WHERE sent_at IS NULL AND acked_at IS NULL AND %s
            """,
            [scope.every],
        )
        pending, scheduled, oldest = cursor.fetchone()
        cursor.execute(
            "SELECT COALESCE(EXTRACT(EPOCH FROM statement_timestamp() - min(updated_at)), 0)"
            " FROM operations_intent WHERE status = 'UNKNOWN'" + IN_SCOPE_SQL,
            _in_scope(scope),
        )
        (unknown_oldest,) = cursor.fetchone()
        # HELD from insertion (a second intent for an open business action): its age is since
        # created_at; escalated ones are likely duplicates (reconciliation.held), unless held
        # because their action or version is not served (hold_reason).
        cursor.execute(
            "SELECT COALESCE(EXTRACT(EPOCH FROM statement_timestamp() - min(created_at)), 0),"
            " count(*) FILTER (WHERE escalated_at IS NOT NULL AND hold_reason = '')"
            " FROM operations_intent WHERE status = 'HELD'" + IN_SCOPE_SQL,
            _in_scope(scope),
        )
        held_oldest, held_likely_duplicates = cursor.fetchone()
    return {
        "status_counts": status_counts,
        "by_status": status_counts.by_status,
        "outbox_pending": int(pending),
        "outbox_scheduled": int(scheduled),
        "outbox_oldest_pending_seconds": float(oldest),
        "unknown_oldest_seconds": float(unknown_oldest),
        "held_oldest_seconds": float(held_oldest),
        "held_likely_duplicates": int(held_likely_duplicates),
    }


#: Age buckets (UNKNOWN and HELD intents), the one definition for ``/metrics`` and the dashboard:
#: (metric label, label for people, lower bound, upper bound or None), bounds in seconds.
UNKNOWN_AGE_BUCKETS: tuple[tuple[str, str, int, int | None], ...] = (
    ("lt_1m", "under 1 minute", 0, 60),
    ("lt_5m", "1 to 5 minutes", 60, 300),
    ("lt_1h", "5 to 60 minutes", 300, 3600),
    ("lt_24h", "1 to 24 hours", 3600, 86400),
    ("ge_24h", "over 24 hours", 86400, None),
)


def _age_buckets(status: str, since: str, scope: TenantScope = EVERY_TENANT) -> dict[str, int]:
    """Intents in ``status`` counted by seconds since their ``since`` column (database clock),
    by metric label (``UNKNOWN_AGE_BUCKETS``); one query over that status's partial index."""
    filters = ", ".join(
        f"count(*) FILTER (WHERE age >= {low}" + (f" AND age < {high})" if high is not None else ")")
        for _, _, low, high in UNKNOWN_AGE_BUCKETS
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {filters} FROM ("  # noqa: S608 - the bounds and the column are constants of this module
            f" SELECT EXTRACT(EPOCH FROM statement_timestamp() - {since}) AS age"
            " FROM operations_intent WHERE status = %s" + IN_SCOPE_SQL + ") AS aged",
            [status, *_in_scope(scope)],
        )
        row = cursor.fetchone()
    return {label: int(count) for (label, _, _, _), count in zip(UNKNOWN_AGE_BUCKETS, row, strict=True)}


def unknown_age_buckets() -> dict[str, int]:
    """UNKNOWN intents counted by how long they have been UNKNOWN (database clock), by metric
    label (``UNKNOWN_AGE_BUCKETS``); one query over the partial index ``intent_unknown_age``."""
    return _age_buckets("UNKNOWN", "updated_at")


def held_age_buckets() -> dict[str, int]:
    """HELD intents counted by how long they have been held, since submission (database clock),
    by metric label (``UNKNOWN_AGE_BUCKETS``); one query over the partial index ``intent_held_q``."""
    return _age_buckets("HELD", "created_at")


def unknown_by_age(*, scope: TenantScope = EVERY_TENANT) -> list[tuple[str, int]]:
    """The same buckets for people, for the intents of ``scope``'s tenants:
    ``[("under 1 minute", n), ...]``, youngest first."""
    counts = _age_buckets("UNKNOWN", "updated_at", scope)
    return [(human, counts[label]) for label, human, _, _ in UNKNOWN_AGE_BUCKETS]
