"""One function answers "may this approval be used?" for the console, the approval service and
the worker's re-check (DESIGN.md, Approvals; shared/cases C10)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db.models.functions import Now

from operations.engine.protocol import execute_intent
from operations.models import Approval, Intent
from operations.policies.approval_validity import Verdict, approval_validity
from operations.services import intent_approve, intent_claim, intent_reject
from operations.services.execution import precheck_refusal
from tests.factories import UserFactory, charge_arguments, submit

pytestmark = pytest.mark.django_db


def gated(**kwargs: Any) -> Intent:
    intent = submit(arguments=charge_arguments(25_000), **kwargs)
    assert intent.status == Intent.Status.AWAITING_APPROVAL
    return intent


def critical(settings: Any) -> Intent:
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "payments.charge": {"risk_tier": "critical"},
    }
    return gated()


# --- the approvals on record: may the intent execute? ---


def test_missing_approval_is_not_usable() -> None:
    # when
    validity = approval_validity(gated())
    # then
    assert validity.verdict == Verdict.MISSING and not validity.usable
    assert "no approval" in validity.reason and (validity.given, validity.required) == (0, 1)


def test_an_approval_on_the_current_hash_is_usable(approver: Any) -> None:
    intent = gated()
    approved = intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    validity = approval_validity(approved)
    assert validity.verdict == Verdict.APPROVED and validity.usable and validity.reason == ""
    assert (validity.given, validity.required) == (1, 1)


def test_an_expired_approval_is_not_usable(approver: Any) -> None:
    # given
    intent = gated()
    intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    Approval.objects.filter(intent=intent).update(expires_at=Now())
    # when
    validity = approval_validity(Intent.objects.get(id=intent.id))
    # then
    assert validity.verdict == Verdict.EXPIRED and "expired" in validity.reason


def test_an_approval_of_another_payload_is_not_usable(approver: Any) -> None:
    # given: approved on payload A, then the stored payload became B
    intent = gated()
    intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    Intent.objects.filter(id=intent.id).update(request_hash="b" * 64)
    # when
    validity = approval_validity(Intent.objects.get(id=intent.id))
    # then
    assert validity.verdict == Verdict.OTHER_HASH and "request_hash" in validity.reason


def test_critical_needs_two_different_approvers(settings: Any, approver: Any, second_approver: Any) -> None:
    # given
    intent = critical(settings)
    # when
    after_one = intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    one = approval_validity(after_one)
    after_two = intent_approve(intent_id=intent.id, user=second_approver, request_hash=intent.request_hash)
    two = approval_validity(after_two)
    # then
    assert one.verdict == Verdict.TOO_FEW and "1 of 2" in one.reason and "critical" in one.reason
    assert two.verdict == Verdict.APPROVED and after_two.status == Intent.Status.READY


def test_worker_refuses_a_critical_intent_when_one_of_its_two_approvals_expired(
    settings: Any, approver: Any, second_approver: Any
) -> None:
    # given: approved by two people, then the first approval expired before a worker came
    intent = critical(settings)
    intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    intent_approve(intent_id=intent.id, user=second_approver, request_hash=intent.request_hash)
    Approval.objects.filter(intent=intent, approver=approver).update(expires_at=Now())
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None
    # when / then
    refusal = precheck_refusal(claim.intent)
    assert refusal is not None and "1 of 2" in refusal.reason


def test_a_rejected_intent_is_not_usable(approver: Any) -> None:
    intent = gated()
    rejected = intent_reject(
        intent_id=intent.id, user=approver, request_hash=intent.request_hash, reason="no"
    )
    validity = approval_validity(rejected)
    assert validity.verdict == Verdict.REJECTED and not validity.usable


def test_no_approval_is_needed_when_the_snapshot_needs_none() -> None:
    validity = approval_validity(submit(arguments=charge_arguments(500)))
    assert validity.verdict == Verdict.NOT_NEEDED and validity.usable


def test_the_snapshot_decides_how_many_approvers_not_the_policy_now(settings: Any, approver: Any) -> None:
    # given: submitted when one approver sufficed; the action is made critical afterwards
    intent = gated()
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "payments.charge": {"risk_tier": "critical"},
    }
    # when
    approved = intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    # then
    assert approved.status == Intent.Status.READY and approval_validity(approved).required == 1


# --- a person about to decide: may they? ---


def test_an_approver_may_decide_on_the_payload_shown(approver: Any) -> None:
    intent = gated()
    validity = approval_validity(intent, approver=approver, request_hash=intent.request_hash)
    assert validity.verdict == Verdict.MAY_DECIDE and validity.usable and validity.reason == ""


@pytest.mark.parametrize(
    ("case", "verdict", "words"),
    [
        ("no_permission", Verdict.NO_PERMISSION, "not in the 'approver' group"),
        ("own_request", Verdict.OWN_REQUEST, "four eyes"),
        ("shown_other_hash", Verdict.OTHER_HASH, "request_hash differs"),
        ("request_expired", Verdict.EXPIRED, "expired"),
        ("already_decided", Verdict.ALREADY_DECIDED, "already decided"),
        ("not_awaiting", Verdict.NOT_AWAITING, "no longer awaiting approval"),
    ],
)
def test_a_decision_is_refused_with_the_reason(
    case: str, verdict: Verdict, words: str, settings: Any, approver: Any, second_approver: Any
) -> None:
    # given
    user, shown = approver, None
    if case == "already_decided":
        intent = critical(settings)
        intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    elif case == "own_request":
        user = UserFactory(username="rita", groups=["approver"])
        intent = gated(principal="user:rita")
    else:
        intent = gated()
    if case == "no_permission":
        user = UserFactory(groups=["viewer"])
    elif case == "shown_other_hash":
        shown = "a" * 64
    elif case == "request_expired":
        Intent.objects.filter(id=intent.id).update(approval_expires_at=Now())
    elif case == "not_awaiting":
        intent_approve(intent_id=intent.id, user=second_approver, request_hash=intent.request_hash)
    intent = Intent.objects.get(id=intent.id)
    # when
    validity = approval_validity(intent, approver=user, request_hash=shown or intent.request_hash)
    # then
    assert validity.verdict == verdict and not validity.usable and words in validity.reason


def test_approvals_are_stamped_used_when_the_worker_runs_the_intent(sandbox: Any, approver: Any) -> None:
    # given: an approved gated charge, never run yet
    intent = submit(arguments=charge_arguments(25_000))
    intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    assert Approval.objects.get(intent=intent).used_at is None
    # when
    assert execute_intent(intent.id) == "succeeded"
    # then
    assert Approval.objects.get(intent=intent).used_at is not None


def test_i11_5_two_different_users_satisfy_a_two_approver_rule(
    settings: Any, approver: Any, second_approver: Any
) -> None:
    # given: a critical intent (two different approvers) and a first approval
    intent = critical(settings)
    intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
    assert approval_validity(Intent.objects.get(id=intent.id)).verdict == Verdict.TOO_FEW
    # when: the first approver is renamed, and a different user approves
    approver.username = "alice.renamed"
    approver.save()
    approved = intent_approve(intent_id=intent.id, user=second_approver, request_hash=intent.request_hash)
    # then: two different accounts, whatever their names, satisfy the rule
    validity = approval_validity(approved)
    assert (approved.status, validity.verdict, validity.given) == ("READY", Verdict.APPROVED, 2)
