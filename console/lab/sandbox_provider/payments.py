"""The payments product: Stripe-like charges and refunds with idempotency keys and fences.

Idempotency follows Stripe's documented behaviour
(https://docs.stripe.com/api/idempotent_requests): the first request with a key is executed and
its response — success or error, once the endpoint started executing — is stored; a replay
returns it with ``Idempotent-Replayed: true``; the same key with other parameters answers 422
``idempotency_key_reused``; a request while the first is still executing answers 409
``request_in_progress``. Validation errors (400) are not stored. Keys are scoped per endpoint
(``charges`` / ``refunds``).

Fencing: ``X-Fencing-Token`` (an integer) is remembered per key as the highest seen; a request
carrying a lower one answers 409 ``stale_fence`` and applies nothing — also when a newer fence
arrived while the request was waiting to apply.

Race-freedom: the key row is inserted in state ``processing`` under the primary key
``(product, key)`` in its own transaction before anything is applied; the effect and the
stored response are written together in a second transaction that re-checks ownership and
fence under ``FOR UPDATE``. Concurrent identical requests therefore yield exactly one effect.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable
from typing import Any

from psycopg import Connection
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from console.lab.sandbox_provider.events import event_data
from console.lab.sandbox_provider.replies import (
    BadRequest,
    Reply,
    RequestContext,
    error_reply,
    field_of,
    only_fields,
    positive_int,
)
from console.lab.sandbox_provider.store import Pool, new_id

#: A charge for this customer is declined (402 ``card_declined``), like Stripe's test cards.
DECLINED_CUSTOMER = "cus_declined"

Apply = Callable[[Connection[DictRow]], Reply]


def idempotency_headers(ctx: RequestContext) -> tuple[str, int | None]:
    """Return ``(Idempotency-Key, X-Fencing-Token)`` from the request headers.

    Raises:
        BadRequest: the key is missing or longer than 255 characters, or the fence is not an integer.
    """
    key = ctx.headers.get("idempotency-key", "").strip()
    if not key:
        raise BadRequest("the Idempotency-Key header is required", param="Idempotency-Key")
    if len(key) > 255:
        raise BadRequest("the Idempotency-Key header is longer than 255 characters", param="Idempotency-Key")
    raw_fence = ctx.headers.get("x-fencing-token")
    if raw_fence is None or raw_fence.strip() == "":
        return key, None
    try:
        return key, int(raw_fence)
    except ValueError:
        raise BadRequest("the X-Fencing-Token header must be an integer", param="X-Fencing-Token") from None


def body_digest(path: str, body: dict[str, Any]) -> str:
    """sha256 hex over the canonical ``{"path", "body"}`` (sorted keys, compact): what the sandbox
    compares to refuse a key reused with other parameters (not the ledger's ``request_hash``)."""
    canonical = json.dumps({"path": path, "body": body}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _stale_fence(fence: int, highest: int) -> Reply:
    return error_reply(
        409, "stale_fence", f"fencing token {fence} is lower than {highest} already seen for this key"
    )


def _acquire(pool: Pool, *, scope: str, key: str, fence: int | None, digest: str, owner: str) -> Reply | None:
    """Claim the key for this request, or return the answer that replaces executing it."""
    with pool.connection() as conn, conn.transaction():
        # The primary key (product, key) makes exactly one of N concurrent inserts win; the
        # losers wait for the winner's commit and then see its row below.
        inserted = conn.execute(
            "INSERT INTO sandbox.idempotency_keys (product, key, body_digest, state, owner, max_fence)"
            " VALUES (%s, %s, %s, 'processing', %s, %s) ON CONFLICT DO NOTHING RETURNING key",
            [scope, key, digest, owner, fence],
        ).fetchone()
        if inserted:
            return None
        row = conn.execute(
            "SELECT * FROM sandbox.idempotency_keys WHERE product = %s AND key = %s FOR UPDATE", [scope, key]
        ).fetchone()
        assert row is not None, "key rows are only removed by a reset"
        highest = row["max_fence"]
        if fence is not None and highest is not None and fence < highest:
            return _stale_fence(fence, highest)
        if fence is not None and (highest is None or fence > highest):
            conn.execute(
                "UPDATE sandbox.idempotency_keys SET max_fence = %s, updated_at = clock_timestamp()"
                " WHERE product = %s AND key = %s",
                [fence, scope, key],
            )
        if row["state"] == "released":
            # Nothing was applied under this key (the first try failed before its effect):
            # this request takes it over, like a first request.
            conn.execute(
                "UPDATE sandbox.idempotency_keys SET state = 'processing', owner = %s, body_digest = %s,"
                " updated_at = clock_timestamp() WHERE product = %s AND key = %s",
                [owner, digest, scope, key],
            )
            return None
        if row["body_digest"] != digest:
            return error_reply(
                422,
                "idempotency_key_reused",
                "Keys for idempotent requests can only be used with the same parameters"
                " they were first used with.",
            )
        if row["state"] == "processing":
            return error_reply(
                409, "request_in_progress", "A request with this idempotency key is still being processed."
            )
        return Reply(row["status_code"], json.loads(row["response"]), {"Idempotent-Replayed": "true"})


def _apply_and_store(
    pool: Pool, *, scope: str, key: str, fence: int | None, owner: str, apply: Apply
) -> Reply:
    with pool.connection() as conn, conn.transaction():
        row = conn.execute(
            "SELECT state, owner, max_fence FROM sandbox.idempotency_keys"
            " WHERE product = %s AND key = %s FOR UPDATE",
            [scope, key],
        ).fetchone()
        if row is None or row["owner"] != owner or row["state"] != "processing":
            return error_reply(409, "idempotency_key_lost", "The idempotency key was reset while processing.")
        # A newer fence may have arrived while this request waited (delay, hold): the older
        # holder must not apply, or a zombie worker would write after its successor.
        if fence is not None and row["max_fence"] is not None and fence < row["max_fence"]:
            conn.execute(
                "UPDATE sandbox.idempotency_keys SET state = 'released', updated_at = clock_timestamp()"
                " WHERE product = %s AND key = %s",
                [scope, key],
            )
            return _stale_fence(fence, row["max_fence"])
        reply = apply(conn)
        conn.execute(
            "UPDATE sandbox.idempotency_keys SET state = 'done', status_code = %s, response = %s,"
            " updated_at = clock_timestamp() WHERE product = %s AND key = %s",
            [reply.status, json.dumps(reply.body), scope, key],
        )
        return reply


def _release(pool: Pool, *, scope: str, key: str, owner: str) -> None:
    with pool.connection() as conn:
        conn.execute(
            "UPDATE sandbox.idempotency_keys SET state = 'released', updated_at = clock_timestamp()"
            " WHERE product = %s AND key = %s AND owner = %s AND state = 'processing'",
            [scope, key, owner],
        )


def run_idempotent(
    pool: Pool, ctx: RequestContext, *, scope: str, path: str, body: dict[str, Any], apply: Apply
) -> Reply:
    """Execute ``apply`` at most once per idempotency key and store its reply under the key.

    Args:
        scope: the key namespace (``charges`` or ``refunds``).
        path: the request path, part of the body digest.
        body: the validated request body.
        apply: writes the effect on the given connection (inside the storing transaction) and
            returns the reply to store.

    Raises:
        BadRequest: missing key or malformed fence header.
    """
    key, fence = idempotency_headers(ctx)
    owner = secrets.token_hex(8)
    verdict = _acquire(pool, scope=scope, key=key, fence=fence, digest=body_digest(path, body), owner=owner)
    if verdict is not None:
        return verdict
    try:
        ctx.before_apply()
        return _apply_and_store(pool, scope=scope, key=key, fence=fence, owner=owner, apply=apply)
    except BaseException:
        _release(pool, scope=scope, key=key, owner=owner)
        raise


def _charge_json(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "object": "charge",
        "amount": row["amount"],
        "amount_refunded": row["amount_refunded"],
        "currency": row["currency"],
        "customer": row["customer"],
        "reference": row["reference"],
        "description": row["description"],
        "metadata": row["metadata"],
        "status": row["status"],
        "idempotency_key": row["idempotency_key"],
        "fence": row["fence"],
        "created": row["created_at"].isoformat(),
    }


def _charge_event(row: dict[str, Any], status: str | None = None) -> dict[str, Any]:
    """The ``data`` of a charge event (status ``status``, else the charge's)."""
    return event_data(
        "charge",
        row["id"],
        status=status or row["status"],
        reference=row["reference"],
        idempotency_key=row["idempotency_key"],
        amount=row["amount"],
        currency=row["currency"],
    )


def _refund_json(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "object": "refund",
        "charge": row["charge_id"],
        "amount": row["amount"],
        "currency": row["currency"],
        "reference": row["reference"],
        "reason": row["reason"],
        "status": row["status"],
        "idempotency_key": row["idempotency_key"],
        "fence": row["fence"],
        "created": row["created_at"].isoformat(),
    }


def _currency(body: dict[str, Any]) -> str:
    currency: str = field_of(body, "currency", str)
    if len(currency) != 3 or not currency.isalpha():
        raise BadRequest("currency must be a three-letter ISO 4217 code", param="currency")
    return currency.upper()


def create_charge(pool: Pool, ctx: RequestContext, body: dict[str, Any]) -> Reply:
    """``POST /v1/charges`` ``{amount (minor units), currency, customer, reference?, description?,
    metadata?}`` → 200 charge, 402 ``card_declined`` (stored under the key), 409/422 key errors.

    Raises:
        BadRequest: a field is missing or mistyped, or the key header is missing.
    """
    only_fields(body, {"amount", "currency", "customer", "reference", "description", "metadata"})
    amount, currency = positive_int(body, "amount"), _currency(body)
    customer = field_of(body, "customer", str)
    reference = field_of(body, "reference", str, required=False)
    description = field_of(body, "description", str, required=False)
    metadata = field_of(body, "metadata", dict, required=False) or {}
    key, fence = idempotency_headers(ctx)

    def apply(conn: Connection[DictRow]) -> Reply:
        if customer == DECLINED_CUSTOMER:
            return error_reply(
                402, "card_declined", "Your card was declined.", decline_code="generic_decline"
            )
        row = conn.execute(
            "INSERT INTO sandbox.charges (id, idempotency_key, fence, amount, currency, customer, reference,"
            " description, metadata) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING *",
            [new_id("ch"), key, fence, amount, currency, customer, reference, description, Jsonb(metadata)],
        ).fetchone()
        assert row is not None
        ctx.emit(
            conn,
            [("charge.created", _charge_event(row, "pending")), ("charge.succeeded", _charge_event(row))],
        )
        return Reply(200, _charge_json(row))

    return run_idempotent(pool, ctx, scope="charges", path="/v1/charges", body=body, apply=apply)


def create_refund(pool: Pool, ctx: RequestContext, body: dict[str, Any]) -> Reply:
    """``POST /v1/refunds`` ``{charge, amount (minor units), currency, reference?, reason?}`` →
    200 refund; 404 ``resource_missing`` for an unknown charge; 422 ``amount_too_large`` above
    what remains refundable, 422 ``currency_mismatch``; all stored under the key.

    Raises:
        BadRequest: a field is missing or mistyped, or the key header is missing.
    """
    only_fields(body, {"charge", "amount", "currency", "reference", "reason"})
    charge_id = field_of(body, "charge", str)
    amount, currency = positive_int(body, "amount"), _currency(body)
    reference = field_of(body, "reference", str, required=False)
    reason = field_of(body, "reason", str, required=False)
    key, fence = idempotency_headers(ctx)

    def apply(conn: Connection[DictRow]) -> Reply:
        charge = conn.execute(
            "SELECT * FROM sandbox.charges WHERE id = %s FOR UPDATE", [charge_id]
        ).fetchone()
        if charge is None:
            return error_reply(404, "resource_missing", f"No such charge: {charge_id!r}", param="charge")
        if charge["currency"] != currency:
            return error_reply(422, "currency_mismatch", "The refund currency differs from the charge's.")
        remaining = charge["amount"] - charge["amount_refunded"]
        if amount > remaining:
            return error_reply(
                422, "amount_too_large", f"Refund amount {amount} is above the refundable {remaining}."
            )
        charge = conn.execute(
            "UPDATE sandbox.charges SET amount_refunded = amount_refunded + %s WHERE id = %s RETURNING *",
            [amount, charge_id],
        ).fetchone()
        assert charge is not None
        row = conn.execute(
            "INSERT INTO sandbox.refunds (id, charge_id, idempotency_key, fence, amount, currency, reference,"
            " reason) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) RETURNING *",
            [new_id("re"), charge_id, key, fence, amount, currency, reference, reason],
        ).fetchone()
        assert row is not None
        refunded = "refunded" if charge["amount_refunded"] >= charge["amount"] else "partially_refunded"
        ctx.emit(
            conn,
            [
                (
                    "refund.succeeded",
                    event_data(
                        "refund", row["id"], status=row["status"], reference=row["reference"],
                        idempotency_key=row["idempotency_key"], amount=row["amount"], currency=row["currency"],
                    ),
                ),
                ("charge.refunded", _charge_event(charge, refunded)),
            ],
        )  # fmt: skip
        return Reply(200, _refund_json(row))

    return run_idempotent(pool, ctx, scope="refunds", path="/v1/refunds", body=body, apply=apply)


TABLES = {"charges": ("sandbox.charges", _charge_json), "refunds": ("sandbox.refunds", _refund_json)}


def get_item(pool: Pool, scope: str, item_id: str) -> Reply:
    """``GET /v1/{charges|refunds}/{id}`` → 200 item, 404 unknown, 410 withdrawn."""
    table, to_json = TABLES[scope]
    with pool.connection() as conn:
        row = conn.execute(f"SELECT * FROM {table} WHERE id = %s", [item_id]).fetchone()
    if row is None:
        return error_reply(404, "resource_missing", f"No such {scope[:-1]}: {item_id!r}")
    if row["withdrawn_at"] is not None:
        return error_reply(410, "resource_withdrawn", f"The {scope[:-1]} {item_id!r} was withdrawn.")
    return Reply(200, to_json(row))


def list_items(pool: Pool, scope: str, *, idempotency_key: str | None, reference: str | None) -> Reply:
    """``GET /v1/{charges|refunds}?idempotency_key=K[&reference=R]``, withdrawn items omitted.

    Returns:
        ``{"object": "list", "data": [...], "idempotency_key": {"key", "state", "status_code"} | null}``:
        the key record (``processing`` / ``done`` / ``released``) makes a lookup by key
        authoritative — no record and no item means the provider never applied it; a ``done``
        2xx record without a visible item means the item was withdrawn.
    """
    table, to_json = TABLES[scope]
    sql, params = f"SELECT * FROM {table} WHERE withdrawn_at IS NULL", []
    if idempotency_key is not None:
        sql += " AND idempotency_key = %s"
        params.append(idempotency_key)
    if reference is not None:
        sql += " AND reference = %s"
        params.append(reference)
    key_record = None
    with pool.connection() as conn:
        rows = conn.execute(sql + " ORDER BY created_at DESC LIMIT 100", params).fetchall()
        if idempotency_key is not None:
            key_record = conn.execute(
                "SELECT key, state, status_code, max_fence FROM sandbox.idempotency_keys"
                " WHERE product = %s AND key = %s",
                [scope, idempotency_key],
            ).fetchone()
    return Reply(200, {"object": "list", "data": [to_json(r) for r in rows], "idempotency_key": key_record})
