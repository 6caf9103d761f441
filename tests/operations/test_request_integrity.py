"""The stored request proves itself (issue 11 items 2, 3 and 6): approvals and the worker
re-derive request_hash from the stored intent, arguments round-trip through PostgreSQL in their
canonical form, and ``reference`` is part of the request fingerprint."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from django.db import connection
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from operations import metrics
from operations.audit.request_integrity import MISMATCH_HOLD, stored_request_problem
from operations.engine.protocol import execute_intent
from operations.exceptions import ApprovalRefused, ResolutionRefused, ValidationFailed
from operations.idempotency import FINGERPRINT_VERSION, request_hash
from operations.models import Approval, Attempt, AuditEvent, Intent
from operations.services import intent_approve, intent_reject_held, intent_release_held, intent_submit
from tests.factories import charge_arguments, submit
from tests.support.fake_provider import FakeProvider

pytestmark = pytest.mark.django_db

S = Intent.Status
URL = "/api/v1/intents"
EMAIL = {"to": "ada@example.test", "subject": "Your receipt", "body": "Thanks"}
TRANSFER = {"amount": 1200, "currency": "EUR", "account": "acc_9"}


@pytest.fixture
def provider(fake_provider: FakeProvider, settings: Any) -> FakeProvider:
    """Every adapter (the sandbox ones and the generic ``acme.transfer``) pointed at the fake
    provider, which records every request it receives."""
    settings.EFFECT_LEDGER_GENERIC_HTTP = {"acme.transfer": {"url": f"{fake_provider.url}/v1/transfers"}}
    settings.SANDBOX_PROVIDER_URL = fake_provider.url
    return fake_provider


def edit_row(intent: Intent, sql_set: str, params: list[Any]) -> None:
    """What a database writer does behind the ledger's back: a raw UPDATE of the intent row."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE operations_intent SET {sql_set} WHERE id = %s", [*params, intent.id])


def counter(metric: Any, **labels: str) -> float:
    return float(metric.labels(**labels)._value.get())


