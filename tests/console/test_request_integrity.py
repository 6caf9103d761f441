"""The console with intents whose stored request no longer proves itself (issue 11 items 2, 3):
the pages render and say why, Approve and Release are refused, and nothing moves."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from operations.engine.protocol import execute_intent
from operations.models import Approval, AuditEvent, Intent
from operations.selectors import last_audit_seq
from operations.services import submission
from tests.console.conftest import signed_in
from tests.factories import submit
from tests.support.fake_provider import FakeProvider

pytestmark = pytest.mark.django_db

S = Intent.Status
HTMX = {"HTTP_HX_REQUEST": "true"}

#: One action of every kind (payments, email, reservations, generic HTTP) and an edit of it.
KINDS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "payments": (
        "payments.charge",
        {"amount": 50_000, "currency": "EUR", "customer": "cus_42"},
        {"amount": 4_999_999},
    ),
    "email": (
        "email.send",
        {"to": "ana@example.test", "subject": "Receipt", "body": "Thanks"},
        {"to": "x@evil.test"},
    ),
    "reservations": (
        "reservations.create",
        {"resource": "room-101", "start": "2030-01-01T10:00:00Z", "seats": 2, "reference": "booking-1"},
        {"seats": 200},
    ),
    "generic": (
        "acme.transfer",
        {"amount": 1250, "currency": "USD", "account": "acc_9"},
        {"account": "acc_evil"},
    ),
}


@pytest.fixture
def gate_everything(settings: Any, fake_provider: FakeProvider) -> FakeProvider:
    """Every kind needs an approval; every provider is the fake one (which records requests)."""
    settings.EFFECT_LEDGER_GENERIC_HTTP = {"acme.transfer": {"url": f"{fake_provider.url}/v1/transfers"}}
    settings.SANDBOX_PROVIDER_URL = fake_provider.url
    settings.EFFECT_LEDGER_POLICIES = {
        action: {"approval": "always", "approval_ttl_seconds": 600} for action, _, _ in KINDS.values()
    }
    return fake_provider


def edit_arguments(intent: Intent, arguments: dict[str, Any]) -> None:
    """A database writer's edit of the stored arguments, behind the ledger's back."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE operations_intent SET arguments = %s::jsonb WHERE id = %s",
            [json.dumps(arguments), intent.id],
        )


def approve(client: Client, intent: Intent, **extra: Any) -> Any:
    return client.post(
        reverse("approval-approve", args=[intent.id]),
        {"request_hash": intent.request_hash, "reason": "looks right"},
        **extra,
    )


@pytest.mark.parametrize("kind", list(KINDS))
def test_i11_2_the_approval_page_shows_an_edited_payload_and_approve_is_refused(
    gate_everything: FakeProvider, approver_client: Client, kind: str
) -> None:
    # given: a gated intent of this kind, edited in the database while it awaits approval
    action, arguments, edit = KINDS[kind]
    intent = submit(action=action, arguments=arguments)
    assert intent.status == S.AWAITING_APPROVAL
    edit_arguments(intent, {**arguments, **edit})
    # when
    page = approver_client.get(reverse("approval-detail", args=[intent.id]))
    # then: the page renders, says why, and offers no Approve form (Reject stays)
    body = page.content.decode()
    assert page.status_code == 200
    assert 'id="integrity-problem"' in body and "request_hash mismatch" in body
    assert 'id="preview-untrusted"' in body
    assert reverse("approval-approve", args=[intent.id]) not in body
    assert reverse("approval-reject", args=[intent.id]) in body
    # when: the approval is posted anyway (the hash the page showed)
    for extra in ({}, HTMX):
        response = approve(approver_client, intent, **extra)
        # then: refused with the reason, nothing moved or recorded
        assert response.status_code == 403
        assert "request_hash mismatch" in response.content.decode()
    intent.refresh_from_db()
    assert intent.status == S.AWAITING_APPROVAL
    assert not Approval.objects.filter(intent=intent).exists()
    assert gate_everything.requests == []


