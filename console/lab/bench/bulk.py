"""Bulk-load intents and their audit events with ``COPY`` (psycopg 3 ``cursor.copy``).

Rows are synthetic but shaped like the real ones: ``payments.charge`` intents of two tenants
spread over the last 30 days, across states, with one ``submitted`` audit event each.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.utils import timezone

from operations.audit.trail import GENESIS
from operations.models import AuditEvent, Intent
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


def _status_table() -> list[str]:
    table: list[str] = []
    for status, count in STATE_MIX:
        table.extend([status] * count)
    return table + ["SUCCEEDED"] * (1000 - len(table))


def _intent_columns() -> list[str]:
    return [str(field.column) for field in Intent._meta.concrete_fields]


def load_intents(
    dsn: str, *, count: int, status: str | None = None, tag: str = "bulk", span_days: float = 30
) -> dict[str, Any]:
    """COPY ``count`` intents into ``operations_intent`` and one audit event each; ``status``
    forces every row's state (else ``STATE_MIX``). Returns rows and seconds."""
    columns = _intent_columns()
    audit_columns = [str(f.column) for f in AuditEvent._meta.concrete_fields if f.column != "id"]
    policy = json.dumps(policy_for("payments.charge").to_snapshot())
    statuses = _status_table()
    now = timezone.now()
    start = now - timedelta(days=span_days)
    step = timedelta(days=span_days) / max(1, count)
    lease = now + timedelta(days=1)
    approval_until = now + timedelta(days=7)
    began = time.perf_counter()
    seed = uuid.uuid4().int >> 64 << 64  # ids are seed | i: unique, and no list of a million UUIDs
    with psycopg.connect(dsn) as conn, conn.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")
        _skip_row_triggers(conn)
        rebuild = _drop_secondary_indexes(conn) if count >= REBUILD_INDEXES_FROM else []
        with cursor.copy(f"COPY operations_intent ({', '.join(columns)}) FROM STDIN") as copy:
            for i in range(count):
                intent_id = uuid.UUID(int=seed | i)
                state = status or statuses[i % 1000]
                created = start + step * i
                values = _intent_row(i, intent_id, state, created, tag, policy)
                values["lease_expires_at"] = lease if state == "RUNNING" else None
                values["approval_expires_at"] = approval_until if state == "AWAITING_APPROVAL" else None
                values["next_lookup_at"] = created if state == "UNKNOWN" else None
                copy.write_row([values[c] for c in columns])
        with cursor.copy(f"COPY operations_auditevent ({', '.join(audit_columns)}) FROM STDIN") as copy:
            for i in range(count):
                intent_id = uuid.UUID(int=seed | i)
                created = start + step * i
                row = {
                    "intent_id": intent_id,
                    "seq": 1,
                    "event": "submitted",
                    "from_status": "",
                    "to_status": "READY",
                    "actor": "agent:bench",
                    "reason": "",
                    "data": '{"needs_approval": false}',
                    "created_at": created,
                    "prev_hash": GENESIS,
                    "hash": intent_id.hex * 2,
                }
                copy.write_row([row[c] for c in audit_columns])
        conn.commit()
        cursor.execute("SET maintenance_work_mem = '256MB'")
        for definition in rebuild:
            cursor.execute(definition)
        conn.commit()
    return {
        "rows": count,
        "seconds": round(time.perf_counter() - began, 1),
        "ids_sample": [uuid.UUID(int=seed | i) for i in range(0, count, max(1, count // 20))],
    }


#: From this many rows, secondary indexes are dropped before COPY and rebuilt after (a sorted
#: build is several times faster than a million single-row index insertions).
REBUILD_INDEXES_FROM = 200_000


def _drop_secondary_indexes(conn: psycopg.Connection[Any]) -> list[str]:
    """Drop the indexes of the intent and audit tables that back no constraint; return their
    ``CREATE INDEX`` statements."""
    rows = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename IN ('operations_intent', 'operations_auditevent')"
        " AND indexname NOT IN (SELECT conname FROM pg_constraint)"
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


def _intent_row(
    i: int, intent_id: uuid.UUID, state: str, created: datetime, tag: str, policy: str
) -> dict[str, Any]:
    tenant = "acme" if i % 4 else "globex"
    amount = 1000 + i % 9000 if state != "AWAITING_APPROVAL" else 20_000 + i % 9000
    return {
        "id": intent_id,
        "tenant": tenant,
        "principal": "agent:bench",
        "action": "payments.charge",
        "action_version": 1,
        "arguments": f'{{"amount":{amount},"currency":"EUR","customer":"cus_{i % 9973}"}}',
        "request_hash": intent_id.hex * 2,
        "fingerprint_version": 2,
        "forgotten_changes": False,
        "client_key": f"{tag}-{i}",
        "idempotency_key": f"el:{tenant}:payments.charge:1:{intent_id}",
        "reference": f"{tag}-order-{i // 2}",
        "metadata": "{}",
        "policy": policy,
        "risk_rank": 3,  # payments.charge is high risk
        "status": state,
        "fence": 0 if state in {"AWAITING_APPROVAL", "CANCELLED", "REJECTED", "EXPIRED"} else 1,
        "lease_owner": "bench:1" if state == "RUNNING" else "",
        "not_before": None,
        "attempt_count": 1,
        "in_progress_waits": 0,
        "in_progress_since": None,
        "escalated_at": None,
        "lookup_count": 0,
        "next_duplicate_check_at": None,
        "duplicate_check_until": None,
        "last_error": "",
        # Synthetic rows name no business identity: the submission guard (HELD) is not benched here.
        "business_key": "",
        "held_behind_id": None,
        "hold_reason": "",
        "wait_reason": "",
        "ceiling_override": False,
        "approval_round": 0,
        "requested_by_id": None,
        "compensates_id": None,
        "assigned_to": "",
        "assigned_at": None,
        "created_at": created,
        "updated_at": created + timedelta(seconds=1),
    }


def analyze(dsn: str) -> float:
    """``VACUUM ANALYZE`` the loaded tables (visibility map for index-only scans, fresh
    statistics), as autovacuum would after a load; returns seconds."""
    began = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in ("operations_intent", "operations_auditevent"):
            conn.execute(f"VACUUM ANALYZE {table}")
    return round(time.perf_counter() - began, 1)
