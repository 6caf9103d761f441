"""PostgreSQL storage of the sandbox provider: the schema, a connection pool, the ledger of
applied effects, the request log and withdrawals. The events to send live in ``event_store``,
the statement queries in ``statement_store``.

The provider stands for the outside world, so its data lives outside the ledger's database: by
default in a database of its own on the same server, named after the ledger's
(``<ledger database>_sandbox``, created when missing; ``database``), so that restoring the
ledger's database (a failover, a point-in-time restore, the crash lab's restore drill) leaves the
provider's effects where they are, as a real provider's would be. ``SANDBOX_DATABASE_URL`` or
``--dsn`` points it elsewhere. Every table lives in the schema ``sandbox`` (created with
``CREATE SCHEMA IF NOT EXISTS``), so a database shared with Django is still safe. Times come
from the database clock (``clock_timestamp()``).
"""

from __future__ import annotations

import secrets
import time
from typing import Any, TypeAlias, cast

import psycopg.errors
from psycopg import Connection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool

#: The pool type: autocommit connections whose rows are dicts.
Pool: TypeAlias = "ConnectionPool[Connection[DictRow]]"

SCHEMA_SQL = """
CREATE SCHEMA IF NOT EXISTS sandbox;
-- Schemas created before the column was renamed (it was "request_hash", a name the ledger uses
-- for something else) keep their rows: rename it in place, once.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = 'sandbox'
               AND table_name = 'idempotency_keys' AND column_name = 'request_hash') THEN
        ALTER TABLE sandbox.idempotency_keys RENAME COLUMN request_hash TO body_digest;
    END IF;
END $$;
CREATE TABLE IF NOT EXISTS sandbox.idempotency_keys (
    product text NOT NULL,
    key text NOT NULL,
    body_digest text NOT NULL,
    state text NOT NULL CHECK (state IN ('processing', 'done', 'released')),
    owner text NOT NULL,
    max_fence bigint,
    status_code integer,
    response text,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (product, key)
);
CREATE TABLE IF NOT EXISTS sandbox.charges (
    id text PRIMARY KEY,
    idempotency_key text NOT NULL,
    fence bigint,
    amount bigint NOT NULL,
    amount_refunded bigint NOT NULL DEFAULT 0,
    currency text NOT NULL,
    customer text NOT NULL,
    reference text,
    description text,
    metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
    status text NOT NULL DEFAULT 'succeeded',
    withdrawn_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS charges_idempotency_key ON sandbox.charges (idempotency_key);
CREATE TABLE IF NOT EXISTS sandbox.refunds (
    id text PRIMARY KEY,
    charge_id text NOT NULL REFERENCES sandbox.charges (id),
    idempotency_key text NOT NULL,
    fence bigint,
    amount bigint NOT NULL,
    currency text NOT NULL,
    reference text,
    reason text,
    status text NOT NULL DEFAULT 'succeeded',
    withdrawn_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS refunds_idempotency_key ON sandbox.refunds (idempotency_key);
CREATE TABLE IF NOT EXISTS sandbox.emails (
    id text PRIMARY KEY,
    message_id text NOT NULL,
    recipient text NOT NULL,
    subject text NOT NULL,
    body text NOT NULL,
    reference text,
    status text NOT NULL DEFAULT 'sent',
    withdrawn_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS emails_message_id ON sandbox.emails (message_id);
CREATE TABLE IF NOT EXISTS sandbox.reservations (
    id text PRIMARY KEY,
    resource text NOT NULL,
    start text NOT NULL,
    seats integer NOT NULL,
    reference text NOT NULL,
    status text NOT NULL DEFAULT 'confirmed',
    cancelled_at timestamptz,
    withdrawn_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS reservations_reference ON sandbox.reservations (reference);
CREATE TABLE IF NOT EXISTS sandbox.requests (
    id bigserial PRIMARY KEY,
    product text NOT NULL,
    method text NOT NULL,
    path text NOT NULL,
    idempotency_key text,
    message_id text,
    reference text,
    fence bigint,
    fault text,
    received_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- Events to the ledger (events.py), written in the transaction of the effect they report, so an
-- effect whose HTTP handler dies afterwards is still told. "body" is the exact JSON text sent.
CREATE TABLE IF NOT EXISTS sandbox.events (
    seq bigserial PRIMARY KEY,
    id text NOT NULL UNIQUE,
    source text NOT NULL,
    type text NOT NULL,
    object_id text NOT NULL,
    body text NOT NULL,
    state text NOT NULL CHECK (state IN ('pending', 'delivered', 'lost', 'failed')),
    copies integer NOT NULL DEFAULT 1,
    delivered integer NOT NULL DEFAULT 0,
    attempts integer NOT NULL DEFAULT 0,
    send_order integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    last_attempt_at timestamptz,
    last_status integer,
    last_error text,
    delivered_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS events_due ON sandbox.events (next_attempt_at) WHERE state = 'pending';
-- What statements (GET /v1/statements) show differently from the effects (statements.py).
CREATE TABLE IF NOT EXISTS sandbox.statement_adjustments (
    product text NOT NULL,
    id text NOT NULL,
    omitted boolean NOT NULL DEFAULT false,
    amount bigint,
    PRIMARY KEY (product, id)
);
"""

