"""One archived intent as a record (a line of a segment file; docs/reference/archive-format.md):
``{"intent": {...}, "audit_events": [...], "rows": {table: [...]}}``.

Read in bulk, a few statements per batch of intents whatever its size: every row as PostgreSQL's
``to_jsonb`` renders it (times ISO 8601 with offset, ``bytea`` as ``\\x`` hex), and the audit
events exactly as hashed (``operations.audit.chain_checks.export_line``), so the chain verifies
from the file alone.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connection

from operations.audit.chain_checks import export_line
from operations.models import AuditEvent, Intent, NotificationDelivery, Outcome

#: Statement lines matched to an intent: copied to its record, and kept live with their statement
#: run (their link cleared). Named, not imported: the ledger does not import reconciliation.
STATEMENT_LINES = "reconciliation_statementline"

#: Every table with a column ``intent_id`` pointing at the archived intent, written to
#: ``rows`` and deleted with it, children before the rows they point at (an outcome points at an
#: attempt, a provider finding at a provider event). Statement lines are copied and stay live,
#: their link cleared (they belong to their statement run). ``test_archive`` checks that every
#: foreign key to ``Intent`` is here or is one the archive's eligibility rules out.
INTENT_TABLES = (
    "operations_notification",
    "operations_outboxmessage",
    "operations_webhookdelivery",
    "operations_approval",
    "operations_reservation",
    "operations_outcome",
    "operations_attempt",
    "reconciliation_evidence",
    "reconciliation_duplicatefinding",
    "reconciliation_providerfinding",
    "reconciliation_providerevent",
    STATEMENT_LINES,
)
#: Rows that point at the intent through another row: (table, via column, parent table).
NESTED_TABLES = ((NotificationDelivery._meta.db_table, "notification_id", "operations_notification"),)


def _rows_by_intent(sql: str, ids: list[uuid.UUID]) -> dict[str, list[Any]]:
    grouped: dict[str, list[Any]] = defaultdict(list)
    with connection.cursor() as cursor:
        cursor.execute(sql, [ids])
        for intent_id, row in cursor.fetchall():
            # Django has psycopg hand jsonb over as text (its JSONField decodes it).
            grouped[str(intent_id)].append(json.loads(row) if isinstance(row, str) else row)
    return grouped


def records_read(ids: Sequence[uuid.UUID]) -> list[dict[str, Any]]:
    """The records of the intents ``ids`` (those that exist), in the order of ``ids``. About 16
    statements per call, whatever the number of intents."""
    ids = list(ids)
    intents = _rows_by_intent(
        f"SELECT id, to_jsonb(i) FROM {Intent._meta.db_table} i WHERE id = ANY(%s)", ids
    )
    tables = {
        table: _rows_by_intent(
            f"SELECT intent_id, to_jsonb(t) FROM {table} t WHERE intent_id = ANY(%s) ORDER BY id", ids
        )
        for table in INTENT_TABLES
    }
    for table, via, parent in NESTED_TABLES:
        tables[table] = _rows_by_intent(
            f"SELECT p.intent_id, to_jsonb(t) FROM {table} t JOIN {parent} p ON p.id = t.{via} "
            "WHERE p.intent_id = ANY(%s) ORDER BY t.id",
            ids,
        )
    events: dict[str, list[Any]] = defaultdict(list)
    for event in AuditEvent.objects.filter(intent_id__in=ids).order_by("intent_id", "seq").iterator(2000):
        events[str(event.intent_id)].append(json.loads(export_line(event)))
    records = []
    for intent_id in map(str, ids):
        if intent_id not in intents:
            continue
        records.append(
            {
                "intent": intents[intent_id][0],
                "audit_events": events.get(intent_id, []),
                "rows": {
                    table: by_intent[intent_id]
                    for table, by_intent in tables.items()
                    if intent_id in by_intent
                },
            }
        )
    return records


def head_of(record: dict[str, Any]) -> tuple[int, str]:
    """The record's chain head: (seq, hash) of its last audit event; (0, 64 zeros) for none."""
    events = record["audit_events"]
    return (events[-1]["seq"], events[-1]["hash"]) if events else (0, "0" * 64)


def intent_of(record: dict[str, Any]) -> Intent:
    """The record's intent as an unsaved ``Intent`` (for rendering; never saved)."""
    row = record["intent"]
    fields = {field.attname: field for field in Intent._meta.concrete_fields}
    return Intent(**{name: fields[name].to_python(value) for name, value in row.items() if name in fields})


