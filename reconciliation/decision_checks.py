"""Who may decide on an intent an operator works, and what every such decision checks and records
first (``reconciliation.resolution``, ``reconciliation.findings``): the role, a reason, the
tenant, the intent's state and the page's age; then the ``Evidence`` row of the decision.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth.models import User

from operations import services
from operations.access.tenants import console_scope, role_scope
from operations.adapters.registry import ActionUnavailable, capabilities_for, serving_problem
from operations.audit.trail import NOT_A_CHANGE_EVENTS
from operations.exceptions import IntentMoved, ResolutionRefused
from operations.models import AuditEvent, Intent
from operations.selectors import last_audit_seq
from reconciliation.models import Evidence
from reconciliation.selectors import effect_on_record, intent_evidence

#: The groups whose members may decide on UNKNOWN, HELD and escalated intents and on findings.
RESOLVER_GROUPS = ("operator", "admin")


def can_resolve(user: User, tenant: str | None = None) -> bool:
    """Operators and admins (and superusers) may resolve UNKNOWN intents: on ``tenant`` when
    named, else on at least one tenant (``operations.access.tenants``)."""
    scope = role_scope(user, RESOLVER_GROUPS)
    return not scope.empty if tenant is None else scope.allows(tenant)


def compensate_refusal(intent: Intent) -> str | None:
    """Why ``compensate`` cannot apply to ``intent``, or None when it can: what the capability
    model (``Capabilities.compensation_action``, declared by the action's adapter) says.

    It cannot apply when this deployment does not serve the action (its capabilities cannot be
    read), when the provider contract declares no compensation (an email cannot be unsent), or
    when that compensation action is not served here. The same answer hides the verb on the
    console's page and refuses it in ``reconciliation.resolution.resolve_compensate``.
    """
    try:
        compensation = capabilities_for(intent.action).compensation_action
    except ActionUnavailable:
        # The wording of ``operations.services.compensation.intent_open_compensation``'s refusal.
        return (
            f"{intent.action} cannot be compensated here: {serving_problem(intent.action, intent.action_version)}. "
            "Undo the effect at the provider yourself, then confirm it with its reference and say so in the reason."
        )
    if not compensation:
        return (
            f"{intent.action} has no compensation: its provider contract declares no action that undoes "
            "its effect. Decide confirmed or absent."
        )
    try:
        capabilities_for(compensation)
    except ActionUnavailable:
        return (
            f"{intent.action}'s compensation {compensation} is not served by this deployment. "
            "Undo the effect at the provider yourself, then confirm it with its reference and say so in the reason."
        )
    return None


def absent_refusal(intent: Intent) -> str | None:
    """Why ``absent`` cannot apply to ``intent``, or None when it can: evidence on record says the
    provider has the effect (``reconciliation.selectors.effect_on_record``), so it happened and
    must not be sent again (issue 21 item 9). Read under the intent's row lock by
    ``resolve_absent``; read without it for the page, which can only be out of date the safe way
    (the service decides)."""
    accepted = effect_on_record(intent)
    if accepted is None:
        return None
    return (
        f"the provider has this effect: {accepted}. It happened, so it is not sent again; confirm it instead."
    )


def inapplicable_verbs(intent: Intent) -> dict[str, str]:
    """The resolutions of an UNKNOWN ``intent`` that cannot apply, each with why:
    ``{"compensate": "email.send has no compensation: ..."}``; ``confirmed`` always applies (a
    reference the provider cannot verify is confirmed as unverified). The console offers only
    the others; the services refuse these with the same words (``compensate_refusal``,
    ``absent_refusal``)."""
    refused = {"absent": absent_refusal(intent), "compensate": compensate_refusal(intent)}
    return {verb: why for verb, why in refused.items() if why}


def check_decider(user: User, reason: str) -> None:
    """Refuse a decision by someone who may resolve on no tenant, or without a reason.

    Raises:
        ResolutionRefused: no permission, or ``reason`` is blank.
    """
    if not can_resolve(user):
        raise ResolutionRefused("only operators and admins can resolve UNKNOWN intents")
    if not reason.strip():
        raise ResolutionRefused("a resolution needs a reason")


def check_tenant(user: User, tenant: str, missing: str) -> None:
    """Refuse a decision on another tenant's item: as ``missing`` (no such item) where ``user``
    holds no console role on ``tenant``, so the answer never confirms it exists (issue 18 item
    5); as a missing permission where it may read that tenant but not resolve there.

    Raises:
        ResolutionRefused: either refusal.
    """
    if not console_scope(user).allows(tenant):
        raise ResolutionRefused(missing)
    if not can_resolve(user, tenant):
        raise ResolutionRefused(f"only operators and admins of tenant {tenant} can decide on its intents")


def load_for_decision(
    intent_id: uuid.UUID,
    user: User,
    reason: str,
    status: str = Intent.Status.UNKNOWN,
    seen_seq: int | None = None,
) -> Intent:
    """The intent to decide on, after the permission, reason and state checks.

    ``seen_seq`` is the last audit event of the intent the decider was shown (the console's
    pages must send it; the command line, which shows no page, passes None); a decision is
    refused unless it is the intent's last event now (assignments aside: they change who works
    on it, not what it is): a page that is out of date is refused
    even when the status came back to the same value meanwhile (UNKNOWN -> READY -> RUNNING ->
    UNKNOWN), and so is a value the intent never had.

    Raises:
        ResolutionRefused: no permission, no reason, no such intent (or one of a tenant ``user``
            may not read), another operator is on it, or the page is out of date.
        IntentMoved: the intent is not in ``status``.
    """
    check_decider(user, reason)
    intent = Intent.objects.filter(id=intent_id).first()
    if intent is None:
        raise ResolutionRefused(f"no intent {intent_id}")
    check_tenant(user, intent.tenant, f"no intent {intent_id}")
    if intent.status != status:
        raise IntentMoved(intent_id=intent_id, expected=status, current=intent.status)
    # Before the page's age and before anything is asked of the provider: another operator is on
    # it (issue 16 item 4). No lock here (``confirmed`` asks the provider next); the services
    # check again under the row lock.
    services.refuse_if_assigned_elsewhere(
        intent_id=intent_id, actor=f"user:{user.get_username()}", lock=False
    )
    if seen_seq is not None and seen_seq != last_audit_seq(intent_id):
        newer = list(
            AuditEvent.objects.filter(intent_id=intent_id, seq__gt=seen_seq)
            .exclude(event__in=NOT_A_CHANGE_EVENTS)
            .order_by("seq")
            .values_list("event", flat=True)
        )
        if newer:
            raise ResolutionRefused(
                f"this intent changed since the page was loaded ({', '.join(newer)}): reload it and "
                "decide on what it shows now"
            )
        raise ResolutionRefused(
            "the page's state does not match this intent's history: reload it and decide on what it shows"
        )
    return intent


def record_decision(
    intent: Intent, user: User, verb: str, reason: str, references: list[str], **detail: Any
) -> None:
    """Record ``user``'s decision ``verb`` on ``intent`` as an ``Evidence`` row of kind
    ``resolution``: the reason, the provider references it names, the evidence the decider was
    shown, and ``detail``."""
    shown = [e.id for e in intent_evidence(intent)]
    Evidence.objects.create(
        intent=intent,
        kind=Evidence.Kind.RESOLUTION,
        result=verb,
        provider_references=references,
        actor=f"user:{user.get_username()}",
        detail={"reason": reason, "evidence_shown": shown, **detail},
    )
