"""Approvals bind to the exact request_hash, expire, respect four eyes, and commit with the
dispatch (shared/cases C10, C11)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now

from operations.exceptions import ApprovalRefused, IntentMoved
from operations.models import Approval, AuditEvent, Intent, OutboxMessage
from operations.services import (
    intent_approve,
    intent_claim,
    intent_expire_approval,
    intent_mark_unknown,
    intent_reject,
)
from operations.services.execution import precheck_refusal
from reconciliation.resolution import resolve_compensate
from tests.factories import UserFactory, charge_arguments, submit

pytestmark = pytest.mark.django_db


def gated(**kwargs: Any) -> Intent:
    intent = submit(arguments=charge_arguments(25_000), **kwargs)
    assert intent.status == Intent.Status.AWAITING_APPROVAL
    return intent


def test_approve_moves_to_ready_and_writes_outbox_in_one_step(approver: Any) -> None:
    # given
    intent = gated()
    # when
    approved = intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    # then: the decision and the dispatch committed together (C11)
    assert approved.status == Intent.Status.READY
    assert OutboxMessage.objects.filter(intent=intent, acked_at__isnull=True).count() == 1
    approval = Approval.objects.get(intent=intent)
    assert approval.request_hash == intent.request_hash and approval.decision == "approved"


def test_c10_approval_for_another_payload_is_refused(approver: Any) -> None:
    # given: the approver reviewed payload A; the intent's hash is something else
    intent = gated()
    other = submit(arguments=charge_arguments(26_000))
    # when / then
    with pytest.raises(ApprovalRefused, match="request_hash differs"):
        intent_approve(intent_id=intent.id, user=approver, request_hash=other.request_hash)
    assert Intent.objects.get(id=intent.id).status == Intent.Status.AWAITING_APPROVAL
    assert not Approval.objects.exists() and not OutboxMessage.objects.filter(intent=intent).exists()


def test_c10_worker_recheck_refuses_when_payload_changed_after_approval(approver: Any) -> None:
    # given: approved on payload A, then (by a bug or an attack) the stored payload became B
    intent = gated()
    intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    Intent.objects.filter(id=intent.id).update(request_hash="b" * 64)
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None
    # when
    refusal = precheck_refusal(claim.intent)
    # then
    assert refusal is not None and "request_hash" in refusal.reason


def test_recheck_refuses_an_expired_approval(approver: Any) -> None:
    # given
    intent = gated()
    intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    Approval.objects.filter(intent=intent).update(expires_at=Now())
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None
    # when / then
    refusal = precheck_refusal(claim.intent)
    assert refusal is not None and "expired" in refusal.reason


def test_recheck_passes_a_valid_approval(approver: Any) -> None:
    intent = gated()
    intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None and precheck_refusal(claim.intent) is None


def test_requester_cannot_approve_own_intent() -> None:
    # given: a user who is both approver and the requester
    alice = UserFactory(username="alice", groups=["approver"])
    intent = gated(principal="user:alice")
    # when / then
    with pytest.raises(ApprovalRefused, match="four eyes"):
        intent_approve(intent_id=intent.id, user=alice, request_hash=intent.request_hash)


def test_user_without_approver_group_is_refused() -> None:
    viewer = UserFactory(groups=["viewer"])
    intent = gated()
    with pytest.raises(ApprovalRefused, match="not in the 'approver' group"):
        intent_approve(intent_id=intent.id, user=viewer, request_hash=intent.request_hash)


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_i35_5_a_decision_refused_for_expiry_expires_the_intent_in_its_own_transaction(
    approver: Any, decision: str
) -> None:
    # given: the request lapsed by the database clock, and no expiry sweep has run
    intent = gated()
    Intent.objects.filter(id=intent.id).update(approval_expires_at=Now())
    # when
    with pytest.raises(ApprovalRefused, match="expired"):
        if decision == "approve":
            intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
        else:
            intent_reject(intent_id=intent.id, user=approver, request_hash=intent.request_hash, reason="no")
    # then: the answer and the state agree; the sweep finds nothing left to do
    assert Intent.objects.get(id=intent.id).status == Intent.Status.EXPIRED
    events = list(AuditEvent.objects.filter(intent_id=intent.id).values_list("event", flat=True))
    assert "approval_expired" in events
    assert not Approval.objects.filter(intent=intent).exists()
    assert intent_expire_approval(intent_id=intent.id) is False


def test_unexpired_request_does_not_expire() -> None:
    intent = gated()
    assert intent_expire_approval(intent_id=intent.id) is False
    assert Intent.objects.get(id=intent.id).status == Intent.Status.AWAITING_APPROVAL


def test_critical_tier_needs_two_different_approvers(
    settings: Any, approver: Any, second_approver: Any
) -> None:
    # given
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "email.send": {"risk_tier": "critical"},
    }
    intent = submit(action="email.send", arguments={"to": "a@b.c", "subject": "s", "body": "b"})
    assert intent.status == Intent.Status.AWAITING_APPROVAL and intent.policy["approvals_required"] == 2
    # when
    after_one = intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    with pytest.raises(ApprovalRefused, match="already decided"):
        intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    after_two = intent_approve(intent_id=intent.id, user=second_approver, request_hash=intent.request_hash)
    # then
    assert after_one.status == Intent.Status.AWAITING_APPROVAL
    assert after_two.status == Intent.Status.READY


def test_reject_needs_a_reason_and_is_terminal(approver: Any, second_approver: Any) -> None:
    intent = gated()
    with pytest.raises(ApprovalRefused, match="reason"):
        intent_reject(intent_id=intent.id, user=approver, request_hash=intent.request_hash, reason=" ")
    rejected = intent_reject(
        intent_id=intent.id, user=approver, request_hash=intent.request_hash, reason="too much"
    )
    assert rejected.status == Intent.Status.REJECTED
    with pytest.raises(IntentMoved):
        intent_approve(intent_id=intent.id, user=second_approver, request_hash=intent.request_hash)


def test_policy_snapshot_survives_a_config_change(settings: Any) -> None:
    # given an intent submitted under the default policy
    intent = submit(arguments=charge_arguments(5_000))
    # when the threshold is lowered afterwards
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "payments.charge": {"approval": "above_amount", "approval_threshold_minor": {"EUR": 100}},
    }
    # then the intent in flight keeps its snapshot
    intent.refresh_from_db()
    assert intent.policy["approval_threshold_minor"]["EUR"] == 10_000
    assert intent.status == Intent.Status.READY
    assert submit(arguments=charge_arguments(5_000)).status == Intent.Status.AWAITING_APPROVAL


def test_approval_request_expires_after_the_policy_ttl() -> None:
    # when
    intent = gated()
    # then: 600 s by the database clock (created_at is the app clock; allow a little skew)
    assert intent.policy["approval_ttl_seconds"] == 600
    assert intent.approval_expires_at is not None
    assert 595 <= (intent.approval_expires_at - intent.created_at).total_seconds() <= 605


def test_i11_5_a_renamed_account_cannot_approve_its_own_request() -> None:
    # given: mallory, an operator who may also approve, compensates an UNKNOWN charge; the refund
    # that opens needs an approver (payments.refund policy)
    mallory = UserFactory(username="mallory", groups=["operator", "approver"])
    charge = submit()
    claim = intent_claim(intent_id=charge.id, worker="w", lease_seconds=30)
    assert claim is not None and intent_mark_unknown(claim=claim, error="response lost", cause="ambiguous")
    resolve_compensate(
        intent_id=charge.id, user=mallory, reason="customer cancelled", provider_reference="ch_1"
    )
    refund = Intent.objects.get(compensates=charge)
    assert (refund.action, refund.status) == ("payments.refund", "AWAITING_APPROVAL")
    # when: her account is renamed, so her name no longer matches the refund's principal
    mallory.username = "mallory.smith"
    mallory.save()
    # then: she is still the account that asked (four eyes by user id)
    with pytest.raises(ApprovalRefused, match="four eyes"):
        intent_approve(intent_id=refund.id, user=mallory, request_hash=refund.request_hash)
    assert Intent.objects.get(id=refund.id).status == Intent.Status.AWAITING_APPROVAL
    assert not Approval.objects.filter(intent=refund).exists()
    # ... and someone who took her old name is not her
    newcomer = UserFactory(username="mallory", groups=["approver"])
    assert (
        intent_approve(intent_id=refund.id, user=newcomer, request_hash=refund.request_hash).status == "READY"
    )


@pytest.mark.django_db(transaction=True)
def test_i35_5_the_expiry_commits_although_the_decision_is_refused(approver: Any) -> None:
    # given: real commits (no test transaction around the service)
    intent = gated()
    Intent.objects.filter(id=intent.id).update(approval_expires_at=Now())
    # when
    with pytest.raises(ApprovalRefused, match="expired"):
        intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    # then: read on a fresh connection, the expiry was committed with the refusal's clock
    connection.close()
    assert Intent.objects.get(id=intent.id).status == Intent.Status.EXPIRED
    assert AuditEvent.objects.filter(intent_id=intent.id, event="approval_expired").count() == 1
