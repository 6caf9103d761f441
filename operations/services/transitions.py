"""The one compare-and-swap every state transition goes through.

A transition is ``UPDATE intent SET status = <to>, ... WHERE id = <id> AND status = <from>
[AND fence = <fence>]`` that must touch exactly one row, plus its audit event (and outbox
message where one follows) in the same transaction. Zero rows means somebody else moved first:
the caller re-reads and never overwrites.

Database time: Django's ``Now()`` is PostgreSQL's ``statement_timestamp()``; raw SQL in this
project uses ``statement_timestamp()`` too, never ``now()`` (the transaction's start time), so
every lease, expiry and backoff is judged by one clock.
"""

from __future__ import annotations

import uuid
from functools import partial
from typing import Any

from django.db import transaction
from django.db.models import Q, Subquery
from django.db.models.functions import Greatest, Now

from operations import metrics
from operations.audit import audit_append
from operations.exceptions import IntentMoved, InvalidTransition
from operations.idempotency import canonical_json
from operations.models import ALLOWED_TRANSITIONS, Intent, OutboxMessage
from operations.outbox import kick_relay

EXECUTE_TASK = "operations.execute_intent"


def check_allowed(*, intent_id: uuid.UUID, current: str, target: str) -> None:
    """Raise ``InvalidTransition`` unless ``ALLOWED_TRANSITIONS`` permits current -> target."""
    if target not in ALLOWED_TRANSITIONS.get(current, frozenset()):
        raise InvalidTransition(intent_id=intent_id, current=current, target=target)


def outbox_enqueue(*, intent_id: uuid.UUID, task: str = EXECUTE_TASK) -> OutboxMessage:
    """Write an outbox message for ``task(intent_id)`` in the caller's transaction.

    The body is canonical JSON frozen now, carrying the message id, so every publication of
    this row is byte-identical (shared/cases C08). ``due_at`` is the intent's ``not_before``
    when that is later than now: the relay keeps the row until then (C15). After commit the relay is kicked for latency;
    the periodic relay is the safety net if the kick fails.
    """
    message_id = uuid.uuid4()
    body = canonical_json({"message_id": str(message_id), "intent_id": str(intent_id), "task": task}).decode()
    # Due when the intent is: its not_before (a retry's backoff), read in this same INSERT after
    # the caller's UPDATE set it, or now. GREATEST ignores a NULL not_before (PostgreSQL).
    due_at = Greatest(Subquery(Intent.objects.filter(id=intent_id).values("not_before")[:1]), Now())
    message = OutboxMessage.objects.create(
        id=message_id, intent_id=intent_id, task=task, body=body, due_at=due_at
    )
    transaction.on_commit(partial(kick_relay, message_id))
    return message


def transition(
    *,
    intent_id: uuid.UUID,
    from_status: str,
    to_status: str,
    actor: str,
    event: str,
    reason: str = "",
    data: dict[str, Any] | None = None,
    fence: int | None = None,
    updates: dict[str, Any] | None = None,
    where: Q | None = None,
    dispatch: bool = False,
) -> bool:
    """Move one intent from ``from_status`` to ``to_status`` if nobody moved it first.

    Args:
        intent_id: the intent.
        from_status / to_status: the expected current state and the target.
        actor: who does it (``agent:<name>``, ``user:<name>``, ``worker:<id>``, ``reconciler``).
        event: the audit event name.
        reason, data: recorded in the audit event.
        fence: when given, the update also requires ``fence = <fence>`` (a stale worker's write
            touches nothing).
        updates: further columns to set in the same UPDATE (expressions allowed).
        where: a further condition of the compare-and-swap (e.g. an expiry by database time).
        dispatch: also write an outbox message for ``execute_intent``.

    Returns:
        True when exactly one row moved; False when the compare-and-swap matched nothing.

    Raises:
        InvalidTransition: the table does not allow the move.
    """
    check_allowed(intent_id=intent_id, current=from_status, target=to_status)
    # No savepoint: any error here aborts the caller's whole transaction anyway.
    with transaction.atomic(savepoint=False):
        queryset = Intent.objects.filter(id=intent_id, status=from_status)
        if fence is not None:
            queryset = queryset.filter(fence=fence)
        if where is not None:
            queryset = queryset.filter(where)
        # The race this stops: two actors (workers, reconciler, operator) deciding on the same
        # intent. Only the one whose WHERE still matches moves it; the other sees 0 rows.
        moved = queryset.update(status=to_status, updated_at=Now(), **(updates or {}))
        if moved != 1:
            if fence is not None:
                metrics.STALE_FENCES_REJECTED.inc()
            return False
        audit_append(
            intent_id=intent_id,
            event=event,
            actor=actor,
            from_status=from_status,
            to_status=to_status,
            reason=reason,
            data=data,
        )
        if dispatch:
            outbox_enqueue(intent_id=intent_id)
    return True


def transition_or_raise(**kwargs: Any) -> None:
    """``transition`` that raises ``IntentMoved`` (naming the current status) on a lost race."""
    if not transition(**kwargs):
        current = Intent.objects.filter(id=kwargs["intent_id"]).values_list("status", flat=True).first()
        raise IntentMoved(
            intent_id=kwargs["intent_id"], expected=kwargs["from_status"], current=current or "missing"
        )
