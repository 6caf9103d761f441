"""Issue 19: the sandbox provider's daily statements (``GET /v1/statements``) and their control
plane (omit a line, show another amount), over real HTTP against the real provider process."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import psycopg
import pytest

from tests.support.processes import SandboxProvider

CHARGE = {"amount": 4990, "currency": "EUR", "customer": "cus_42", "reference": "order-st-1"}


def charge(provider: SandboxProvider, **changes: Any) -> dict[str, Any]:
    key = f"key-{uuid.uuid4()}"
    response = httpx.post(
        f"{provider.url}/v1/charges", json={**CHARGE, **changes}, headers={"Idempotency-Key": key}
    )
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


def set_created(table: str, item_id: str, created: str) -> None:
    """Move an effect to another creation time, in the provider's own database."""
    from django.db import connection

    from console.lab.sandbox_provider.database import default_dsn

    with psycopg.connect(default_dsn(connection.settings_dict), autocommit=True) as conn:
        conn.execute(f"UPDATE sandbox.{table} SET created_at = %s WHERE id = %s", [created, item_id])


def test_i19_a_statement_lists_the_days_effects_per_product(sandbox: SandboxProvider) -> None:
    # given
    key = f"key-{uuid.uuid4()}"
    charged = httpx.post(f"{sandbox.url}/v1/charges", json=CHARGE, headers={"Idempotency-Key": key}).json()
    refund = httpx.post(
        f"{sandbox.url}/v1/refunds",
        json={"charge": charged["id"], "amount": 1000, "currency": "EUR", "reference": "order-st-1-r"},
        headers={"Idempotency-Key": f"{key}-refund"},
    ).json()
    email = httpx.post(
        f"{sandbox.url}/v1/emails",
        json={"to": "a@example.com", "subject": "s", "body": "b", "reference": "mail-st"},
        headers={"Message-ID": "<k-st@effect-ledger.local>"},
    ).json()
    booked = httpx.post(
        f"{sandbox.url}/v1/reservations",
        json={"resource": "room", "start": "2026-12-24T18:00", "seats": 1, "reference": "booking-st"},
    ).json()
    day = charged["created"][:10]  # the provider's clock, UTC

    # when
    payments = sandbox.statement(day, "payments")
    emails = sandbox.statement(day, "email")
    reservations = sandbox.statement(day, "reservations")

    # then
    assert [{k: v for k, v in line.items() if k != "created"} for line in payments] == [
        {"id": charged["id"], "object": "charge", "idempotency_key": key, "reference": "order-st-1",
         "amount": 4990, "currency": "EUR"},
        {"id": refund["id"], "object": "refund", "idempotency_key": f"{key}-refund",
         "reference": "order-st-1-r", "amount": 1000, "currency": "EUR"},
    ]  # fmt: skip
    assert all(line["created"].endswith("Z") and line["created"].startswith(day) for line in payments)
    assert [(line["id"], line["object"], line["message_id"], line["amount"]) for line in emails] == [
        (email["id"], "email", "<k-st@effect-ledger.local>", None)
    ]
    assert [(line["id"], line["object"], line["reference"]) for line in reservations] == [
        (booked["id"], "reservation", "booking-st")
    ]


def test_i19_day_boundaries_are_utc_by_creation_time(sandbox: SandboxProvider) -> None:
    # given: one charge in the last microsecond of a day, one at the first of the next (UTC),
    # one at 23:30 in UTC+02:00 (21:30 UTC, the same day)
    late = charge(sandbox, reference="late")
    early = charge(sandbox, reference="early")
    offset = charge(sandbox, reference="offset")
    set_created("charges", late["id"], "2026-03-01T23:59:59.999999+00:00")
    set_created("charges", early["id"], "2026-03-02T00:00:00+00:00")
    set_created("charges", offset["id"], "2026-03-01T23:30:00+02:00")

    # when / then
    assert [line["reference"] for line in sandbox.statement("2026-03-01", "payments")] == ["offset", "late"]
    assert [line["reference"] for line in sandbox.statement("2026-03-02", "payments")] == ["early"]
    assert sandbox.statement("2026-02-28", "payments") == []


def test_i19_omit_and_amount_change_what_the_statement_shows(sandbox: SandboxProvider) -> None:
    # given
    kept, omitted, changed = (charge(sandbox, reference=r) for r in ("kept", "omitted", "changed"))
    day = kept["created"][:10]

    # when
    sandbox.omit_from_statement("payments", omitted["id"])
    sandbox.statement_amount("payments", changed["id"], 4500)

    # then
    lines = {line["reference"]: line["amount"] for line in sandbox.statement(day, "payments")}
    assert lines == {"kept": 4990, "changed": 4500}
    # the effects themselves are unchanged
    assert {e["reference"]: e["amount"] for e in sandbox.ledger("payments")} == {
        "kept": 4990, "omitted": 4990, "changed": 4990,
    }  # fmt: skip

    # when: a reset
    sandbox.reset()
    refreshed = charge(sandbox, reference="after-reset")

    # then
    assert [line["id"] for line in sandbox.statement(day, "payments")] == [refreshed["id"]]


def test_i19_an_email_can_be_omitted(sandbox: SandboxProvider) -> None:
    # given
    email = httpx.post(
        f"{sandbox.url}/v1/emails", json={"to": "a@example.com", "subject": "s", "body": "b"}
    ).json()

    # when
    sandbox.omit_from_statement("email", email["id"])

    # then
    assert sandbox.statement(email["created"][:10], "email") == []


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"product": "payments"}, "date"),
        ({"date": "2026-13-01", "product": "payments"}, "date"),
        ({"date": "01/03/2026", "product": "payments"}, "date"),
        ({"date": "2026-02-30", "product": "payments"}, "date"),
        ({"date": "2026-03-01"}, "product"),
        ({"date": "2026-03-01", "product": "sms"}, "product"),
    ],
)
def test_i19_a_bad_statement_query_is_400_with_an_error_body(
    sandbox: SandboxProvider, query: dict[str, str], param: str
) -> None:
    response = sandbox.client.get("/v1/statements", params=query)

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/_sandbox/statements/omit", {"product": "payments", "id": "ch_nope"}, 404),
        ("/_sandbox/statements/omit", {"product": "sms", "id": "x"}, 400),
        ("/_sandbox/statements/omit", {"product": "payments"}, 400),
        ("/_sandbox/statements/amount", {"product": "payments", "id": "ch_nope", "amount": 1}, 404),
        ("/_sandbox/statements/amount", {"product": "payments", "id": "ch_nope", "amount": "1"}, 400),
        ("/_sandbox/statements/amount", {"product": "payments", "id": "ch_nope", "amount": -1}, 400),
        ("/_sandbox/statements/amount", {"product": "email", "id": "em_x", "amount": 1}, 400),
    ],
)
def test_i19_bad_statement_adjustments_are_refused(
    sandbox: SandboxProvider, path: str, body: dict[str, Any], status: int
) -> None:
    response = sandbox.client.post(path, json=body)

    assert response.status_code == status
    assert "error" in response.json()