def post(api: APIClient, body: dict[str, Any], key: str = "key-1") -> Any:
    return api.post(URL, data=json.dumps(body), content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


# --- item 2: approvals and execution re-derive the hash ---------------------------------------


def test_i11_2_an_edited_gated_charge_is_refused_at_approval_and_nothing_changes(approver: Any) -> None:
    # given: a gated 50,000 charge whose amount is then edited in the database
    intent = submit(arguments=charge_arguments(50_000))
    assert intent.status == S.AWAITING_APPROVAL
    edit_row(intent, "arguments = jsonb_set(arguments, '{amount}', %s::jsonb)", ["4999999"])
    events = AuditEvent.objects.filter(intent=intent).count()
    refused = counter(metrics.REQUEST_MISMATCHES, stage="approval")
    # when: approving with the hash the approver was shown at first
    with pytest.raises(ApprovalRefused) as caught:
        intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    # then: refused with the reason; nothing moved, only the refusal is audited (item 4)
    assert MISMATCH_HOLD in caught.value.detail
    intent.refresh_from_db()
    assert intent.status == S.AWAITING_APPROVAL and intent.arguments["amount"] == 4_999_999
    assert not Approval.objects.filter(intent=intent).exists()
    (refusal,) = AuditEvent.objects.filter(intent=intent, seq__gt=events)
    assert refusal.event == "decision_refused" and MISMATCH_HOLD in refusal.reason
    assert counter(metrics.REQUEST_MISMATCHES, stage="approval") == refused + 1


def test_i11_2_a_charge_edited_after_approval_is_held_and_never_sent(
    provider: FakeProvider, approver: Any
) -> None:
    # given: a gated 50,000 charge, approved (READY), then its amount edited to 4,999,999
    intent = submit(arguments=charge_arguments(50_000))
    intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    edit_row(intent, "arguments = jsonb_set(arguments, '{amount}', %s::jsonb)", ["4999999"])
    held_before = counter(metrics.REQUEST_MISMATCHES, stage="execution")
    # when: a worker runs it
    label = execute_intent(intent.id)
    # then: nothing reached the provider; HELD for a person with the reason, audited and counted
    assert label == "held"
    assert provider.requests == []
    intent.refresh_from_db()
    assert intent.status == S.HELD and intent.hold_reason.startswith(MISMATCH_HOLD)
    assert intent.escalated_at is not None and intent.lease_owner == ""
    event = AuditEvent.objects.filter(intent=intent).order_by("-seq").first()
    assert event is not None and (event.event, event.from_status, event.to_status) == (
        "request_hash_mismatch",
        S.RUNNING,
        S.HELD,
    )
    assert event.data["sent"] is False
    attempt = Attempt.objects.get(intent=intent)
    assert attempt.result == Attempt.Result.SKIPPED
    assert counter(metrics.REQUEST_MISMATCHES, stage="execution") == held_before + 1
    assert not Approval.objects.filter(intent=intent, used_at__isnull=False).exists()


def test_i11_2_a_gated_charge_whose_row_skips_approval_is_held_and_never_sent(provider: FakeProvider) -> None:
    # given: a gated charge; a database writer marks it READY and rewrites its policy snapshot
    # so that it needs no approval (the arguments and their hash are untouched)
    intent = submit(arguments=charge_arguments(88_800))
    assert intent.status == S.AWAITING_APPROVAL
    edit_row(
        intent,
        "status = 'READY', approval_expires_at = NULL, policy = jsonb_set(policy, '{approval}', %s::jsonb)",
        ['"never"'],
    )
    # when: a worker runs it
    label = execute_intent(intent.id)
    # then: nothing was sent; held for a person, naming the policy
    assert label == "held" and provider.requests == []
    intent.refresh_from_db()
    assert intent.status == S.HELD and "stored policy" in intent.hold_reason


@pytest.mark.parametrize("kind", ["payments", "generic"])
def test_i11_2_an_edited_provider_key_is_held_and_never_sent(provider: FakeProvider, kind: str) -> None:
    # given: an intent that runs without approval; its provider idempotency key is rewritten
    action, arguments = (
        ("payments.charge", charge_arguments()) if kind == "payments" else ("acme.transfer", TRANSFER)
    )
    intent = submit(action=action, arguments=arguments)
    assert intent.status == S.READY
    edit_row(intent, "idempotency_key = %s", ["attacker-chosen-key"])
    # when
    label = execute_intent(intent.id)
    # then: the provider never saw the chosen key
    assert label == "held" and provider.requests == []
    intent.refresh_from_db()
    assert intent.status == S.HELD and "provider idempotency key" in intent.hold_reason


@pytest.mark.parametrize(
    ("action", "arguments", "column", "value"),
    [
        ("email.send", EMAIL, "arguments", json.dumps({**EMAIL, "to": "mallory@example.test"})),
        ("acme.transfer", TRANSFER, "arguments", json.dumps({**TRANSFER, "account": "acc_mallory"})),
        ("acme.transfer", TRANSFER, "reference", "order-other"),
    ],
    ids=["email-arguments", "generic-arguments", "generic-reference"],
)
def test_i11_2_an_edited_intent_of_another_kind_is_held_before_any_provider_call(
    provider: FakeProvider, action: str, arguments: dict[str, Any], column: str, value: str
) -> None:
    # given: a READY intent (no approval needed) edited in the database
    intent = submit(action=action, arguments=arguments, reference="order-1")
    assert intent.status == S.READY
    cast = "::jsonb" if column == "arguments" else ""
    edit_row(intent, f"{column} = %s{cast}", [value])
    # when
    label = execute_intent(intent.id)
    # then
    assert label == "held" and provider.requests == []
    intent.refresh_from_db()
    assert intent.status == S.HELD and intent.hold_reason.startswith(MISMATCH_HOLD)
    assert AuditEvent.objects.filter(intent=intent, event="request_hash_mismatch").count() == 1


def test_i11_2_an_unedited_intent_still_runs(provider: FakeProvider) -> None:
    # given / when
    intent = submit(action="email.send", arguments=EMAIL, reference="order-1")
    label = execute_intent(intent.id)
    # then: the re-derivation does not get in the way of an honest intent
    assert label == "succeeded" and len(provider.requests) == 1
    assert stored_request_problem(intent) is None


def test_i11_2_a_held_mismatch_is_never_released_only_rejected(provider: FakeProvider) -> None:
    # given: an intent held because its row was edited
    intent = submit(action="email.send", arguments=EMAIL)
    edit_row(intent, "arguments = %s::jsonb", [json.dumps({**EMAIL, "body": "pay me"})])
    assert execute_intent(intent.id) == "held"
    # when / then: a release is refused and changes nothing
    with pytest.raises(ResolutionRefused, match="request_hash mismatch"):
        intent_release_held(
            intent_id=intent.id, actor="user:otto", reason="looks fine", duplicate_risk_accepted=True
        )
    intent.refresh_from_db()
    assert intent.status == S.HELD
    # and a rejection ends it without effect
    intent_reject_held(intent_id=intent.id, actor="user:otto", reason="edited behind our back")
    intent.refresh_from_db()
    assert intent.status == S.REJECTED and provider.requests == []


def test_i11_2_rewriting_the_stored_hash_with_the_arguments_is_caught_by_the_audit_trail(
    provider: FakeProvider,
) -> None:
    # given: a writer who edits the arguments and stores their matching hash too
    intent = submit(action="email.send", arguments=EMAIL)
    edited = {**EMAIL, "to": "mallory@example.test"}
    forged = request_hash(
        tenant=intent.tenant,
        action=intent.action,
        action_version=intent.action_version,
        arguments=edited,
        reference=intent.reference,
        fingerprint_version=FINGERPRINT_VERSION,
    )
    edit_row(intent, "arguments = %s::jsonb, request_hash = %s", [json.dumps(edited), forged])
    # when
    label = execute_intent(intent.id)
    # then: the submitted audit event still records the original hash
    assert label == "held" and provider.requests == []
    intent.refresh_from_db()
    assert "submitted audit event" in intent.hold_reason


def test_i11_6_downgrading_the_fingerprint_version_to_drop_the_reference_is_caught(
    provider: FakeProvider,
) -> None:
    # given: a writer changes the reference and re-hashes under version 1 (which has none)
    intent = submit(action="acme.transfer", arguments=TRANSFER, reference="order-1")
    v1 = request_hash(
        tenant=intent.tenant,
        action=intent.action,
        action_version=intent.action_version,
        arguments=intent.arguments,
        reference="",
        fingerprint_version=1,
    )
    edit_row(intent, "reference = %s, fingerprint_version = 1, request_hash = %s", ["order-other", v1])
    # when
    label = execute_intent(intent.id)
    # then
    assert label == "held" and provider.requests == []


# --- item 3: one canonical form from submit to execution ---------------------------------------


def test_c13_i11_3_a_float_of_1e16_is_refused_at_submit_naming_the_field(
    api: APIClient, settings: Any
) -> None:
    # given: a generic action whose arguments carry an exchange rate of 1e16
    settings.EFFECT_LEDGER_GENERIC_HTTP = {"acme.transfer": {"url": "http://127.0.0.1:9/v1/transfers"}}
    body = {"action": "acme.transfer", "arguments": {**TRANSFER, "fx_rate": 1e16}}
    # when
    response = post(api, body)
    # then: a 422 problem naming the field; nothing stored
    assert response.status_code == 422, response.content
    problem = response.json()
    assert problem["code"] == "validation-failed"
    assert [error["field"] for error in problem["errors"]] == ["arguments.fx_rate"]
    assert "2^53" in problem["errors"][0]["message"]
    assert not Intent.objects.exists()


@pytest.fixture
def generic(settings: Any) -> None:
    """``acme.transfer`` on the generic HTTP adapter (no schema: any JSON object); nothing is sent."""
    settings.EFFECT_LEDGER_GENERIC_HTTP = {"acme.transfer": {"url": "http://127.0.0.1:9/v1/transfers"}}


@pytest.mark.parametrize("value", [1e16, -1e16, 1.5e300, 2**53, -(2**60)])
def test_i11_3_numbers_beyond_2_53_are_refused_nested_too(generic: None, value: float) -> None:
    # given / when / then
    with pytest.raises(ValidationFailed) as caught:
        submit(action="acme.transfer", arguments={**TRANSFER, "extra": {"list": [1, {"rate": value}]}})
    assert caught.value.extra["errors"][0]["field"] == "arguments.extra.list.1.rate"


SAFE_INT = 2**53 - 1
numbers = (
    st.integers(min_value=-(2**64), max_value=2**64)
    | st.sampled_from([SAFE_INT, -SAFE_INT, SAFE_INT + 1, -(SAFE_INT + 1), 0])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([1e16, 1.5e300, -0.0, 1e-7, 2.0, 5e-324, 9.1e15, 1e15, 0.1])
)
storable_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
json_leaves = st.none() | st.booleans() | numbers | storable_text
json_values = st.recursive(
    json_leaves,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(storable_text, children, max_size=4),
    max_leaves=12,
)


@hypothesis_settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(extra=json_values)
def test_i11_3_stored_arguments_round_trip_through_jsonb_and_hash_the_same(generic: None, extra: Any) -> None:
    """Either submit refuses the arguments, or what PostgreSQL gives back re-hashes to the
    request_hash they were submitted with (the real round trip: ``intent_submit`` writes the
    ``jsonb`` column, a fresh read brings it back)."""
    # given
    arguments = {**TRANSFER, "extra": extra}
    # when
    try:
        submitted = intent_submit(
            tenant="acme",
            principal="agent:agent-1",
            client_key=f"prop-{Intent.objects.count()}",
            action="acme.transfer",
            arguments=arguments,
        )
    except ValidationFailed as refused:
        # then (refused): only for a number the database would change or that has no canonical form
        errors = refused.extra.get("errors") or []
        assert errors and all("2^53" in e["message"] for e in errors), errors
        assert _has_unsafe_number(extra)
        return
    stored = Intent.objects.get(id=submitted.intent.id)
    # then (stored): the round trip keeps the canonical form, so the hash re-derives
    assert stored_request_problem(stored) is None, (arguments, stored.arguments)
    assert not _has_unsafe_number(extra)


def _has_unsafe_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return not math.isfinite(value) or abs(value) > SAFE_INT
    if isinstance(value, dict):
        return any(_has_unsafe_number(item) for item in value.values())
    if isinstance(value, list):
        return any(_has_unsafe_number(item) for item in value)
    return False


# --- item 6: reference is part of the request fingerprint --------------------------------------


def test_i11_6_same_key_with_another_reference_is_refused(api: APIClient) -> None:
    # given
    first = post(api, {"action": "payments.charge", "arguments": charge_arguments(), "reference": "order-1"})
    assert first.status_code == 201
    # when: the same key, the same arguments, another reference
    second = post(api, {"action": "payments.charge", "arguments": charge_arguments(), "reference": "order-2"})
    # then: refused like any other different request; the first intent is untouched
    assert second.status_code == 422, second.content
    assert second.json()["code"] == "idempotency-key-reused"
    assert Intent.objects.count() == 1
    assert Intent.objects.get().reference == "order-1"


def test_i11_6_same_key_same_reference_other_metadata_still_replays(api: APIClient) -> None:
    # given
    body = {"action": "payments.charge", "arguments": charge_arguments(), "reference": "order-1"}
    first = post(api, {**body, "metadata": {"attempt": 1}})
    # when
    second = post(api, {**body, "metadata": {"attempt": 2}})
    # then
    assert second.status_code == 201 and second["Idempotent-Replayed"] == "true"
    assert second.json()["intent_id"] == first.json()["intent_id"]


def test_i11_6_the_reference_changes_the_request_hash() -> None:
    base = {
        "tenant": "t",
        "action": "a",
        "action_version": 1,
        "arguments": {"x": 1},
        "fingerprint_version": 2,
    }
    assert request_hash(**base, reference="order-1") != request_hash(**base, reference="order-2")
    # version 1 (intents submitted before) never covered it
    assert request_hash(**{**base, "fingerprint_version": 1}, reference="order-1") == request_hash(
        **{**base, "fingerprint_version": 1}, reference="order-2"
    )


def test_i11_6_a_version_1_intent_replays_only_with_its_own_reference(api: APIClient) -> None:
    # given: an intent hashed before reference took part (as migration 0014 leaves old rows)
    body = {"action": "payments.charge", "arguments": charge_arguments(), "reference": "order-1"}
    intent = Intent.objects.get(id=post(api, body).json()["intent_id"])
    v1 = request_hash(
        tenant=intent.tenant,
        action=intent.action,
        action_version=intent.action_version,
        arguments=intent.arguments,
        reference="",
        fingerprint_version=1,
    )
    edit_row(intent, "fingerprint_version = 1, request_hash = %s", [v1])
    # when / then: the same request replays, another reference is refused
    same = post(api, body)
    assert same.status_code == 201 and same.json()["intent_id"] == str(intent.id)
    other = post(api, {**body, "reference": "order-2"})
    assert other.status_code == 422 and other.json()["code"] == "idempotency-key-reused"


@pytest.mark.parametrize("action", ["payments.charge", "email.send", "reservations.create", "acme.transfer"])
def test_i11_2_an_untouched_intent_under_a_policy_with_fractions_proves_itself(
    provider: FakeProvider, settings: Any, action: str
) -> None:
    # given: a policy whose numbers are fractions (they go through jsonb and back)
    settings.EFFECT_LEDGER_POLICIES = {
        action: {"retry": {"base_seconds": 0.1, "cap_seconds": 7.5}, "unknown_patience": {"seconds": 0.3}}
    }
    arguments = {
        "payments.charge": charge_arguments(),
        "email.send": EMAIL,
        "reservations.create": {
            "resource": "room-101",
            "start": "2030-01-01T10:00:00Z",
            "seats": 2,
            "reference": "b-1",
        },
        "acme.transfer": TRANSFER,
    }[action]
    intent = submit(action=action, arguments=arguments)
    intent.refresh_from_db()
    # then: no false alarm from the seal
    assert stored_request_problem(intent) is None
