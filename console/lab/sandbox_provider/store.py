"""PostgreSQL storage of the sandbox provider: its own database, a connection pool, the ledger
of applied effects, the request log, the events to send and the statement adjustments.

The provider stands for the outside world, so its data lives outside the ledger's database: by
default in a database of its own on the same server, named after the ledger's
(``<ledger database>_sandbox``, created when missing), so that restoring the ledger's database
(a failover, a point-in-time restore, the crash lab's restore drill) leaves the provider's
effects where they are, as a real provider's would be. ``SANDBOX_DATABASE_URL`` or ``--dsn``
points it elsewhere. Every table lives in the schema ``sandbox`` (created with
``CREATE SCHEMA IF NOT EXISTS``), so a database shared with Django is still safe. Times come
from the database clock (``clock_timestamp()``).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypeAlias, cast

import psycopg
from psycopg import Connection, errors, sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
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


def dsn_from_settings_dict(settings_dict: Mapping[str, Any]) -> str:
    """Build a libpq connection string from a Django ``DATABASES`` entry.

    Args:
        settings_dict: ``django.db.connection.settings_dict`` (``NAME``, ``USER``, ``PASSWORD``,
            ``HOST``, ``PORT`` and ``OPTIONS``); under pytest-django, read it after the test
            database is set up so ``NAME`` is the test database.

    Returns:
        e.g. ``"dbname=test_effect_ledger user=postgres host=127.0.0.1 port=5432"``; a Unix socket
        directory in ``HOST`` (the embedded server) works as well.
    """
    params: dict[str, Any] = {
        "dbname": settings_dict.get("NAME") or None,
        "user": settings_dict.get("USER") or None,
        "password": settings_dict.get("PASSWORD") or None,
        # The embedded server's socket directory arrives as OPTIONS["host"] (see console/embedded.py).
        "host": settings_dict.get("HOST") or (settings_dict.get("OPTIONS") or {}).get("host") or None,
        "port": str(settings_dict["PORT"]) if settings_dict.get("PORT") else None,
    }
    for name in ("sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout", "options"):
        value = (settings_dict.get("OPTIONS") or {}).get(name)
        if value is not None:
            params[name] = value
    return make_conninfo("", **{k: v for k, v in params.items() if v is not None})


#: Appended to the ledger database's name to name the sandbox provider's default database.
DATABASE_SUFFIX = "_sandbox"


def sandbox_database_name(ledger_database: str) -> str:
    """The default database of the sandbox provider beside ledger database ``ledger_database``.

    Example: ``"effect_ledger"`` gives ``"effect_ledger_sandbox"``; a test database
    ``"test_effect_ledger"`` gives ``"test_effect_ledger_sandbox"``, so every test run has its own.
    """
    return f"{ledger_database}{DATABASE_SUFFIX}"


def default_dsn(settings_dict: Mapping[str, Any]) -> str:
    """A libpq DSN of the sandbox provider's default database: the ledger's server and
    credentials, database ``sandbox_database_name(<ledger database>)``.

    Args:
        settings_dict: the ledger's ``DATABASES`` entry (``connection.settings_dict``).
    """
    ledger_database = str(settings_dict.get("NAME") or "")
    return dsn_from_settings_dict({**settings_dict, "NAME": sandbox_database_name(ledger_database)})


def database_name(dsn: str) -> str:
    """The database a libpq DSN or URL names (``""`` when it names none)."""
    return str(conninfo_to_dict(dsn).get("dbname") or "")


def ensure_database(dsn: str, *, admin_dsn: str) -> bool:
    """Create the database ``dsn`` names when it does not exist (safe under concurrency).

    Two processes starting together may both find it missing: ``CREATE DATABASE`` then fails in
    one of them with ``duplicate_database`` (42P04), or, when both inserted into the catalogue at
    once, with ``unique_violation`` (23505) on ``pg_database``'s name index; either means another
    process created it, which is what was wanted.

    Args:
        dsn: the sandbox database's DSN (only its ``dbname`` is used).
        admin_dsn: a DSN of an existing database on the same server whose role may create
            databases (the ledger's own).

    Returns:
        ``True`` when this call created it, ``False`` when it already existed.

    Raises:
        psycopg.Error: the server is unreachable or the role may not create databases.
    """
    name = database_name(dsn)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            return False
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except (errors.DuplicateDatabase, errors.UniqueViolation):
            return False
    return True


def prepare_default_database(settings_dict: Mapping[str, Any]) -> str:
    """Create the default sandbox database beside the ledger's when missing; return its DSN.

    Args:
        settings_dict: the ledger's ``DATABASES`` entry; its role creates the database.
    """
    dsn = default_dsn(settings_dict)
    ensure_database(dsn, admin_dsn=dsn_from_settings_dict(settings_dict))
    return dsn


def drop_database(dsn: str, *, admin_dsn: str) -> None:
    """Drop the database ``dsn`` names, if it exists, ending its sessions (``WITH (FORCE)``,
    PostgreSQL 13+). For test runs and scratch databases, never a provider someone uses."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database_name(dsn)))
        )