TABLES = (
    "refunds",
    "charges",
    "emails",
    "reservations",
    "idempotency_keys",
    "requests",
    "events",
    "statement_adjustments",
)

#: A lock id for ``pg_advisory_xact_lock`` so two providers starting together do not race on DDL.
SCHEMA_LOCK_ID = 0x5A4D_B0C5

LEDGER_SQL = """
SELECT 'payments' AS product, 'charge' AS kind, id, idempotency_key, NULL AS message_id, reference,
       fence, amount, currency,
       CASE WHEN withdrawn_at IS NOT NULL THEN 'withdrawn' ELSE status END AS status,
       withdrawn_at IS NOT NULL AS withdrawn, created_at,
       jsonb_build_object('customer', customer, 'amount_refunded', amount_refunded,
                          'metadata', metadata) AS extra
  FROM sandbox.charges
UNION ALL
SELECT 'payments', 'refund', id, idempotency_key, NULL, reference, fence, amount, currency,
       CASE WHEN withdrawn_at IS NOT NULL THEN 'withdrawn' ELSE status END,
       withdrawn_at IS NOT NULL, created_at, jsonb_build_object('charge', charge_id)
  FROM sandbox.refunds
UNION ALL
SELECT 'email', 'email', id, NULL, message_id, reference, NULL, NULL, NULL,
       CASE WHEN withdrawn_at IS NOT NULL THEN 'withdrawn' ELSE status END,
       withdrawn_at IS NOT NULL, created_at, jsonb_build_object('to', recipient, 'subject', subject)
  FROM sandbox.emails
UNION ALL
SELECT 'reservations', 'reservation', id, NULL, NULL, reference, NULL, NULL, NULL,
       CASE WHEN withdrawn_at IS NOT NULL THEN 'withdrawn' ELSE status END,
       withdrawn_at IS NOT NULL, created_at,
       jsonb_build_object('resource', resource, 'start', start, 'seats', seats)
  FROM sandbox.reservations
"""


def open_pool(dsn: str, *, max_size: int = 20) -> Pool:
    """Open a connection pool to ``dsn`` (autocommit connections, dict rows) and wait for it.

    Its connections never prepare statements (``prepare_threshold=None``): through PgBouncer in
    transaction mode a statement prepared on one server connection is missing, or already there
    (``DuplicatePreparedStatement``), on the next one a client is given (psycopg docs,
    "Prepared statements": "using external connection poolers").

    Raises:
        psycopg_pool.PoolTimeout: the database could not be reached within 10 seconds.
    """
    pool = ConnectionPool(
        dsn,
        connection_class=Connection,
        min_size=2,
        max_size=max_size,
        kwargs={"autocommit": True, "row_factory": dict_row, "prepare_threshold": None},
        timeout=10.0,
        open=False,
        name="sandbox-provider",
    )
    pool.open(wait=True, timeout=10.0)
    return cast("Pool", pool)


def ensure_schema(pool: Pool) -> None:
    """Create the ``sandbox`` schema and its tables when missing (safe to run concurrently)."""
    with pool.connection() as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [SCHEMA_LOCK_ID])
        conn.execute(SCHEMA_SQL)


#: Tries of ``truncate_all`` that PostgreSQL may end as a deadlock's victim before it gives up.
TRUNCATE_TRIES = 5


