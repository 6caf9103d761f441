"""The one compare-and-swap every state transition goes through.

A transition is ``UPDATE intent SET status = <to>, ... WHERE id = <id> AND status = <from>
[AND fence = <fence>] RETURNING <the audit chain's head>`` that must touch exactly one row, plus
its audit event (and outbox message where one follows) in one more statement of the same
transaction. Zero rows means somebody else moved first:
the caller re-reads and never overwrites.

Database time: Django's ``Now()`` is PostgreSQL's ``statement_timestamp()``; raw SQL in this
project uses ``statement_timestamp()`` too, never ``now()`` (the transaction's start time), so
every lease, expiry and backoff is judged by one clock.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django.db import connection, transaction
from django.db.models import Q
from django.db.models.functions import Now

from operations import metrics
from operations.audit.trail import (
    audit_appended,
    audit_event,
    audit_insert_statement,
    chain_head_returning,
    head_from_row,
)
from operations.exceptions import IntentMoved, InvalidTransition
from operations.idempotency import canonical_json
from operations.models import ALLOWED_TRANSITIONS, Intent
from operations.services.assignment import RELEASED as ASSIGNMENT_RELEASED
from operations.services.ceilings import RELEASING_STATES, release_statements
from operations.services.notifications import notification_statements
from operations.services.webhooks import webhook_kick_after_commit, webhook_statement
from operations.statements import Statement, run_together, update_statement
from operations.workers.outbox import Handoff, enqueue_statement, handoff_after_commit

EXECUTE_TASK = "operations.execute_intent"


def check_allowed(*, intent_id: uuid.UUID, current: str, target: str) -> None:
    """Raise ``InvalidTransition`` unless ``ALLOWED_TRANSITIONS`` permits current -> target."""
    if target not in ALLOWED_TRANSITIONS.get(current, frozenset()):
        raise InvalidTransition(intent_id=intent_id, current=current, target=target)


def outbox_handoff(*, intent_id: uuid.UUID, task: str = EXECUTE_TASK) -> tuple[Handoff, Statement]:
    """A new outbox message for ``task(intent_id)`` and the INSERT that writes it
    (``operations.workers.outbox.enqueue_statement``). The body is canonical JSON frozen now, carrying
    the message id, so every publication of this row is byte-identical (shared/cases C08)."""
    message_id = uuid.uuid4()
    body = canonical_json({"message_id": str(message_id), "intent_id": str(intent_id), "task": task}).decode()
    handoff = Handoff(id=message_id, task=task, body=body)
    return handoff, enqueue_statement(handoff, intent_id=intent_id)


def outbox_enqueue(*, intent_id: uuid.UUID, task: str = EXECUTE_TASK) -> uuid.UUID:
    """Write an outbox message for ``task(intent_id)`` in the caller's transaction and hand it
    to the broker after commit (``operations.workers.outbox``); returns the message id.

    ``due_at`` is the intent's ``not_before`` when that is later than now: the relay keeps the
    row until then (C15). Set ``not_before`` before calling this."""
    handoff, statement = outbox_handoff(intent_id=intent_id, task=task)
    (countdown,) = run_together(statement)
    handoff_after_commit(handoff, countdown)
    return handoff.id


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
    also: Sequence[Statement] = (),
) -> bool:
    """Move one intent from ``from_status`` to ``to_status`` if nobody moved it first.

    Two statements: the compare-and-swap ``UPDATE ... RETURNING`` the audit chain's head
    (``operations.audit.trail.chain_head_returning``), then, only when it moved, one statement that
    inserts the audit event, the outbox message (``dispatch``) and runs ``also``
    (``operations.statements.run_together``).

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
        dispatch: also write an outbox message for ``execute_intent``, handed over after commit.
        also: further writes of the same step (e.g. closing the attempt), sent with the audit
            event when the intent moved; none may touch the intent row.

    Any operator's assignment of the intent ends with it (``assignment.RELEASED``).

    Entering a state of ``ceilings.RELEASING_STATES`` also gives back the intent's spend and
    effects reservation in the same statement (issue 18). Entering AWAITING_APPROVAL queues its
    approvers' notice (``notifications.notification_statements``), and entering a state an agent
    is told of queues its signed webhook (``webhooks.webhook_statement``), both in that statement
    too (issue 15).

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
        update = update_statement(
            queryset,
            # A change of status ends any operator's assignment ("I'm on it", issue 16 item 4).
            {"status": to_status, "updated_at": Now(), **ASSIGNMENT_RELEASED, **(updates or {})},
            returning=chain_head_returning(),
        )
        with connection.cursor() as cursor:
            cursor.execute(update.sql, update.params)
            rows = cursor.fetchall()
        if len(rows) != 1:
            if fence is not None:
                metrics.STALE_FENCES_REJECTED.inc()
            return False
        event_row = audit_event(
            head=head_from_row(*rows[0]),
            intent_id=intent_id,
            event=event,
            actor=actor,
            from_status=from_status,
            to_status=to_status,
            reason=reason,
            data=data,
        )
        statements = [audit_insert_statement(event_row), *also]
        if to_status in RELEASING_STATES:  # it surely made no effect: give back its reservation
            statements.extend(release_statements(intent_id))
        # Entering AWAITING_APPROVAL tells its approvers (the notice commits with the move).
        statements.extend(notification_statements(intent_id=intent_id, to_status=to_status))
        handoff = None
        if dispatch:
            handoff, enqueue = outbox_handoff(intent_id=intent_id)
            statements.insert(1, enqueue)
        # A terminal state's signed webhook to the intent's agent, when it registered a URL:
        # last, so its RETURNING is the last value (operations.services.webhooks).
        webhook = webhook_statement(intent_id=intent_id, to_status=to_status, event=event_row)
        event_id, *countdown = run_together(*statements, *([webhook] if webhook else []))
        audit_appended(event_row, event_id)
        if handoff is not None:
            handoff_after_commit(handoff, countdown[0])
        if webhook is not None and countdown[-1] is not None:
            webhook_kick_after_commit()
    return True


def transition_or_raise(**kwargs: Any) -> None:
    """``transition`` that raises ``IntentMoved`` (naming the current status) on a lost race."""
    if not transition(**kwargs):
        current = Intent.objects.filter(id=kwargs["intent_id"]).values_list("status", flat=True).first()
        raise IntentMoved(
            intent_id=kwargs["intent_id"], expected=kwargs["from_status"], current=current or "missing"
        )
