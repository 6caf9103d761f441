"""Bulk-load intents with everything the real write path leaves about them, with ``COPY``
(psycopg 3 ``cursor.copy``).

Rows are synthetic but shaped like the real ones (``console.lab.bench.shapes``): each
``payments.charge`` intent has the outbox message, attempt, outcome and hash-chained audit
events of the state it reached, so the tables grow as the ledger's do, ``verify_audit`` finds
every chain intact and the archiver can take the settled ones. Intents of two tenants are spread
evenly over a time window, across states (``STATE_MIX``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.utils import timezone

from console.lab.bench.shapes import IntentRows, Load, intent_rows
from operations.idempotency import canonical_json, sha256_hex
from operations.models import Attempt, AuditEvent, Intent, OutboxMessage, Outcome
from operations.policies.rules import policy_for

#: States per 1,000 intents of the console data set (the rest SUCCEEDED). UNKNOWN rows are
#: loaded separately, so the reconciler phase controls how many there are.
STATE_MIX: list[tuple[str, int]] = [
    ("FAILED", 30),
    ("CANCELLED", 10),
    ("REJECTED", 10),
    ("EXPIRED", 10),
    ("COMPENSATED", 5),
    ("AWAITING_APPROVAL", 10),
    ("RUNNING", 1),
]
#: The states of ``STATE_MIX`` an intent can be archived in (settled: nothing more will run).
SETTLED_MIX: list[tuple[str, int]] = [
    (s, n) for s, n in STATE_MIX if s not in ("AWAITING_APPROVAL", "RUNNING")
]

#: The tables a load writes, in the order they are copied (each row's references first), with
#: the key of ``IntentRows`` that holds their rows and the columns copied.
TABLES: list[tuple[str, str, list[str]]] = [
    (Intent._meta.db_table, "intent", [str(f.column) for f in Intent._meta.concrete_fields]),
    (OutboxMessage._meta.db_table, "outbox", [str(f.column) for f in OutboxMessage._meta.concrete_fields]),
    (Attempt._meta.db_table, "attempts", [str(f.column) for f in Attempt._meta.concrete_fields]),
    (Outcome._meta.db_table, "outcomes", [str(f.column) for f in Outcome._meta.concrete_fields if f.column != "id"]),
    (AuditEvent._meta.db_table, "events", [str(f.column) for f in AuditEvent._meta.concrete_fields if f.column != "id"]),
]  # fmt: skip

#: Intents built in memory and copied at a time (bounded memory for a million).
CHUNK = 20_000


def _status_table(mix: list[tuple[str, int]]) -> list[str]:
    table: list[str] = []
    for status, count in mix:
        table.extend([status] * count)
    return table + ["SUCCEEDED"] * (1000 - len(table))


def load_intents(
    dsn: str,
    *,
    count: int,
    status: str | None = None,
    tag: str = "bulk",
    span_days: float = 30,
    ends_at: datetime | None = None,
    mix: list[tuple[str, int]] | None = None,
) -> dict[str, Any]:
    """COPY ``count`` intents with their rows (``console.lab.bench.shapes``) into the database
    at ``dsn``, created evenly over the ``span_days`` days before ``ends_at`` (default now).

    Args:
        status: every intent's state; else ``mix`` (states per 1,000, the rest SUCCEEDED;
            default ``STATE_MIX``).
        tag: starts every client key and reference (``<tag>-<i>``, ``<tag>-order-<i // 2>``);
            unique per load.

    Returns ``rows`` (intents), ``rows_by_table``, ``seconds`` and ``ids_sample`` (20 intent
    ids spread over the load, oldest first).
    """
    statuses = _status_table(STATE_MIX if mix is None else mix)
    now = timezone.now()
    end = ends_at or now
    start = end - timedelta(days=span_days)
    step = timedelta(days=span_days) / max(1, count)
    rules = policy_for("payments.charge")
    snapshot = rules.to_snapshot()
    load = Load(tag=tag, rules=rules, policy=json.dumps(snapshot), policy_sha256=sha256_hex(canonical_json(snapshot)),
                lease_until=now + timedelta(days=1), approval_until=now + timedelta(days=7))  # fmt: skip
    began = time.perf_counter()
    sample_every = max(1, count // 20)
    ids_sample: list[uuid.UUID] = []
    copied = {table: 0 for table, _, _ in TABLES}
    with psycopg.connect(dsn) as conn, conn.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")
        _skip_row_triggers(conn)
        rebuild = _drop_secondary_indexes(conn) if count >= REBUILD_INDEXES_FROM else []
        first_attempt_id = _reserve_ids(conn, Attempt._meta.db_table, count)
        for chunk_start in range(0, count, CHUNK):
            chunk = []
            for i in range(chunk_start, min(count, chunk_start + CHUNK)):
                intent_id = uuid.uuid4()
                if i % sample_every == 0:
                    ids_sample.append(intent_id)
                chunk.append(intent_rows(load=load, i=i, intent_id=intent_id, state=status or statuses[i % 1000],
                                         created=start + step * i, attempt_id=first_attempt_id + i,
                                         outbox_id=uuid.uuid4()))  # fmt: skip
            for table, key, columns in TABLES:
                with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                    for row in _rows(chunk, key):
                        copy.write_row([row[c] for c in columns])
                        copied[table] += 1
        conn.commit()
        cursor.execute("SET maintenance_work_mem = '256MB'")
        for definition in rebuild:
            cursor.execute(definition)
        conn.commit()
    return {
        "rows": count,
        "rows_by_table": copied,
        "seconds": round(time.perf_counter() - began, 1),
        "ids_sample": ids_sample[:20],
    }


def _rows(chunk: list[IntentRows], key: str) -> Iterator[dict[str, Any]]:
    for rows in chunk:
        if key == "intent":
            yield rows.intent
        else:
            yield from getattr(rows, key)


def _reserve_ids(conn: psycopg.Connection[Any], table: str, count: int) -> int:
    """Take ``count`` ids of ``table``'s id sequence for rows copied with their ids; return the
    first. Later rows of the real path draw ids after them."""
    row = conn.execute("SELECT nextval(pg_get_serial_sequence(%s, 'id'))", [table]).fetchone()
    assert row is not None
    first = int(row[0])
    conn.execute("SELECT setval(pg_get_serial_sequence(%s, 'id'), %s)", [table, first + max(count, 1)])
    return first


#: From this many rows, secondary indexes are dropped before COPY and rebuilt after (a sorted
#: build is several times faster than a million single-row index insertions).
REBUILD_INDEXES_FROM = 200_000


def _drop_secondary_indexes(conn: psycopg.Connection[Any]) -> list[str]:
    """Drop the indexes of the loaded tables (``TABLES``) that back no constraint; return their
    ``CREATE INDEX`` statements. ``intent_reference_upper`` stays: its statistics target
    (migration 0023) is not part of its definition and would be lost."""
    rows = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = ANY(%s)"
        " AND indexname NOT IN (SELECT conname FROM pg_constraint) AND indexname <> 'intent_reference_upper'",
        [[table for table, _, _ in TABLES]],
    ).fetchall()
    for name, _ in rows:
        conn.execute(f'DROP INDEX "{name}"')
    return [str(definition) for _, definition in rows]


def _skip_row_triggers(conn: psycopg.Connection[Any]) -> None:
    """Skip foreign-key checks for this session when allowed (superuser): the rows are
    consistent by construction, and a million FK lookups would dominate the load."""
    try:
        with conn.transaction():
            conn.execute("SET session_replication_role = replica")
    except psycopg.errors.InsufficientPrivilege:
        pass


def analyze(dsn: str) -> float:
    """``VACUUM ANALYZE`` the loaded tables (visibility map for index-only scans, fresh
    statistics), as autovacuum would after a load; returns seconds."""
    began = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table, _, _ in TABLES:
            conn.execute(f"VACUUM ANALYZE {table}")
    return round(time.perf_counter() - began, 1)