#: The intent's columns the API's answer shows or decides by (``IntentDetailSerializer``): the
#: rest of the row (its policy snapshot, leases, schedules) stays in the file only.
ANSWER_COLUMNS = (
    "id", "tenant", "principal", "action", "action_version", "arguments", "request_hash",
    "fingerprint_version", "reference", "metadata", "status", "held_behind_id", "hold_reason",
    "escalated_at", "attempt_count", "approval_expires_at", "last_error", "created_at", "updated_at",
)  # fmt: skip
#: The outcome's columns the answer shows (``OutcomeSerializer``) and orders by.
ANSWER_OUTCOME_COLUMNS = ("id", "source", "provider_reference", "response_digest", "created_at")
ANSWER_EVENT_COLUMNS = ("seq", "event", "from_status", "to_status", "actor", "reason", "data", "created_at")


def _last(rows: list[dict[str, Any]], keep: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    kept = [row for row in rows if keep(row)]
    return kept[-1:]


def answer_record(record: dict[str, Any]) -> dict[str, Any]:
    """What the API's answer for the archived intent is made of, kept in its ``ArchivedIntent``
    row (``answer``) so a replay needs no file, and small (a few hundred bytes): the intent's
    ``ANSWER_COLUMNS``, its newest outcome, and the two audit events the answer can show, the
    newest likely-duplicate finding (``intent_likely_duplicate``) and the newest decision a
    person made (``intent_latest_decision``). ``operations.api.archived`` renders it."""
    events = record["audit_events"]
    outcomes = sorted(
        record["rows"].get(Outcome._meta.db_table, []), key=lambda row: (row["created_at"], row["id"])
    )
    chosen = _last(events, lambda event: event["event"] == "likely_duplicate") + _last(
        events, lambda event: bool(event["actor"].startswith("user:") and event["to_status"])
    )
    return {
        "intent": {name: record["intent"][name] for name in ANSWER_COLUMNS if name in record["intent"]},
        "audit_events": sorted(
            ({name: event[name] for name in ANSWER_EVENT_COLUMNS} for event in chosen), key=lambda e: e["seq"]
        ),
        "rows": {
            Outcome._meta.db_table: [
                {name: row[name] for name in ANSWER_OUTCOME_COLUMNS} for row in outcomes[-1:]
            ]
        },
    }


def outcomes_of(record: dict[str, Any]) -> list[Outcome]:
    """The record's outcomes as unsaved ``Outcome`` rows, oldest first."""
    fields = {field.attname: field for field in Outcome._meta.concrete_fields}
    return [
        Outcome(**{name: fields[name].to_python(value) for name, value in row.items() if name in fields})
        for row in record["rows"].get(Outcome._meta.db_table, [])
    ]


def _aggregate(source: str) -> str:
    return f"md5(coalesce((SELECT string_agg(to_jsonb(t)::text, ',' ORDER BY t.id) {source}), ''))"


def _digest_sql() -> str:
    parts = ["md5(to_jsonb(i)::text)"]
    parts += [_aggregate(f"FROM {table} t WHERE t.intent_id = i.id") for table in INTENT_TABLES]
    parts += [
        _aggregate(f"FROM {table} t JOIN {parent} p ON p.id = t.{via} WHERE p.intent_id = i.id")
        for table, via, parent in NESTED_TABLES
    ]
    parts.append(
        "md5(coalesce((SELECT string_agg(e.seq::text || ':' || e.hash, ',' ORDER BY e.seq) "
        f"FROM {AuditEvent._meta.db_table} e WHERE e.intent_id = i.id), ''))"
    )
    return f"SELECT i.id, md5({' || '.join(parts)}) FROM {Intent._meta.db_table} i WHERE i.id = ANY(%s)"


#: One md5 per intent over its row, every row about it (``INTENT_TABLES``, ``NESTED_TABLES``) and
#: its chain's (seq, hash): taken when the record is written and again, under the intent's row
#: lock, right before its rows are deleted. Any change in between (a late provider event, a
#: webhook delivered, a compensation) changes it, and the rows are kept (the record is
#: ``superseded``): nothing is deleted that the file does not hold.
ROWS_DIGEST_SQL = _digest_sql()


def rows_digests(ids: Sequence[uuid.UUID]) -> dict[str, str]:
    """``{intent_id: md5 hex}`` (``ROWS_DIGEST_SQL``) for those of ``ids`` that exist."""
    with connection.cursor() as cursor:
        cursor.execute(ROWS_DIGEST_SQL, [list(ids)])
        return {str(intent_id): digest for intent_id, digest in cursor.fetchall()}
