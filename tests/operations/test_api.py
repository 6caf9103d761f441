"""Contract tests of the intents API: status, headers, body, and the rows left behind."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from rest_framework.test import APIClient

from operations.models import AuditEvent, Intent, OutboxMessage
from tests.factories import charge_arguments, make_agent

pytestmark = pytest.mark.django_db

URL = "/api/v1/intents"


def post(api: APIClient, body: Any, key: str | None = "key-1", raw: bytes | None = None) -> Any:
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    data = raw if raw is not None else json.dumps(body)
    return api.post(URL, data=data, content_type="application/json", **headers)


def charge(amount: int = 4990, **extra: Any) -> dict[str, Any]:
    return {"action": "payments.charge", "arguments": charge_arguments(amount), **extra}


def counts() -> tuple[int, int, int]:
    return Intent.objects.count(), OutboxMessage.objects.count(), AuditEvent.objects.count()


def assert_problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status
    assert body["detail"]
    assert body["type"].startswith("tag:effect-ledger")
    return body


def test_submit_creates_intent_audit_and_outbox(api: APIClient) -> None:
    # when
    response = post(api, charge(reference="order-1", metadata={"trace": "t-1"}))
    # then
    assert response.status_code == 201
    body = response.json()
    intent = Intent.objects.get(id=body["intent_id"])
    assert intent.status == Intent.Status.READY
    assert intent.tenant == "acme" and intent.principal == "agent:agent-1"
    assert intent.reference == "order-1" and intent.metadata == {"trace": "t-1"}
    assert len(intent.request_hash) == 64 and intent.idempotency_key.startswith("el_")
    assert response["Location"] == f"/api/v1/intents/{intent.id}"
    assert "Idempotent-Replayed" not in response
    assert OutboxMessage.objects.filter(intent=intent).count() == 1
    assert list(AuditEvent.objects.filter(intent=intent).values_list("event", flat=True)) == ["submitted"]


def test_replay_same_key_same_request_returns_same_intent(api: APIClient) -> None:
    # given
    first = post(api, charge())
    before = counts()
    # when
    second = post(api, charge())
    # then
    assert second.status_code == 201
    assert second["Idempotent-Replayed"] == "true"
    assert second.json()["intent_id"] == first.json()["intent_id"]
    assert counts() == before


def test_c09_agent_resubmitting_same_tool_call_three_times_gets_one_intent(api: APIClient) -> None:
    # when: an agent framework resumes from the top three times with the same client key
    ids = {post(api, charge(), key="run-7-step-3").json()["intent_id"] for _ in range(3)}
    # then
    assert len(ids) == 1
    assert Intent.objects.count() == 1 and OutboxMessage.objects.count() == 1


def test_metadata_is_not_hashed_so_volatile_fields_replay(api: APIClient) -> None:
    # given
    first = post(api, charge(metadata={"attempt": 1, "ts": "2026-11-30T10:00:00Z"}))
    # when
    second = post(api, charge(metadata={"attempt": 2, "ts": "2026-11-30T10:00:07Z"}))
    # then
    assert second.status_code == 201 and second["Idempotent-Replayed"] == "true"
    assert second.json()["intent_id"] == first.json()["intent_id"]


def test_c07_same_key_different_amount_is_local_422_and_first_untouched(api: APIClient) -> None:
    # given
    first = post(api, charge(4990), key="order-9")
    intent = Intent.objects.get(id=first.json()["intent_id"])
    before = counts()
    # when
    response = post(api, charge(49900), key="order-9")
    # then
    body = assert_problem(response, 422)
    assert body["code"] == "idempotency-key-reused"
    assert body["intent_id"] == str(intent.id)
    assert counts() == before
    intent.refresh_from_db()
    assert intent.arguments["amount"] == 4990 and intent.status == Intent.Status.READY


@pytest.mark.parametrize("key", [None, "", "é-not-ascii", "x" * 256, "tab\tkey", "new\nline"])
def test_missing_or_malformed_key_is_400_and_stores_nothing(api: APIClient, key: str | None) -> None:
    # when
    response = post(api, charge(), key=key)
    # then
    assert_problem(response, 400)
    assert counts() == (0, 0, 0)


def test_key_of_255_printable_characters_is_accepted(api: APIClient) -> None:
    assert post(api, charge(), key="k" * 254 + "~").status_code == 201


def test_keys_are_scoped_by_tenant(api: APIClient) -> None:
    # given: another tenant's agent uses the same key for another request
    _, other_token = make_agent(name="agent-1", tenant="globex")
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {other_token}")
    # when
    mine = post(api, charge(100), key="shared")
    theirs = post(other, charge(200), key="shared")
    # then
    assert mine.status_code == theirs.status_code == 201
    assert mine.json()["intent_id"] != theirs.json()["intent_id"]
    assert "Idempotent-Replayed" not in theirs


def test_refused_request_stores_nothing_so_the_key_can_be_reused(api: APIClient) -> None:
    # given
    bad = post(
        api, {"action": "payments.charge", "arguments": {"amount": -5, "currency": "EUR", "customer": "c"}}
    )
    assert_problem(bad, 422)
    assert counts() == (0, 0, 0)
    # when
    good = post(api, charge())
    # then
    assert good.status_code == 201 and "Idempotent-Replayed" not in good


def test_unknown_action_lists_known_actions(api: APIClient) -> None:
    body = assert_problem(post(api, {"action": "payments.teleport", "arguments": {}}), 422)
    assert "payments.charge" in body["known_actions"]
    assert counts() == (0, 0, 0)


def test_schema_failure_names_failing_fields(api: APIClient) -> None:
    # when
    response = post(api, {"action": "payments.charge", "arguments": {"amount": "12", "currency": "euro"}})
    # then
    body = assert_problem(response, 422)
    fields = {e["field"] for e in body["errors"]}
    assert {"amount", "currency", "arguments"} <= fields  # customer missing is reported on 'arguments'
    assert counts() == (0, 0, 0)


def test_float_money_is_refused(api: APIClient) -> None:
    body = assert_problem(post(api, {"action": "payments.charge", "arguments": charge_arguments(49.9)}), 422)  # type: ignore[arg-type]
    assert any(e["field"] == "amount" and "minor units" in e["message"] for e in body["errors"])


def test_integral_float_money_is_refused_too(api: APIClient) -> None:
    raw = b'{"action":"payments.charge","arguments":{"amount":4990.0,"currency":"EUR","customer":"c"}}'
    assert_problem(post(api, None, raw=raw), 422)
    assert counts() == (0, 0, 0)


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b'{"action": "payments.charge", "arguments": {"amount": NaN}}',
        b"\xff\xfe\x00garbage",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"action":"payments.charge","arguments":{"amount":' + b"9" * 5000 + b"}}",
    ],
    ids=["bad-json", "nan", "invalid-utf8", "deep-nesting", "huge-number-literal"],
)
def test_malformed_bodies_are_400(api: APIClient, raw: bytes) -> None:
    assert_problem(post(api, None, raw=raw), 400 if len(raw) <= 64 * 1024 else 413)
    assert counts() == (0, 0, 0)


@pytest.mark.parametrize(
    "body",
    [
        [],
        "a string",
        {"action": 5, "arguments": {}},
        {"action": "payments.charge", "arguments": []},
        {"action": "payments.charge", "arguments": charge_arguments(2**60)},
        {"action": "payments.charge", "arguments": charge_arguments(), "surprise": 1},
        {"action": "payments.charge", "arguments": charge_arguments(), "action_version": 2},
        {"action": "payments.charge", "arguments": charge_arguments(), "action_version": "1"},
        {"action": "payments.charge", "arguments": charge_arguments(), "action_version": 1.0},
        {"action": "payments.charge", "arguments": charge_arguments(), "action_version": True},
        {"action": "payments.charge", "arguments": charge_arguments(), "metadata": [1]},
    ],
    ids=[
        "list",
        "string",
        "action-int",
        "arguments-list",
        "huge-amount",
        "unknown-field",
        "version",
        "version-string",
        "version-float",
        "version-bool",
        "metadata",
    ],
)
def test_wrong_shapes_are_422_and_store_nothing(api: APIClient, body: Any) -> None:
    assert_problem(post(api, body), 422)
    assert counts() == (0, 0, 0)


def test_body_over_64_kib_is_413(api: APIClient) -> None:
    body = charge()
    body["metadata"] = {"blob": "x" * (65 * 1024)}
    assert_problem(post(api, body), 413)
    assert counts() == (0, 0, 0)


@pytest.mark.parametrize("header", [None, "Bearer nope", "Bearer", "Token abc"])
def test_unauthenticated_is_401_problem(db: Any, header: str | None) -> None:
    client = APIClient()
    if header:
        client.credentials(HTTP_AUTHORIZATION=header)
    response = post(client, charge())
    assert_problem(response, 401)
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert counts() == (0, 0, 0)


def test_amount_above_threshold_awaits_approval_without_outbox(api: APIClient) -> None:
    # when
    response = post(api, charge(10_001))
    # then
    assert response.status_code == 201
    intent = Intent.objects.get(id=response.json()["intent_id"])
    assert intent.status == Intent.Status.AWAITING_APPROVAL
    assert intent.approval_expires_at is not None
    assert OutboxMessage.objects.count() == 0


def test_amount_at_threshold_executes_automatically(api: APIClient) -> None:
    assert post(api, charge(10_000)).json()["status"] == "READY"


def test_get_intent_and_other_tenant_gets_404(api: APIClient) -> None:
    # given
    intent_id = post(api, charge()).json()["intent_id"]
    _, other_token = make_agent(name="spy", tenant="globex")
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {other_token}")
    # when
    mine = api.get(f"{URL}/{intent_id}")
    theirs = other.get(f"{URL}/{intent_id}")
    # then
    assert mine.status_code == 200 and mine.json()["intent_id"] == intent_id
    assert_problem(theirs, 404)
    assert_problem(api.get(f"{URL}/{uuid.uuid4()}"), 404)
    assert_problem(api.get(f"{URL}/not-a-uuid"), 404)


def test_list_filters_and_cursor_pagination(api: APIClient) -> None:
    # given
    for n in range(5):
        post(api, charge(100 + n, reference=f"ref-{n % 2}"), key=f"k-{n}")
    post(api, charge(20_000), key="big")
    # when
    page1 = api.get(URL, {"page_size": 2})
    page2 = api.get(page1.json()["next"])
    by_ref = api.get(URL, {"reference": "ref-1"})
    awaiting = api.get(URL, {"status": "AWAITING_APPROVAL"})
    # then
    assert page1.status_code == 200 and len(page1.json()["results"]) == 2
    seen = {r["intent_id"] for r in page1.json()["results"]} | {
        r["intent_id"] for r in page2.json()["results"]
    }
    assert len(seen) == 4
    assert len(by_ref.json()["results"]) == 2
    assert [r["arguments"]["amount"] for r in awaiting.json()["results"]] == [20_000]
    assert_problem(api.get(URL, {"status": "NOPE"}), 422)
    assert_problem(api.get(URL, {"created_after": "yesterday"}), 422)


def test_i11_6_preview_hashes_the_reference_as_submit_does(api: APIClient) -> None:
    # given: the same request previewed, then submitted, with a business reference
    body = charge(12_000, reference="order-9")
    # when
    previewed = api.post(f"{URL}/preview", data=body, format="json")
    unreferenced = api.post(f"{URL}/preview", data=charge(12_000), format="json")
    submitted = post(api, body)
    # then: the preview's request_hash is the one the approver will be shown
    assert previewed.status_code == 200 and submitted.status_code == 201
    assert previewed.json()["request_hash"] == submitted.json()["request_hash"]
    assert unreferenced.json()["request_hash"] != previewed.json()["request_hash"]


def test_preview_persists_nothing(api: APIClient) -> None:
    # when
    response = api.post(f"{URL}/preview", data=charge(12_000), format="json")
    # then
    assert response.status_code == 200
    body = response.json()
    assert body["needs_approval"] is True
    assert body["amount_minor"] == 12_000 and body["currency"] == "EUR"
    assert "120.00 EUR" in body["summary"]
    assert len(body["request_hash"]) == 64
    assert counts() == (0, 0, 0)
    assert_problem(api.post(f"{URL}/preview", data={"action": "nope", "arguments": {}}, format="json"), 422)


def test_cancel_before_running_and_409_after(api: APIClient) -> None:
    # given
    ready = post(api, charge(), key="a").json()["intent_id"]
    running = post(api, charge(), key="b").json()["intent_id"]
    Intent.objects.filter(id=running).update(status=Intent.Status.RUNNING)
    # when
    cancelled = api.post(f"{URL}/{ready}/cancel", data={"reason": "changed my mind"}, format="json")
    refused = api.post(f"{URL}/{running}/cancel", format="json")
    # then
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "CANCELLED"
    body = assert_problem(refused, 409)
    assert body["current_status"] == "RUNNING"
    assert Intent.objects.get(id=running).status == Intent.Status.RUNNING
    # cancelling again is idempotent
    assert api.post(f"{URL}/{ready}/cancel", format="json").json()["status"] == "CANCELLED"


def test_unknown_api_path_is_problem_json(api: APIClient) -> None:
    assert_problem(api.get("/api/v1/nothing-here"), 404)


def test_openapi_schema_is_served(db: Any) -> None:
    response = APIClient().get("/api/schema/")
    assert response.status_code == 200
    assert b"/api/v1/intents" in response.content


@pytest.mark.parametrize(
    "body",
    [
        {"action": "payments.charge", "arguments": charge_arguments(customer="c\u0000")},
        {"action": "payments.charge", "arguments": charge_arguments(), "metadata": {"a": "\u0000"}},
        {"action": "payments.charge", "arguments": charge_arguments(), "metadata": {"\u0000": "x"}},
        {"action": "payments.charge", "arguments": charge_arguments(), "reference": "r\u0000"},
    ],
    ids=["nul-in-arguments", "nul-in-metadata-value", "nul-in-metadata-key", "nul-in-reference"],
)
def test_values_postgres_cannot_store_are_422_not_500(api: APIClient, body: Any) -> None:
    detail = assert_problem(post(api, body), 422)["detail"]
    assert "NUL" in detail or "Null characters are not allowed" in detail
    assert counts() == (0, 0, 0)


def test_lone_surrogate_in_metadata_is_422(api: APIClient) -> None:
    raw = b'{"action":"payments.charge","arguments":{"amount":1,"currency":"EUR","customer":"c"},"metadata":{"a":"\\ud800"}}'
    assert "surrogate" in assert_problem(post(api, None, raw=raw), 422)["detail"]
    assert counts() == (0, 0, 0)


def test_deeply_nested_metadata_is_refused(api: APIClient) -> None:
    # given: 40 levels of arrays, well under the body limit
    deep: Any = "x"
    for _ in range(40):
        deep = [deep]
    # when / then
    body = assert_problem(post(api, charge(metadata={"deep": deep})), 422)
    assert "nested deeper than 32" in body["detail"]
    assert counts() == (0, 0, 0)


def test_preview_refuses_nul_too(api: APIClient) -> None:
    body = {"action": "payments.charge", "arguments": charge_arguments(customer="c\u0000")}
    response = api.post(f"{URL}/preview", data=body, format="json")
    assert_problem(response, 422)


@pytest.mark.parametrize(
    "raw", [b"[]", b"null", b'"x"', b"1", b"[{}]"], ids=["array", "null", "string", "number", "list"]
)
def test_i12_6_a_cancel_body_that_is_not_an_object_is_refused_and_cancels_nothing(
    api: APIClient, raw: bytes
) -> None:
    # given
    ready = post(api, charge(), key="c").json()["intent_id"]
    # when
    response = api.generic("POST", f"{URL}/{ready}/cancel", raw, content_type="application/json")
    # then: a problem, and the intent is untouched
    assert response.status_code in (400, 422), response.content
    assert response["Content-Type"].startswith("application/problem+json")
    assert Intent.objects.get(id=ready).status == "READY"


def test_i12_6_an_empty_cancel_body_is_a_cancel_without_reason(api: APIClient) -> None:
    ready = post(api, charge(), key="c").json()["intent_id"]
    response = api.generic("POST", f"{URL}/{ready}/cancel", b"", content_type="application/json")
    assert response.status_code == 200 and response.json()["status"] == "CANCELLED"


@pytest.mark.parametrize("currency", ["XTS", "XXX", "XAU", "XDR", "CLF", "DEM", "VEF", "HRK"])
def test_i16_1_a_code_without_minor_unit_or_out_of_use_is_refused_with_nothing_stored(
    api: APIClient, currency: str
) -> None:
    # when: a charge in a code Babel knows but that is no currency in use (it would guess 2
    # decimals: the reviewer saw "1.00 XTS" accepted)
    response = post(
        api, {"action": "payments.charge", "arguments": charge_arguments(4990, currency=currency)}
    )
    # then
    body = assert_problem(response, 422)
    (error,) = [e for e in body["errors"] if e["field"] == "currency"]
    assert "not a currency in use" in error["message"]
    assert counts() == (0, 0, 0)


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"amount": "4990", "currency": "xyz"}, "amount"),
        ({"amount": True, "currency": "EUR"}, "amount"),
        ({"amount": 4990, "currency": ["EUR"]}, "currency"),
        ({"amount": {"value": 5}, "currency": "EUR"}, "amount"),
        ({"amount": 4990, "currency": "XTS"}, "currency"),
    ],
)
def test_i16_1_a_generic_action_without_schema_cannot_slip_money_past_the_rule(
    api: APIClient, settings: Any, arguments: dict[str, Any], field: str
) -> None:
    # given: a generic HTTP action with no argument schema (the reviewer's bypass)
    settings.EFFECT_LEDGER_GENERIC_HTTP = {"acme.transfer": {"url": "http://127.0.0.1:9/v1/transfers"}}
    for path in (URL, f"{URL}/preview"):
        # when
        response = api.post(
            path,
            {"action": "acme.transfer", "arguments": arguments},
            format="json",
            HTTP_IDEMPOTENCY_KEY="g-1",
        )
        # then: a 422 naming the field, nothing stored
        body = assert_problem(response, 422)
        assert field in {e["field"] for e in body["errors"]}, body
        assert counts() == (0, 0, 0)
    # and a generic action whose amount is a count with no currency is not money: accepted
    fine = api.post(f"{URL}/preview", {"action": "acme.transfer", "arguments": {"amount": 3}}, format="json")
    assert fine.status_code == 200, fine.content


@pytest.mark.parametrize("currency", ["XYZ", "eur", "ZZZ"])
def test_i16_1_an_unknown_currency_is_refused_at_submit_with_nothing_stored(
    api: APIClient, currency: str
) -> None:
    # when: a charge in a currency Babel does not know (its exponent, hence the amount, unknown)
    response = post(
        api, {"action": "payments.charge", "arguments": charge_arguments(4990, currency=currency)}
    )
    # then: a 422 problem naming the field; no intent, outbox message or audit event
    body = assert_problem(response, 422)
    assert any(e["field"] == "currency" for e in body["errors"])
    assert counts() == (0, 0, 0)


def test_i16_1_an_unknown_currency_is_refused_at_preview(api: APIClient) -> None:
    response = api.post(
        f"{URL}/preview",
        data=charge(4990) | {"arguments": charge_arguments(4990, currency="XYZ")},
        format="json",
    )
    body = assert_problem(response, 422)
    assert [e for e in body["errors"] if e["field"] == "currency"][0]["message"].startswith(
        "'XYZ' is not an ISO 4217"
    )
    assert counts() == (0, 0, 0)


@pytest.mark.parametrize(
    ("minor", "currency", "digits", "exact", "shown"),
    [
        (125_000, "JPY", 0, "125000", "Charge 125,000 JPY to cus_42"),
        (4990, "EUR", 2, "49.90", "Charge 49.90 EUR to cus_42"),
        (1234, "KWD", 3, "1.234", "Charge 1.234 KWD to cus_42"),
    ],
)
def test_i16_1_preview_answers_the_decimal_string_and_the_exponent(
    api: APIClient, minor: int, currency: str, digits: int, exact: str, shown: str
) -> None:
    # when
    response = api.post(
        f"{URL}/preview",
        data={"action": "payments.charge", "arguments": charge_arguments(minor, currency=currency)},
        format="json",
    )
    # then
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["summary"] == shown
    assert body["money"] == {
        "amount_minor": minor,
        "currency": currency,
        "exponent": digits,
        "decimal": exact,
    }


def test_i16_1_preview_money_is_null_when_nothing_moves(api: APIClient) -> None:
    response = api.post(
        f"{URL}/preview",
        data={"action": "email.send", "arguments": {"to": "ana@example.test", "subject": "Hi", "body": "x"}},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert response.json()["money"] is None
