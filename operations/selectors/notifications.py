"""Who receives a notice, and whether it still matters (reads only; the writes are
``operations.services.notifications``)."""

from __future__ import annotations

from django.contrib.auth import get_user_model

from operations.access.tenants import users_holding
from operations.models import ENDED_WITHOUT_EFFECT, AuditEvent, Intent, Notification
from operations.policies.rules import Policy

#: Who handles an escalated intent: the roles that may resolve it
#: (``reconciliation.decision_checks.RESOLVER_GROUPS``; the ledger cannot import it, a test keeps
#: the two equal).
OPERATOR_ROLES = ("operator", "admin")

#: The notices about a request for approval (they lapse with the approval round).
APPROVAL_KINDS = frozenset({Notification.Kind.APPROVAL_REQUESTED, Notification.Kind.APPROVAL_EXPIRING})


def notification_recipients(notification: Notification) -> list[str]:
    """The email addresses a notice goes to, sorted and without repeats.

    An approval notice: the active users who may approve the intent by the rule the approval
    service applies (``operations.policies.approval_validity.can_approve``: the policy's approver group
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
    if notification.kind == Notification.Kind.EFFECT_FOUND_LATE:
        # The person whose decision ended it without effect is told too (issue 38).
        decider = ending_decider(intent)
        if decider:
            users = users | get_user_model().objects.filter(username=decider, is_active=True).exclude(
                email=""
            )
    return sorted({email.strip() for email in users.values_list("email", flat=True) if email.strip()})


def ending_decider(intent: Intent) -> str:
    """The username of the person whose decision ended ``intent`` without effect (the actor
    ``user:<name>`` of the last audit event that moved it into FAILED, REJECTED, EXPIRED or
    CANCELLED), or "" when no person did (a worker, the reconciler, an agent)."""
    actor = (
        AuditEvent.objects.filter(intent=intent, to_status__in=ENDED_WITHOUT_EFFECT)
        .order_by("-seq")
        .values_list("actor", flat=True)
        .first()
    )
    return actor.removeprefix("user:") if actor and actor.startswith("user:") else ""


#: The statuses an escalated intent waits in for the operators (``resolution.intent_escalate``):
#: UNKNOWN (the reconciler could not prove the outcome) and COMPENSATING (its compensation
#: failed, was rejected, expired or was cancelled).
ESCALATED_STATUSES = frozenset({Intent.Status.UNKNOWN, Intent.Status.COMPENSATING})


def notification_obsolete(notification: Notification, intent: Intent) -> str:
    """Why a notice no longer needs sending ("" when it does): an approval notice once the
    intent left AWAITING_APPROVAL or went into a newer approval round (it was decided, expired
    or cancelled; a new round has notices of its own); an escalation once the intent is no
    longer escalated: out of ``ESCALATED_STATUSES`` (resolved: confirmed SUCCEEDED, sent again,
    ended FAILED, compensated) or with ``escalated_at`` cleared. The status is the rule, not
    ``escalated_at`` alone: an operator's confirmation (``resolution.intent_resolve_found``)
    ends the intent SUCCEEDED and leaves ``escalated_at`` as it was."""
    if notification.kind == Notification.Kind.EFFECT_FOUND_LATE:
        return ""  # what the provider holds does not go away: always worth telling
    if notification.kind in APPROVAL_KINDS:
        if intent.status != Intent.Status.AWAITING_APPROVAL:
            return f"the intent is {intent.status}"
        if intent.approval_round != notification.approval_round:
            return "a newer approval round"
        return ""
    if intent.status not in ESCALATED_STATUSES:
        return f"the intent is {intent.status}"
    if intent.escalated_at is None:
        return "no longer escalated"
    return ""
