"""Daily statements: the provider's own list of the effects it made, per product and UTC day.

``GET /v1/statements?date=YYYY-MM-DD&product=payments|email|reservations`` →
``{"date", "product", "lines": [{"id", "object", "idempotency_key", "reference", "amount",
"currency", "created"}]}`` (contract: issue 19, "Statements: sandbox -> ledger"). A day runs from
00:00 to 24:00 UTC by the effect's creation time; a refund is a line of its own (its ``re_…`` id);
``amount`` is in integer minor units (``null`` for email and reservations); email lines also
carry ``message_id``. Every effect ever made is on its day's statement, withdrawn items and
cancelled reservations included (withdrawing hides an item from lookups only).

Control plane, to build the findings a reconciliation must make:
``POST /_sandbox/statements/omit`` ``{"product", "id"}`` leaves an effect out of statements
("missing at the provider"); ``POST /_sandbox/statements/amount`` ``{"product", "id", "amount"}``
shows another amount for a payment ("amount mismatch"). An effect with no intent ("extra") is a
direct ``POST /v1/charges``. ``POST /_sandbox/reset`` clears the adjustments.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from console.lab.sandbox_provider import statement_store
from console.lab.sandbox_provider.faults import PRODUCTS
from console.lab.sandbox_provider.replies import BadRequest, Reply, error_reply
from console.lab.sandbox_provider.store import Pool

DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")


def parse_day(raw: str | None) -> date:
    """Return the ``date`` query parameter as a date.

    Raises:
        BadRequest: missing, not ``YYYY-MM-DD``, or no such day.
    """
    if raw is None or not DATE_RE.fullmatch(raw):
        raise BadRequest("date must be a day as YYYY-MM-DD (UTC)", param="date")
    try:
        return date.fromisoformat(raw)
    except ValueError:
        raise BadRequest(f"date {raw!r} is not a calendar day", param="date") from None


def parse_product(raw: Any) -> str:
    """Return ``raw`` when it names a product.

    Raises:
        BadRequest: otherwise, listing the products.
    """
    if raw not in PRODUCTS:
        raise BadRequest(f"product must be one of {', '.join(PRODUCTS)}", param="product")
    return str(raw)


def _line(row: dict[str, Any]) -> dict[str, Any]:
    line = {
        "id": row["id"],
        "object": row["object"],
        "idempotency_key": row["idempotency_key"],
        "reference": row["reference"] or "",
        "amount": row["amount"],
        "currency": row["currency"],
        "created": row["created_at"].astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }
    if row["object"] == "email":
        line["message_id"] = row["message_id"]
    return line


def get_statement(pool: Pool, *, day_text: str | None, product_text: str | None) -> Reply:
    """``GET /v1/statements?date=&product=`` → 200 statement (see the module docstring).

    Raises:
        BadRequest: a missing or malformed ``date`` or ``product``.
    """
    day = parse_day(day_text)
    product = parse_product(product_text)
    start = datetime.combine(day, time(), tzinfo=UTC)
    rows = statement_store.statement_lines(pool, product=product, start=start, end=start + timedelta(days=1))
    return Reply(200, {"date": day.isoformat(), "product": product, "lines": [_line(r) for r in rows]})


def _item(body: dict[str, Any]) -> tuple[str, str]:
    product = parse_product(body.get("product"))
    item_id = body.get("id")
    if not isinstance(item_id, str) or not item_id:
        raise BadRequest("id must be a provider id", param="id")
    return product, item_id


def omit(pool: Pool, body: dict[str, Any]) -> Reply:
    """``POST /_sandbox/statements/omit`` ``{"product", "id"}`` → 200; 404 for an unknown item.

    Raises:
        BadRequest: a missing or malformed field.
    """
    product, item_id = _item(body)
    if not statement_store.adjust_statement(pool, product=product, item_id=item_id, omit=True):
        return error_reply(404, "resource_missing", f"No such {product} item: {item_id!r}")
    return Reply(200, {"omitted": {"product": product, "id": item_id}})


def set_amount(pool: Pool, body: dict[str, Any]) -> Reply:
    """``POST /_sandbox/statements/amount`` ``{"product": "payments", "id", "amount"}`` (minor
    units, an integer >= 0) → 200; 404 for an unknown item.

    Raises:
        BadRequest: a missing or malformed field, or a product without amounts.
    """
    product, item_id = _item(body)
    amount = body.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
        raise BadRequest("amount must be an integer >= 0 (minor units)", param="amount")
    if product != "payments":
        raise BadRequest("only payments lines have amounts", param="product")
    if not statement_store.adjust_statement(pool, product=product, item_id=item_id, amount=amount):
        return error_reply(404, "resource_missing", f"No such {product} item: {item_id!r}")
    return Reply(200, {"amount": {"product": product, "id": item_id, "amount": amount}})
