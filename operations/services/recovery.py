"""Moving intents whose worker is gone or whose message was lost: lease takeover and
re-dispatch. Each is one short transaction; neither calls a provider."""

from __future__ import annotations

import uuid

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now

from operations import metrics
from operations.audit.trail import audit_append
from operations.models import Attempt, Intent
from operations.services.attempts import release_lease
from operations.services.budget import resend_refusal
from operations.services.transitions import outbox_enqueue, transition


def intent_take_over_lease(*, intent_id: uuid.UUID, fence: int, provider_deduplicates: bool) -> str | None:
    """A RUNNING intent whose lease expired (worker killed, hung or cut off): move it on.

    To READY (same key; the next claim takes the next fence) when the provider deduplicates on
    the key and the intent may be sent again (``budget.resend_refusal``: attempt budget left,
    action and version served), else to UNKNOWN for reconciliation, with the reason it was not
    sent again in the audit event. Conditional on the fence and on the lease having expired by
    the database clock, so a live worker's lease is never taken.

    Returns the new status, or None when the intent moved meanwhile.
    """
    with transaction.atomic():
        intent = Intent.objects.filter(id=intent_id).first()
        refusal = resend_refusal(intent) if intent is not None else None
        resend = provider_deduplicates and refusal is None
        target = Intent.Status.READY if resend else Intent.Status.UNKNOWN
        moved = transition(
            intent_id=intent_id,
            from_status=Intent.Status.RUNNING,
            to_status=target,
            fence=fence,
            actor="reconciler",
            event="lease_taken_over",
            reason="the worker's lease expired before it recorded an outcome"
            + (f"; not sent again: {refusal}" if provider_deduplicates and refusal else ""),
            data={"fence": fence, **({"not_sent_again": refusal} if refusal else {})},
            # lookup_count is kept: the reconciler's patience counts every lookup (issue 21).
            updates={
                **release_lease(),
                "not_before": None,
                "last_error": "lease expired" + (f"; {refusal}" if refusal else ""),
                "next_lookup_at": Now(),
            },
            where=Q(lease_expires_at__lt=Now()),
            dispatch=target == Intent.Status.READY,
        )
        if moved:
            Attempt.objects.filter(intent_id=intent_id, fence=fence, finished_at__isnull=True).update(
                finished_at=Now(), result=Attempt.Result.ABANDONED, error="lease expired"
            )
    if not moved:
        return None
    metrics.LEASE_TAKEOVERS.labels(to_status=target).inc()
    if target == Intent.Status.UNKNOWN:
        metrics.UNKNOWN_OUTCOMES.labels(cause="lease_expired").inc()
    return target


def intent_redispatch(*, intent_id: uuid.UUID, actor: str, reason: str) -> bool:
    """Give a READY intent a fresh outbox message, audited as ``redispatched`` with ``reason``.

    For a delivery that may have been lost (the broker lost it, it was acknowledged without
    running) or that arrived before ``not_before``. The message is due with the intent (its
    ``not_before``, or now), so the relay publishes it within the countdown bound. Harmless if
    nothing was lost: consumers are idempotent.

    Args:
        actor: who re-dispatches (``reconciler``, ``worker:<id>``).
        reason: why, recorded in the audit event so the timeline has no unexplained gap.

    Returns:
        True when the intent was still READY and got its message; False otherwise.
    """
    with transaction.atomic():
        # The race this stops: a claim (or a cancel) between the caller's read and this write.
        # The UPDATE locks the row and re-checks READY, so a moved intent gets no message.
        touched = Intent.objects.filter(id=intent_id, status=Intent.Status.READY).update(updated_at=Now())
        if not touched:
            return False
        message_id = outbox_enqueue(intent_id=intent_id)
        audit_append(
            intent_id=intent_id,
            event="redispatched",
            actor=actor,
            from_status=Intent.Status.READY,
            to_status=Intent.Status.READY,
            reason=reason,
            data={"message_id": str(message_id)},
        )
    metrics.REDISPATCHES.inc()
    return True
