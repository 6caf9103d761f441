"""Human approval of gated intents, bound to the exact request_hash (shared/cases C10, C11)."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from operations.exceptions import ApprovalRefused, IntentMoved
from operations.models import Approval, Intent
from operations.policies import Policy
from operations.services.transitions import transition


def user_principal(user: User) -> str:
    """The principal string of a console user, ``user:<username>``."""
    return f"user:{user.get_username()}"


def can_approve(user: User, intent: Intent) -> bool:
    """Whether ``user`` holds the permission the intent's policy names (its approver group,
    or the admin group, or superuser)."""
    if not user.is_active:
        return False
    if getattr(user, "is_superuser", False):
        return True
    group = Policy.from_snapshot(intent.policy).approver_group
    return user.groups.filter(name__in=[group, "admin"]).exists()


def _check_decision(*, intent: Intent, user: User, shown_hash: str) -> None:
    policy = Policy.from_snapshot(intent.policy)
    if not can_approve(user, intent):
        raise ApprovalRefused(f"you are not in the '{policy.approver_group}' group for {intent.action}")
    if policy.four_eyes and intent.principal == user_principal(user):
        raise ApprovalRefused("you requested this intent; someone else must approve it (four eyes)")
    if intent.status != Intent.Status.AWAITING_APPROVAL:
        raise IntentMoved(intent_id=intent.id, expected="AWAITING_APPROVAL", current=intent.status)
    if shown_hash != intent.request_hash:
        raise ApprovalRefused(
            "the payload you reviewed is not this intent's current payload (request_hash differs); "
            "reload and review it again"
        )
    expired = Intent.objects.filter(id=intent.id, approval_expires_at__lte=Now()).exists()
    if expired:
        raise ApprovalRefused("this approval request has expired; the agent must submit again")


def intent_approve(*, intent_id: uuid.UUID, user: User, request_hash: str, reason: str = "") -> Intent:
    """Record ``user``'s approval of the exact payload ``request_hash``; when enough approvers
    have approved (two for the critical tier), move the intent to READY and write its outbox
    message in the same transaction, so the decision and the dispatch commit together (C11).

    Args:
        request_hash: the hash the approver was shown; anything else is refused (C10).

    Raises:
        ApprovalRefused: wrong hash, expired request, missing permission, own request, or this
            approver already decided.
        IntentMoved: the intent is no longer awaiting approval.
    """
    with transaction.atomic():
        # Lock the intent so concurrent approvers are counted one after the other.
        intent = Intent.objects.select_for_update().get(id=intent_id)
        _check_decision(intent=intent, user=user, shown_hash=request_hash)
        if Approval.objects.filter(intent=intent, approver=user).exists():
            raise ApprovalRefused("you already decided on this intent; a second approver is needed")
        policy = Policy.from_snapshot(intent.policy)
        ttl = timedelta(seconds=policy.approval_ttl_seconds)
        Approval.objects.create(
            intent=intent,
            request_hash=request_hash,
            approver=user,
            decision=Approval.Decision.APPROVED,
            reason=reason,
            expires_at=Now() + ttl,
        )
        approvals = Approval.objects.filter(
            intent=intent, request_hash=intent.request_hash, decision=Approval.Decision.APPROVED
        ).count()
        required = policy.approvals_required
        actor = user_principal(user)
        if approvals >= required:
            moved = transition(
                intent_id=intent.id,
                from_status=Intent.Status.AWAITING_APPROVAL,
                to_status=Intent.Status.READY,
                actor=actor,
                event="approved",
                reason=reason,
                data={"request_hash": request_hash, "approvals": approvals},
                dispatch=True,
            )
            if not moved:  # cannot happen under the row lock; never overwrite if it does
                raise IntentMoved(intent_id=intent.id, expected="AWAITING_APPROVAL", current="changed")
        else:
            from operations.audit import audit_append

            audit_append(
                intent_id=intent.id,
                event="approval_recorded",
                actor=actor,
                reason=reason,
                data={"request_hash": request_hash, "approvals": approvals, "required": required},
            )
    intent.refresh_from_db()
    return intent


def intent_reject(*, intent_id: uuid.UUID, user: User, request_hash: str, reason: str) -> Intent:
    """Reject a gated intent (terminal REJECTED); same checks as ``intent_approve``.

    Raises:
        ApprovalRefused, IntentMoved: as for ``intent_approve``; a reason is required.
    """
    if not reason.strip():
        raise ApprovalRefused("a rejection needs a reason")
    with transaction.atomic():
        intent = Intent.objects.select_for_update().get(id=intent_id)
        _check_decision(intent=intent, user=user, shown_hash=request_hash)
        Approval.objects.create(
            intent=intent,
            request_hash=request_hash,
            approver=user,
            decision=Approval.Decision.REJECTED,
            reason=reason,
            expires_at=Now(),
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
