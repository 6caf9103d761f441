"""Issue 12, item 5: argument schemas are strict — what a provider would read differently from
what we validated is refused at submission (422 problem), nothing stored."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from operations.adapters.validation import ecma_pattern
from operations.models import Intent

pytestmark = pytest.mark.django_db

CHARGE = {"amount": 1200, "currency": "EUR", "customer": "cus_1"}
EMAIL = {"to": "ada@example.test", "subject": "Receipt", "body": "Thanks"}
RESERVATION = {"resource": "room-1", "start": "2030-01-01T10:00:00Z", "seats": 2, "reference": "b-1"}


def submit(api: APIClient, action: str, arguments: dict[str, Any], key: str) -> Any:
    return api.post(
        "/api/v1/intents",
        {"action": action, "arguments": arguments, "reference": key},
        format="json",
        HTTP_IDEMPOTENCY_KEY=key,
    )


@pytest.mark.parametrize(
    ("action", "arguments", "field"),
    [
        # Python's "$" matches before a final newline; ECMA-262's (JSON Schema's) does not
        ("payments.charge", {**CHARGE, "currency": "EUR\n"}, "currency"),
        ("email.send", {**EMAIL, "to": "ada@example.test\n"}, "to"),
        # JSON Schema counts 2.0 as an integer; a provider would not
        ("reservations.create", {**RESERVATION, "seats": 2.0}, "seats"),
        ("payments.charge", {**CHARGE, "amount": 1200.0}, "amount"),
        # "format": "date-time" is checked (RFC 3339)
        ("reservations.create", {**RESERVATION, "start": "next tuesday"}, "start"),
        ("reservations.create", {**RESERVATION, "start": "2030-02-30T10:00:00Z"}, "start"),
        ("reservations.create", {**RESERVATION, "start": "2030-01-01 10:00"}, "start"),
    ],
)
def test_i12_5_what_a_provider_would_read_otherwise_is_refused_and_nothing_stored(
    api: APIClient, action: str, arguments: dict[str, Any], field: str
) -> None:
    response = submit(api, action, arguments, key=f"strict-{field}")
    assert response.status_code == 422, response.content
    problem = response.json()
    assert problem["code"] == "validation-failed"
    assert field in [error["field"] for error in problem["errors"]]
    assert not Intent.objects.exists()


@pytest.mark.parametrize(
    ("action", "arguments"),
    [
        ("payments.charge", CHARGE),
        ("email.send", EMAIL),
        ("reservations.create", RESERVATION),
        ("reservations.create", {**RESERVATION, "start": "2030-01-01T10:00:00.250+02:00"}),
    ],
)
def test_i12_5_well_formed_arguments_still_pass(
    api: APIClient, action: str, arguments: dict[str, Any]
) -> None:
    assert submit(api, action, arguments, key="strict-ok").status_code == 201


def test_ecma_anchors_leave_escaped_and_class_dollars_alone() -> None:
    assert ecma_pattern("^[A-Z]{3}$") == "^[A-Z]{3}\\Z"
    assert ecma_pattern(r"^\$[0-9]+$") == r"^\$[0-9]+\Z"
    assert ecma_pattern("^[$a-z]+$") == "^[$a-z]+\\Z"
    assert ecma_pattern("^(a$|b$)") == "^(a\\Z|b\\Z)"


@pytest.mark.parametrize("version", ["1", 1.0, True])
def test_i12_5_action_version_must_be_a_json_integer(api: APIClient, version: Any) -> None:
    response = api.post(
        "/api/v1/intents",
        {"action": "payments.charge", "action_version": version, "arguments": CHARGE, "reference": "v"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="version",
    )
    assert response.status_code in (400, 422), response.content
    assert "action_version" in response.content.decode()
    assert not Intent.objects.exists()


DUPLICATE_BODIES = {
    "top-level action": (
        b'{"action": "payments.charge", "action": "email.send", '
        b'"arguments": {"to": "ada@example.test", "subject": "s", "body": "b"}}',
        "action",
    ),
    "charge amount": (
        b'{"action": "payments.charge", "arguments": {"amount": 100, "currency": "EUR", '
        b'"customer": "cus_1", "amount": 100000}}',
        "amount",
    ),
    "email recipient": (
        b'{"action": "email.send", "arguments": {"to": "ada@example.test", "subject": "s", '
        b'"body": "b", "to": "eve@example.test"}}',
        "to",
    ),
    "reservation seats": (
        b'{"action": "reservations.create", "arguments": {"resource": "room-1", '
        b'"start": "2030-01-01T10:00:00Z", "seats": 2, "reference": "b-1", "seats": 20}}',
        "seats",
    ),
    "generic payload": (
        b'{"action": "acme.transfer", "arguments": {"to": "a", "to": "b"}}',
        "to",
    ),
    "metadata": (
        b'{"action": "email.send", "arguments": {"to": "ada@example.test", "subject": "s", '
        b'"body": "b"}, "metadata": {"run": 1, "run": 2}}',
        "run",
    ),
    "nested in a list": (
        b'{"action": "acme.transfer", "arguments": {"items": [{"sku": "a", "sku": "b"}]}}',
        "sku",
    ),
}


@pytest.mark.parametrize("body", list(DUPLICATE_BODIES), ids=list(DUPLICATE_BODIES))
def test_i12_5_a_body_with_a_member_name_twice_is_a_400_problem_and_stores_nothing(
    api: APIClient, body: str, settings: Any
) -> None:
    # given: every kind of action exists, the generic HTTP one included
    settings.EFFECT_LEDGER_GENERIC_HTTP = {"acme.transfer": {"url": "http://127.0.0.1:9/v1/transfers"}}
    raw, name = DUPLICATE_BODIES[body]
    # when: the same idempotency key is sent with the ambiguous body
    response = api.generic(
        "POST", "/api/v1/intents", raw, content_type="application/json", HTTP_IDEMPOTENCY_KEY="dup-1"
    )
    # then: refused before anything is hashed or stored; the problem names the member
    assert response.status_code == 400, response.content
    assert response["Content-Type"].startswith("application/problem+json")
    assert f"'{name}' appears twice" in response.json()["detail"]
    assert not Intent.objects.exists()
    # and the key stays free for the unambiguous request
    fixed = api.post(
        "/api/v1/intents",
        {"action": "email.send", "arguments": EMAIL, "reference": "dup"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="dup-1",
    )
    assert fixed.status_code == 201


def test_i12_5_a_preview_with_a_member_name_twice_is_refused_too(api: APIClient) -> None:
    raw, _ = DUPLICATE_BODIES["charge amount"]
    response = api.generic("POST", "/api/v1/intents/preview", raw, content_type="application/json")
    assert response.status_code == 400
