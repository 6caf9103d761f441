"""Who receives a notice, and whether it still matters (reads only; the writes are
``operations.services.notifications``)."""

from __future__ import annotations

from operations.models import Intent, Notification
from operations.policies import Policy
from operations.tenant_access import users_holding

#: Who handles an escalated intent: the roles that may resolve it
#: (``reconciliation.resolution.RESOLVER_GROUPS``; the ledger cannot import it, a test keeps
#: the two equal).
OPERATOR_ROLES = ("operator", "admin")

#: The notices about a request for approval (they lapse with the approval round).
APPROVAL_KINDS = frozenset({Notification.Kind.APPROVAL_REQUESTED, Notification.Kind.APPROVAL_EXPIRING})


def notification_recipients(notification: Notification) -> list[str]:
    """The email addresses a notice goes to, sorted and without repeats.

    An approval notice: the active users who may approve the intent by the rule the approval
    service applies (``operations.approval_validity.can_approve``: the policy's approver group
    or ``admin`` on the intent's tenant or on every tenant, or a superuser), except the person
    who asked for it (four eyes: they cannot approve it). An escalation: the active users who
    may resolve it (``OPERATOR_ROLES`` on its tenant). Users without an email address are
    left out.
    """
    intent = notification.intent
    if notification.kind in APPROVAL_KINDS:
        roles = [Policy.from_snapshot(intent.policy).approver_group, "admin"]
    else:
        roles = list(OPERATOR_ROLES)
    users = users_holding(roles, intent.tenant).exclude(email="")
    if notification.kind in APPROVAL_KINDS and intent.requested_by_id is not None:
        users = users.exclude(id=intent.requested_by_id)
    return sorted({email.strip() for email in users.values_list("email", flat=True) if email.strip()})


def notification_obsolete(notification: Notification, intent: Intent) -> str:
    """Why a notice no longer needs sending ("" when it does): an approval notice once the
    intent left AWAITING_APPROVAL or went into a newer approval round (it was decided, expired
    or cancelled; a new round has notices of its own); an escalation once the intent is out of
    the operators' queue (``escalated_at`` cleared by a resolution)."""
    if notification.kind in APPROVAL_KINDS:
        if intent.status != Intent.Status.AWAITING_APPROVAL:
            return f"the intent is {intent.status}"
        if intent.approval_round != notification.approval_round:
            return "a newer approval round"
        return ""
    if intent.escalated_at is None:
        return "no longer escalated"
    return ""