def truncate_all(pool: Pool) -> None:
    """Delete every sandbox row (effects, keys, request log); Django's tables are untouched.

    A request still being served (a worker or reconciler call left over from the crash lab's
    previous cell) can hold one table while the TRUNCATE holds another and waits for it:
    PostgreSQL then ends one of the two (``deadlock_detected``, the first to have waited). When
    that is the TRUNCATE it is tried again, up to ``TRUNCATE_TRIES`` times, once the request is
    through (found in CI: the lab's reset answered 500).

    Raises:
        psycopg.errors.DeadlockDetected: every try was a deadlock's victim.
    """
    statement = "TRUNCATE " + ", ".join(f"sandbox.{t}" for t in TABLES) + " RESTART IDENTITY"
    for attempt in range(1, TRUNCATE_TRIES + 1):
        try:
            with pool.connection() as conn:
                conn.execute(statement)
            return
        except psycopg.errors.DeadlockDetected:
            if attempt == TRUNCATE_TRIES:
                raise
            time.sleep(0.05 * attempt)


def new_id(prefix: str) -> str:
    """Return a fresh provider id such as ``ch_3f9c0e1a2b4d5e6f7a8b9c0d`` (prefix + 24 hex)."""
    return f"{prefix}_{secrets.token_hex(12)}"


def ledger(pool: Pool, *, product: str | None = None, reference: str | None = None) -> list[dict[str, Any]]:
    """Return every effect ever applied, oldest first, withdrawn and cancelled ones included.

    Args:
        product: ``payments``, ``email`` or ``reservations`` to filter; ``None`` for all.
        reference: our business reference to filter on; ``None`` for all.

    Returns:
        ``[{product, kind, id, idempotency_key, message_id, reference, fence, amount, currency,
        status, withdrawn, created_at, ...extra fields of the kind}]``; ``amount`` in minor units.
    """
    sql = f"SELECT * FROM ({LEDGER_SQL}) effects WHERE TRUE"
    params: list[Any] = []
    if product:
        sql += " AND product = %s"
        params.append(product)
    if reference:
        sql += " AND reference = %s"
        params.append(reference)
    sql += " ORDER BY created_at, id"
    with pool.connection() as conn:
        rows = conn.execute(sql, params).fetchall()
    effects = []
    for row in rows:
        extra = row.pop("extra") or {}
        row["created_at"] = row["created_at"].isoformat()
        effects.append({**row, **extra})
    return effects


def log_request(pool: Pool, *, product: str, method: str, path: str, **fields: Any) -> None:
    """Append one received product request to the request log (``fields``: idempotency_key,
    message_id, reference, fence, fault)."""
    with pool.connection() as conn:
        conn.execute(
            "INSERT INTO sandbox.requests (product, method, path, idempotency_key, message_id, reference,"
            " fence, fault) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            [
                product,
                method,
                path,
                fields.get("idempotency_key"),
                fields.get("message_id"),
                fields.get("reference"),
                fields.get("fence"),
                fields.get("fault"),
            ],
        )


def requests_since(pool: Pool, *, since: int = 0, product: str | None = None) -> dict[str, Any]:
    """Return logged requests with ``id > since`` and the count per product.

    Returns:
        ``{"requests": [{id, product, method, path, ...}], "counts": {"payments": n, ...},
        "last_id": int}``.
    """
    sql = "SELECT * FROM sandbox.requests WHERE id > %s"
    params: list[Any] = [since]
    if product:
        sql += " AND product = %s"
        params.append(product)
    with pool.connection() as conn:
        rows = conn.execute(sql + " ORDER BY id", params).fetchall()
    counts: dict[str, int] = {}
    for row in rows:
        row["received_at"] = row["received_at"].isoformat()
        counts[row["product"]] = counts.get(row["product"], 0) + 1
    return {"requests": rows, "counts": counts, "last_id": rows[-1]["id"] if rows else since}


def item_table(product: str, item_id: str) -> str | None:
    """The table holding ``product``'s item ``item_id`` (``payments``: ``re_…`` are refunds,
    others charges), ``None`` for an unknown product."""
    if product == "payments":
        return "refunds" if item_id.startswith("re_") else "charges"
    return {"email": "emails", "reservations": "reservations"}.get(product)


def withdraw(pool: Pool, *, product: str, item_id: str) -> bool:
    """Hide an item from the read path (single GET answers 410, lists omit it).

    Args:
        product: ``payments`` (charge ``ch_…`` or refund ``re_…``), ``email`` or ``reservations``.
        item_id: the provider id.

    Returns:
        ``True`` when the item exists (withdrawing twice is fine), ``False`` when unknown.
    """
    table = item_table(product, item_id)
    if table is None:
        return False
    with pool.connection() as conn:
        cursor = conn.execute(
            f"UPDATE sandbox.{table} SET withdrawn_at = coalesce(withdrawn_at, clock_timestamp())"
            " WHERE id = %s",
            [item_id],
        )
        return cursor.rowcount == 1