def test_c13_i11_3_an_intent_stored_with_1e16_renders_and_approve_is_refused(
    gate_everything: FakeProvider, approver_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: a generic intent stored with "fx_rate": 1e16 before submit refused it (the number
    # check switched off); PostgreSQL gives it back as the integer 10000000000000000
    monkeypatch.setattr(submission, "check_storable", lambda **values: None)
    intent = submit(action="acme.transfer", arguments={"amount": 1250, "currency": "USD", "fx_rate": 1e16})
    monkeypatch.undo()
    intent.refresh_from_db()
    assert intent.arguments["fx_rate"] == 10**16 and isinstance(intent.arguments["fx_rate"], int)
    events = AuditEvent.objects.filter(intent=intent).count()
    # when
    page = approver_client.get(reverse("approval-detail", args=[intent.id]))
    # then: no 500; the page says the stored arguments have no canonical form
    body = page.content.decode()
    assert page.status_code == 200
    assert 'id="canonical-error"' in body and 'id="integrity-problem"' in body
    # when: Approve is posted, as a page and as htmx
    for extra in ({}, HTMX):
        response = approve(approver_client, intent, **extra)
        # then: refused (no 500) and the intent has not moved
        assert response.status_code == 403, response.content[:500]
        assert "cannot be canonicalised" in response.content.decode()
    intent.refresh_from_db()
    assert intent.status == S.AWAITING_APPROVAL
    assert not Approval.objects.filter(intent=intent).exists()
    refusals = AuditEvent.objects.filter(intent=intent, seq__gt=events)
    assert [e.event for e in refusals] == ["decision_refused", "decision_refused"]  # item 4


def test_i11_2_an_intent_held_for_a_mismatch_shows_in_the_console_and_is_not_released(
    gate_everything: FakeProvider, approver: Any, operator_client: Client, settings: Any
) -> None:
    # given: an email that needs no approval, edited in the database, then run by a worker
    settings.EFFECT_LEDGER_POLICIES = {}
    action, arguments, edit = KINDS["email"]
    intent = submit(action=action, arguments=arguments)
    edit_arguments(intent, {**arguments, **edit})
    assert execute_intent(intent.id) == "held"
    # when / then: the operators' queue, the held page and the intent page show why
    queue = operator_client.get(reverse("unknown")).content.decode()
    assert str(intent.id) in queue and "request_hash mismatch" in queue
    held = operator_client.get(reverse("held-detail", args=[intent.id])).content.decode()
    assert 'id="hold-reason"' in held and "request_hash mismatch" in held
    detail = operator_client.get(reverse("intent-detail", args=[intent.id])).content.decode()
    assert "request_hash mismatch" in detail
    dashboard = operator_client.get(reverse("dashboard")).content.decode()
    assert 'id="held-request-mismatch">1<' in dashboard and 'id="held-unserved"' not in dashboard
    # when: an operator tries to release it
    response = operator_client.post(
        reverse("held-resolve", args=[intent.id, "release"]),
        {"reason": "looks fine", "accept_duplicate_risk": "on", "seen_seq": last_audit_seq(intent.id)},
        **HTMX,
    )
    # then: refused in place; it stays HELD and nothing was sent
    assert response.status_code == 409 and "request_hash mismatch" in response.content.decode()
    intent.refresh_from_db()
    assert intent.status == S.HELD and gate_everything.requests == []


def test_i11_3_a_decision_whose_answer_fails_to_render_leaves_nothing_changed(
    gate_everything: FakeProvider, approver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: a gated charge, and a page that fails while answering the approval
    action, arguments, _ = KINDS["payments"]
    intent = submit(action=action, arguments=arguments)
    from console.views import approvals

    real = approvals.detail_context

    def failing(request: Any, decided: Intent, **extra: Any) -> Any:
        if extra.get("success"):
            raise RuntimeError("the answer cannot be rendered")
        return real(request, decided, **extra)

    monkeypatch.setattr(approvals, "detail_context", failing)
    client = signed_in(approver)
    client.raise_request_exception = False
    # when
    response = approve(client, intent, **HTMX)
    # then: a 500, but the approval was rolled back with it
    assert response.status_code == 500
    intent.refresh_from_db()
    assert intent.status == S.AWAITING_APPROVAL
    assert not Approval.objects.filter(intent=intent).exists()