def open_pool(dsn: str, *, max_size: int = 20) -> Pool:
    """Open a connection pool to ``dsn`` (autocommit connections, dict rows) and wait for it.

    Raises:
        psycopg_pool.PoolTimeout: the database could not be reached within 10 seconds.
    """
    pool = ConnectionPool(
        dsn,
        connection_class=Connection,
        min_size=2,
        max_size=max_size,
        kwargs={"autocommit": True, "row_factory": dict_row},
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


def truncate_all(pool: Pool) -> None:
    """Delete every sandbox row (effects, keys, request log); Django's tables are untouched."""
    with pool.connection() as conn:
        conn.execute("TRUNCATE " + ", ".join(f"sandbox.{t}" for t in TABLES) + " RESTART IDENTITY")


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


# --- events (events.py) ------------------------------------------------------------------------

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


# --- statements (statements.py) ------------------------------------------------------------------

STATEMENT_SQL = {
    "payments": """
SELECT 'charge' AS object, id, idempotency_key, NULL AS message_id, reference, amount, currency,
       created_at FROM sandbox.charges
UNION ALL
SELECT 'refund', id, idempotency_key, NULL, reference, amount, currency, created_at
  FROM sandbox.refunds
""",
    "email": """
SELECT 'email' AS object, id, NULL AS idempotency_key, message_id, reference, NULL::bigint AS amount,
       NULL AS currency, created_at FROM sandbox.emails
""",
    "reservations": """
SELECT 'reservation' AS object, id, NULL AS idempotency_key, NULL AS message_id, reference,
       NULL::bigint AS amount, NULL AS currency, created_at FROM sandbox.reservations
""",
}


def statement_lines(pool: Pool, *, product: str, start: datetime, end: datetime) -> list[dict[str, Any]]:
    """The effects of ``product`` created in ``[start, end)``, as a statement shows them: without
    the omitted ones, with an adjusted amount where one was set; oldest first. Withdrawn items
    and cancelled reservations are included (the effect was made).

    Returns:
        rows ``{object, id, idempotency_key, message_id, reference, amount, currency, created_at}``.
    """
    with pool.connection() as conn:
        rows: list[dict[str, Any]] = conn.execute(
            f"SELECT e.object, e.id, e.idempotency_key, e.message_id, e.reference,"  # noqa: S608
            f" coalesce(a.amount, e.amount) AS amount, e.currency, e.created_at"
            f" FROM ({STATEMENT_SQL[product]}) e"
            f" LEFT JOIN sandbox.statement_adjustments a ON a.product = %s AND a.id = e.id"
            f" WHERE e.created_at >= %s AND e.created_at < %s AND NOT coalesce(a.omitted, false)"
            f" ORDER BY e.created_at, e.id",
            [product, start, end],
        ).fetchall()
    return rows


def adjust_statement(
    pool: Pool, *, product: str, item_id: str, omit: bool = False, amount: int | None = None
) -> bool:
    """Make statements leave item ``item_id`` out (``omit``) or show ``amount`` for it.

    Returns:
        ``True`` when the item exists, ``False`` when ``product`` has no such item.
    """
    table = item_table(product, item_id)
    if table is None:
        return False
    with pool.connection() as conn, conn.transaction():
        if not conn.execute(f"SELECT 1 FROM sandbox.{table} WHERE id = %s", [item_id]).fetchone():  # noqa: S608
            return False
        conn.execute(
            "INSERT INTO sandbox.statement_adjustments (product, id, omitted, amount) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (product, id) DO UPDATE SET"
            " omitted = sandbox.statement_adjustments.omitted OR EXCLUDED.omitted,"
            " amount = coalesce(EXCLUDED.amount, sandbox.statement_adjustments.amount)",
            [product, item_id, omit, amount],
        )
    return True
