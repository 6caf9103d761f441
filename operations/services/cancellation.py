"""Cancelling an intent that was never sent."""

from __future__ import annotations

import uuid

from django.db.models import Q

from operations.exceptions import CancelRefused, CancelTooLate, IntentMoved
from operations.models import Intent
from operations.services.refusals import refusals_audited
from operations.services.transitions import transition


@refusals_audited("cancel")
def intent_cancel(*, intent_id: uuid.UUID, actor: str, reason: str = "") -> Intent:
    """Cancel an intent that was never sent (AWAITING_APPROVAL, READY or HELD, no attempt yet).

    An intent back in READY (a same-key retry, a wait for "request in progress"), HELD or
    AWAITING_APPROVAL after an attempt was sent may hold an effect at the provider: CANCELLED
    would tell its agent "no effect" and free its business identity for a second charge (issue
    38; the same hole as an ``absent`` decided too early). Such a cancel is refused; the intent
    ends by the provider's answer, a lookup or an operator.

    Raises:
        IntentMoved: the intent is RUNNING or beyond (cancel is honoured only before RUNNING);
            ``current`` names its state.
        CancelTooLate: it was sent already (``attempt_count`` > 0); nothing changed.
        CancelRefused: an agent asked to cancel a compensation intent (only people may: an
            agent's cancel would leave the original's effect un-undone with nobody told).
    """
    if actor.startswith("agent:") and Intent.objects.filter(id=intent_id, compensates__isnull=False).exists():
        raise CancelRefused(
            "this is a compensation intent opened to undo another intent's effect; only an operator can cancel it"
        )
    cancellable = (Intent.Status.AWAITING_APPROVAL, Intent.Status.READY, Intent.Status.HELD)
    for from_status in cancellable:
        if transition(
            intent_id=intent_id,
            from_status=from_status,
            to_status=Intent.Status.CANCELLED,
            actor=actor,
            event="cancelled",
            reason=reason,
            # The race this stops: a worker's claim (READY -> RUNNING, attempt_count + 1) meanwhile.
            where=Q(attempt_count=0),
        ):
            return Intent.objects.get(id=intent_id)
    current, attempts = Intent.objects.filter(id=intent_id).values_list("status", "attempt_count").get()
    if current == Intent.Status.CANCELLED:
        return Intent.objects.get(id=intent_id)
    if current in cancellable and attempts > 0:
        raise CancelTooLate(
            f"intent {intent_id} was sent to the provider already ({attempts} attempt(s)): its effect may exist, "
            "so it can no longer be cancelled; it ends by the provider's answer, a lookup or an operator"
        )
    raise IntentMoved(intent_id=intent_id, expected="AWAITING_APPROVAL, READY or HELD", current=current)
