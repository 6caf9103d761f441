"""Human approval of gated intents, bound to the exact request_hash (shared/cases C10, C11)."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from datetime import timedelta

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from operations import metrics
from operations.access.tenants import console_scope
from operations.audit.request_integrity import stored_request_problem
from operations.audit.trail import audit_append
from operations.exceptions import ApprovalRefused, ApprovalRequestLapsed, IntentMoved
from operations.models import Approval, Intent
from operations.policies.approval_validity import (
    Verdict,
    approval_required,
    approval_validity,
    user_principal,
)
from operations.policies.rules import Policy
from operations.selectors.duplicate_risk import duplicate_risk_of
from operations.services.refusals import refusals_audited
from operations.services.transitions import transition


def _check_decision(*, intent: Intent, policy: Policy, user: User, shown_hash: str, approving: bool) -> None:
    """Refuse a decision ``approval_validity`` refuses (the intent row is locked by the caller);
    an approval also when the stored request no longer hashes to its request_hash
    (``stored_request_problem``, issue 11 item 2). A rejection of such an intent is allowed:
    it ends it without effect.

    An intent of a tenant on which ``user`` holds no console role is refused as if it did not
    exist (issue 18 item 5): the answer never confirms another tenant's intent."""
    if not console_scope(user).allows(intent.tenant):
        raise ApprovalRefused(f"no intent {intent.id}")
    validity = approval_validity(intent, policy=policy, approver=user, request_hash=shown_hash)
    if validity.verdict == Verdict.NOT_AWAITING:
        raise IntentMoved(intent_id=intent.id, expected="AWAITING_APPROVAL", current=intent.status)
    if validity.verdict == Verdict.EXPIRED:
        raise ApprovalRequestLapsed(validity.reason)
    if not validity.usable:
        raise ApprovalRefused(validity.reason)
    problem = stored_request_problem(intent) if approving else None
    if problem:
        metrics.REQUEST_MISMATCHES.labels(stage="approval").inc()
        raise ApprovalRefused(f"This payload cannot be approved: {problem}. Reject it, or let it expire.")


@contextmanager
def _decision_transaction(intent_id: uuid.UUID) -> Iterator[None]:
    """The transaction of one approver's decision on ``intent_id``.

    A decision refused because the approval request lapsed (``ApprovalRequestLapsed``) expires
    the intent in this same transaction, which commits, and the refusal is raised after it: the
    refusal and the expiry are judged by one database clock reading (``now()`` is the
    transaction's start), so an approver is never told "expired" while the intent stays
    AWAITING_APPROVAL for the expiry sweep, whose own transaction may have started before the
    expiry (issue 35 item 5). Any other exception rolls everything back, as ``atomic`` does.
    """
    lapsed: ApprovalRequestLapsed | None = None
    with transaction.atomic():
        try:
            yield
        except ApprovalRequestLapsed as exc:  # raised by reads only: the transaction is usable
            intent_expire_approval(intent_id=intent_id)
            lapsed = exc
    if lapsed is not None:
        raise lapsed


#: The words of the confirmation the approval page asks for when a duplicate risk exists.
DUPLICATE_RISK_CONFIRMATION = "I have seen the other intents for this reference and approve a second effect"


def duplicate_risk_refusal(intent: Intent, others: list[Intent], *, shown: bool = False) -> str:
    """The refusal of an approval that did not accept the duplicate risk ``others`` pose;
    ``shown``: the approver accepted a list, and ``others`` were not on it (they appeared since)."""
    named = ", ".join(f"{other.id} ({other.status})" for other in others)
    if shown:
        return (
            f"since the page loaded, another {intent.action} for reference {intent.reference!r} "
            f"succeeded or came in flight: {named}. Reload the page and look at it before approving."
        )
    return (
        f"another {intent.action} for reference {intent.reference!r} already succeeded or is in flight: "
        f"{named}. Approving this one may apply the effect a second time. Tick "
        f'"{DUPLICATE_RISK_CONFIRMATION}" to approve anyway.'
    )


