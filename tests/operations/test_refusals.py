"""Refused decisions leave a trace in the audit log (issue 11 item 4): who tried, what they were
shown, why it was refused, and nothing else of the decision."""

from __future__ import annotations

from typing import Any

import pytest
from django.db.models.functions import Now

from operations.audit.chain_checks import audit_verify
from operations.audit.trail import REFUSAL_EVENT
from operations.exceptions import ApprovalRefused, IntentMoved, ResolutionRefused
from operations.models import Approval, AuditEvent, Intent, OutboxMessage
from operations.selectors import last_audit_seq
from operations.services import (
    intent_approve,
    intent_cancel,
    intent_claim,
    intent_mark_unknown,
    intent_reject,
)
from reconciliation.resolution import resolve_absent
from tests.factories import UserFactory, charge_arguments, submit

pytestmark = pytest.mark.django_db


def gated(**kwargs: Any) -> Intent:
    intent = submit(arguments=charge_arguments(25_000), **kwargs)
    assert intent.status == Intent.Status.AWAITING_APPROVAL
    return intent


@pytest.fixture
def unknown_intent() -> Intent:
    """A payments.charge made UNKNOWN through the services (claimed, then an ambiguous answer)."""
    intent = submit(arguments=charge_arguments())
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None
    assert intent_mark_unknown(claim=claim, error="timeout after the request was sent", cause="ambiguous")
    return Intent.objects.get(id=intent.id)


def refusals(intent: Intent) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(intent=intent, event=REFUSAL_EVENT).order_by("seq"))


def assert_nothing_decided(intent: Intent) -> None:
    assert Intent.objects.get(id=intent.id).status == Intent.Status.AWAITING_APPROVAL
    assert not Approval.objects.filter(intent=intent).exists()
    assert not OutboxMessage.objects.filter(intent=intent).exists()


def test_i11_4_a_self_approval_is_refused_and_audited(approver: Any) -> None:
    # given: alice asked for the charge herself
    intent = gated(principal=f"user:{approver.username}")
    # when
    with pytest.raises(ApprovalRefused):
        intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    # then: one refusal event, by alice, with the hash she was shown and the reason
    (event,) = refusals(intent)
    assert event.actor == f"user:{approver.username}"
    assert event.data["decision"] == "approve"
    assert event.data["shown"] == {"request_hash": intent.request_hash}
    assert event.data["status"] == Intent.Status.AWAITING_APPROVAL
    assert "four eyes" in event.reason
    assert_nothing_decided(intent)
    assert list(audit_verify()) == []


def test_i11_4_a_tampered_hash_is_refused_and_audited_with_what_was_posted(approver: Any) -> None:
    intent = gated()
    with pytest.raises(ApprovalRefused, match="request_hash differs"):
        intent_approve(intent_id=intent.id, user=approver, request_hash="b" * 64)
    (event,) = refusals(intent)
    assert event.data["shown"] == {"request_hash": "b" * 64}
    assert event.data["request_hash"] == intent.request_hash
    assert_nothing_decided(intent)


def test_i11_4_an_expired_request_is_refused_and_audited(approver: Any) -> None:
    intent = gated()
    Intent.objects.filter(id=intent.id).update(approval_expires_at=Now())
    with pytest.raises((ApprovalRefused, IntentMoved)):
        intent_reject(intent_id=intent.id, user=approver, request_hash=intent.request_hash, reason="no")
    (event,) = refusals(intent)
    assert event.data["decision"] == "reject" and "expire" in event.reason
    assert not Approval.objects.filter(intent=intent).exists()


def test_i11_4_a_missing_permission_is_refused_and_audited() -> None:
    viewer = UserFactory(username="vera", groups=["viewer"])
    intent = gated()
    with pytest.raises(ApprovalRefused):
        intent_approve(intent_id=intent.id, user=viewer, request_hash=intent.request_hash)
    (event,) = refusals(intent)
    assert event.actor == "user:vera"
    assert_nothing_decided(intent)


def test_i11_4_an_agents_cancel_of_a_running_intent_is_refused_and_audited() -> None:
    intent = submit(arguments=charge_arguments())
    assert intent_claim(intent_id=intent.id, worker="w", lease_seconds=30) is not None
    with pytest.raises(IntentMoved):
        intent_cancel(intent_id=intent.id, actor="agent:agent-1", reason="changed my mind")
    (event,) = refusals(intent)
    assert event.actor == "agent:agent-1" and event.data["decision"] == "cancel"
    assert event.data["given_reason"] == "changed my mind"
    assert event.data["status"] == Intent.Status.RUNNING
    assert Intent.objects.get(id=intent.id).status == Intent.Status.RUNNING


def test_i11_4_a_stale_resolution_is_audited_and_does_not_make_other_pages_stale(
    unknown_intent: Intent,
) -> None:
    # given: two operators load the UNKNOWN item's page (the same seen_seq)
    otto = UserFactory(username="otto", groups=["operator"])
    olga = UserFactory(username="olga", groups=["operator"])
    seen_seq = last_audit_seq(unknown_intent.id)
    # when: otto posts a page state the intent never had, and is refused
    with pytest.raises(ResolutionRefused):
        resolve_absent(
            intent_id=unknown_intent.id,
            user=otto,
            reason="checked",
            accept_duplicate_risk=True,
            seen_seq=seen_seq - 1,
        )
    # then: the refusal is audited, and olga's page (seen_seq) is still current
    (event,) = refusals(unknown_intent)
    assert event.actor == "user:otto" and event.data["decision"] == "resolve absent"
    assert event.data["shown"] == {"seen_seq": seen_seq - 1}
    assert last_audit_seq(unknown_intent.id) == seen_seq
    resolved = resolve_absent(
        intent_id=unknown_intent.id,
        user=olga,
        reason="checked",
        accept_duplicate_risk=True,
        seen_seq=seen_seq,
    )
    assert resolved.status != Intent.Status.UNKNOWN
