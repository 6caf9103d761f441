"""Transitions out of UNKNOWN, and the escalation to operators.

The reconciler and operators (through ``reconciliation``) call these; each is one
compare-and-swap on ``status = UNKNOWN`` plus its audit event. Compensation intents are in
``operations.services.compensation``.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from operations import metrics
from operations.adapters.registry import capabilities_for
from operations.audit.trail import audit_append
from operations.engine.calls import lookup_settle_seconds
from operations.exceptions import IntentMoved, ResendRefused
from operations.models import Attempt, Intent, Outcome
from operations.services.assignment import refuse_if_assigned_elsewhere
from operations.services.budget import resend_refusal
from operations.services.duplicates import duplicate_check_updates
from operations.services.notifications import notification_escalated
from operations.services.transitions import transition_or_raise
from operations.services.webhooks import webhook_enqueue_escalation


def operator_may_decide(intent_id: uuid.UUID, actor: str) -> None:
    """Refuse an operator's decision on an item another operator is on ("I'm on it", issue 16
    item 4: ``assignment.refuse_if_assigned_elsewhere``); the reconciler is never refused.

    Raises:
        AssignmentRefused: ``actor`` is an operator and another operator is on the intent.
    """
    refuse_if_assigned_elsewhere(intent_id=intent_id, actor=actor)


def intent_resolve_found(
    *, intent_id: uuid.UUID, provider_reference: str, source: str, actor: str, reason: str = "",
    detail: dict[str, Any] | None = None, from_status: str = Intent.Status.UNKNOWN,
) -> None:  # fmt: skip
    """UNKNOWN -> SUCCEEDED with the provider's receipt found by lookup or given by an operator.

    ``from_status`` READY: a lookup that was in flight when the intent was sent back to READY
    found the effect before any worker re-sent it (the READY intent is still waiting out
    ``lookup_settle_seconds``), or a provider's signed event proved an earlier attempt's effect;
    the evidence wins and nothing is re-sent.

    ``from_status`` RUNNING: only once its lease expired by the database clock (the worker died
    after the effect, before recording it) and only on a provider's signed event (issue 19):
    the lease is released in the same compare-and-swap and the open attempt closed
    ``abandoned``; a live worker's lease is never taken.

    An intent sent more than once to a provider without keys gets duplicate checks scheduled
    (``duplicate_check_updates``), as on every path that ends an intent.

    Args:
        source: ``reconciler``, ``operator`` or ``provider_event`` (``Outcome.Source``).
        detail: stored on the outcome and in the audit event (e.g. ``{"verified": False}``).

    Raises:
        IntentMoved: the intent is no longer in ``from_status`` (RUNNING: or its lease is live).
        AssignmentRefused: ``actor`` is an operator and another operator is on it.
    """
    with transaction.atomic():
        operator_may_decide(intent_id, actor)
        intent = Intent.objects.only("action", "attempt_count", "fence").get(id=intent_id)
        running = from_status == Intent.Status.RUNNING
        transition_or_raise(
            intent_id=intent_id,
            from_status=from_status,
            to_status=Intent.Status.SUCCEEDED,
            actor=actor,
            event="outcome_found",
            reason=reason,
            data={"provider_reference": provider_reference, "source": source, **(detail or {})},
            updates={
                "last_error": "",
                "next_lookup_at": None,
                "not_before": None,
                **duplicate_check_updates(action=intent.action, attempts=intent.attempt_count),
                **({"lease_owner": "", "lease_expires_at": None} if running else {}),  # the lease ends
            },
            # The race this stops (RUNNING): a live worker recording its own outcome; only an
            # expired lease, by the database clock, may be ended by evidence from elsewhere.
            where=Q(lease_expires_at__lt=Now()) if running else None,
        )
        if running:
            Attempt.objects.filter(intent_id=intent_id, fence=intent.fence, finished_at__isnull=True).update(
                finished_at=Now(),
                result=Attempt.Result.ABANDONED,
                error=f"lease expired; the effect was proven by {source}",
            )
        Outcome.objects.create(
            intent_id=intent_id, source=source, provider_reference=provider_reference, detail=detail or {}
        )
    metrics.ACCEPTED_EFFECTS.labels(source=source).inc()


def intent_resolve_absent(
    *, intent_id: uuid.UUID, actor: str, reason: str, data: dict[str, Any] | None = None
) -> None:
    """UNKNOWN -> READY with the same key (and an outbox message): the effect did not happen.

    The re-send spends the one attempt budget (``budget.resend_refusal``); ``lookup_count`` is
    kept, so the reconciler's patience is not reset by a round trip through READY.

    At a provider that cannot deduplicate on our key, the intent is due only after
    ``lookup_settle_seconds`` (its outbox message too): a lookup already in flight records what
    it finds first, and a found effect ends the intent SUCCEEDED instead of sending it a second
    time (issue 21 item 9). A keyed provider replays a same-key re-send, so it waits for nothing.

    Raises:
        IntentMoved: the intent is no longer UNKNOWN.
        ResendRefused: it must not be sent again (attempt budget spent, action or version not
            served); it stays UNKNOWN. The caller escalates it, or ``intent_end_absent`` ends it.
        AssignmentRefused: ``actor`` is an operator and another operator is on it.
    """
    with transaction.atomic():
        operator_may_decide(intent_id, actor)
        _resolve_absent(intent_id=intent_id, actor=actor, reason=reason, data=data)


def _resolve_absent(*, intent_id: uuid.UUID, actor: str, reason: str, data: dict[str, Any] | None) -> None:
    intent = Intent.objects.get(id=intent_id)
    if intent.status != Intent.Status.UNKNOWN:
        raise IntentMoved(intent_id=intent_id, expected=Intent.Status.UNKNOWN, current=intent.status)
    refusal = resend_refusal(intent)
    if refusal:
        raise ResendRefused(f"the intent cannot be sent again: {refusal}", why=refusal)
    settle = 0.0 if capabilities_for(intent.action).same_key_retry_safe else lookup_settle_seconds()
    transition_or_raise(
        intent_id=intent_id,
        from_status=Intent.Status.UNKNOWN,
        to_status=Intent.Status.READY,
        actor=actor,
        event="outcome_absent",
        reason=reason,
        data={**(data or {}), **({"settle_seconds": settle} if settle else {})},
        # lookup_count is kept: the reconciler's patience is not reset by a round trip (issue 21).
        updates={
            "not_before": Now() + timedelta(seconds=settle) if settle else None,
            "next_lookup_at": None,
            "escalated_at": None,
        },
        # The race this stops: a claim cannot happen while UNKNOWN, so the count read above is
        # the count now; the condition keeps the rule in the compare-and-swap all the same.
        where=Q(attempt_count=intent.attempt_count),
        dispatch=True,
    )


def intent_end_absent(
    *, intent_id: uuid.UUID, actor: str, reason: str, why: str, data: dict[str, Any] | None = None
) -> None:
    """UNKNOWN -> FAILED: an operator says the effect did not happen, and the intent cannot be
    sent again (``why``: its attempt budget is spent, or its action or version is not served).
    It ends without effect; an agent that still wants it submits a new intent.

    Raises:
        IntentMoved: the intent is no longer UNKNOWN.
        AssignmentRefused: ``actor`` is an operator and another operator is on it.
    """
    with transaction.atomic():
        operator_may_decide(intent_id, actor)
        transition_or_raise(
            intent_id=intent_id,
            from_status=Intent.Status.UNKNOWN,
            to_status=Intent.Status.FAILED,
            actor=actor,
            event="outcome_absent",
            reason=reason,
            data={**(data or {}), "not_sent_again": why},
            updates={
                "next_lookup_at": None,
                "escalated_at": None,
                "last_error": f"absent (an operator's decision); not sent again: {why}",
            },
        )
    metrics.TERMINAL_FAILURES.inc()


def intent_escalate(
    *, intent_id: uuid.UUID, reason: str, status: str = Intent.Status.UNKNOWN, event: str = "escalated",
    data: dict[str, Any] | None = None, actor: str = "reconciler",
) -> bool:  # fmt: skip
    """Hand an intent to the operators' queue (once). Returns True if newly escalated.

    Not a status change: the intent stays in ``status`` (UNKNOWN: the reconciler could not
    prove the outcome; COMPENSATING: its compensation failed, was rejected, expired or was
    cancelled); ``escalated_at`` is set and the audit event ``event`` records why.
    """
    with transaction.atomic():
        # The race this stops: two reconciler passes escalating the same intent twice.
        updated = Intent.objects.filter(id=intent_id, status=status, escalated_at__isnull=True).update(
            escalated_at=Now()
        )
        if updated:
            row = audit_append(intent_id=intent_id, event=event, actor=actor, reason=reason, data=data)
            webhook_enqueue_escalation(intent_id=intent_id, status=status, event=row)
            notification_escalated(intent_id=intent_id)  # the operators are told, with the event
    if updated:
        metrics.ESCALATIONS.inc()
    return bool(updated)