@refusals_audited("approve")
def intent_approve(
    *,
    intent_id: uuid.UUID,
    user: User,
    request_hash: str,
    reason: str = "",
    accepted_duplicates: Collection[uuid.UUID] = (),
    policy: Policy | None = None,
) -> Intent:
    """Record ``user``'s approval of the exact payload ``request_hash``; when enough approvers
    have approved (two for the critical tier), move the intent to READY and write its outbox
    message in the same transaction, so the decision and the dispatch commit together (C11).

    Args:
        request_hash: the hash the approver was shown; anything else is refused (C10).
        accepted_duplicates: the other intents of this tenant, action and reference that
            already had their effect or may still have it (``operations.selectors.duplicate_risk``)
            which the approver was shown and accepts a second effect beside (the page's ticked
            confirmation sends the ids it listed). Judged under the row lock, now: every such
            intent must be among them, so one that appeared after the page loaded (a succeeded
            charge, a released held intent) is refused like a changed payload (C10), not
            approved unseen. Recorded in the audit event.
        policy: the intent's policy snapshot as the caller already parsed it (the console's
            decision parses it once for the whole request, issue 34 item 4); None parses it
            here. A snapshot is fixed at submission, so the value cannot differ.

    Raises:
        ApprovalRefused: wrong hash, expired request, missing permission, own request, this
            approver already decided, the stored request no longer hashes to its
            request_hash (edited in the database, or arguments that no longer canonicalise), or
            a duplicate risk exists and was not accepted.
        IntentMoved: the intent is no longer awaiting approval.

    A refusal because the request expired expires the intent first (``_decision_transaction``).
    """
    with _decision_transaction(intent_id):
        # Lock the intent so concurrent approvers are counted one after the other.
        intent = Intent.objects.select_for_update().get(id=intent_id)
        policy = policy or Policy.from_snapshot(intent.policy)
        _check_decision(intent=intent, policy=policy, user=user, shown_hash=request_hash, approving=True)
        # Read under the lock: an earlier intent that succeeded while the page was open counts.
        others = duplicate_risk_of(intent)
        unseen = [other for other in others if other.id not in set(accepted_duplicates)]
        if unseen:
            raise ApprovalRefused(duplicate_risk_refusal(intent, unseen, shown=bool(accepted_duplicates)))
        accepted = {"duplicate_risk_accepted": [str(other.id) for other in others]} if others else {}
        ttl = timedelta(seconds=policy.approval_ttl_seconds)
        Approval.objects.create(
            intent=intent,
            request_hash=request_hash,
            approver=user,
            decision=Approval.Decision.APPROVED,
            reason=reason,
            expires_at=Now() + ttl,
            round=intent.approval_round,
        )
        validity = approval_validity(intent, policy=policy)
        approvals, required = validity.given, validity.required
        actor = user_principal(user)
        if validity.usable:
            moved = transition(
                intent_id=intent.id,
                from_status=Intent.Status.AWAITING_APPROVAL,
                to_status=Intent.Status.READY,
                actor=actor,
                event="approved",
                reason=reason,
                data={
                    "request_hash": request_hash,
                    "approvals": approvals,
                    **accepted,
                    # An approval after a ceiling was reached lets this one intent pass it.
                    **({"over_ceiling": True} if intent.wait_reason == "ceiling" else {}),
                },
                updates={
                    "wait_reason": "",
                    **({"ceiling_override": True} if intent.wait_reason == "ceiling" else {}),
                },
                dispatch=True,
            )
            if not moved:  # cannot happen under the row lock; never overwrite if it does
                raise IntentMoved(intent_id=intent.id, expected="AWAITING_APPROVAL", current="changed")
        else:
            audit_append(
                intent_id=intent.id,
                event="approval_recorded",
                actor=actor,
                reason=reason,
                data={"request_hash": request_hash, "approvals": approvals, "required": required, **accepted},
            )
    intent.refresh_from_db()
    return intent


@refusals_audited("reject")
def intent_reject(
    *, intent_id: uuid.UUID, user: User, request_hash: str, reason: str, policy: Policy | None = None
) -> Intent:
    """Reject a gated intent (terminal REJECTED); same checks as ``intent_approve``, ``policy``
    as there.

    Raises:
        ApprovalRefused, IntentMoved: as for ``intent_approve``; a reason is required.
    """
    if not reason.strip():
        raise ApprovalRefused("a rejection needs a reason")
    with _decision_transaction(intent_id):
        intent = Intent.objects.select_for_update().get(id=intent_id)
        _check_decision(
            intent=intent,
            policy=policy or Policy.from_snapshot(intent.policy),
            user=user,
            shown_hash=request_hash,
            approving=False,
        )
        Approval.objects.create(
            intent=intent,
            request_hash=request_hash,
            approver=user,
            decision=Approval.Decision.REJECTED,
            reason=reason,
            expires_at=Now(),
            round=intent.approval_round,
        )
        transition(
            intent_id=intent.id,
            from_status=Intent.Status.AWAITING_APPROVAL,
            to_status=Intent.Status.REJECTED,
            actor=user_principal(user),
            event="rejected",
            reason=reason,
            data={"request_hash": request_hash},
        )
    intent.refresh_from_db()
    return intent


def intent_expire_approval(*, intent_id: uuid.UUID) -> bool:
    """AWAITING_APPROVAL past its expiry -> EXPIRED (nothing executes). Returns True if moved.

    The expiry is part of the compare-and-swap and judged by the database clock, so an
    approval racing the expiry either lands first (READY) or finds EXPIRED.
    """
    return transition(
        intent_id=intent_id,
        from_status=Intent.Status.AWAITING_APPROVAL,
        to_status=Intent.Status.EXPIRED,
        actor="reconciler",
        event="approval_expired",
        where=Q(approval_expires_at__lte=Now()),
    )


def intent_mark_approvals_used(*, intent: Intent) -> int:
    """Stamp ``used_at`` on the approvals that let this attempt run (approved, on the intent's
    current request_hash, unexpired by the database clock, not stamped yet), right after the
    worker's re-check accepted them. An approval is used once: a later attempt of the same
    intent (a retry) is the same use and stamps nothing new. Returns how many were stamped;
    an intent whose policy needs no approval costs no statement.
    """
    if not approval_required(intent, Policy.from_snapshot(intent.policy)):
        return 0
    return Approval.objects.filter(
        intent=intent,
        round=intent.approval_round,
        decision=Approval.Decision.APPROVED,
        request_hash=intent.request_hash,
        expires_at__gt=Now(),
        used_at__isnull=True,
    ).update(used_at=Now())
