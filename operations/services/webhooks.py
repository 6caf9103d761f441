"""Signed webhooks to agents (docs/reference/webhooks.md): registration and the outbox rows
written with each terminal transition. Their body, delivery with retries, and re-sends are in
``operations.services.webhook_delivery``.

* ``webhook_statement`` is the INSERT ``transitions.transition`` sends with the audit event of
  a terminal transition (same transaction, same round trip); ``webhook_enqueue_escalation`` the
  one ``resolution.intent_escalate`` runs. Either writes a row only when the intent's principal
  is an agent with a callback URL, and ``webhook_kick_after_commit`` asks a worker to deliver it.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from celery import current_app
from django.db import connection, transaction

from operations.exceptions import CallbackRefused
from operations.models import Agent, AuditEvent, Intent, WebhookDelivery
from operations.notifications.callback_urls import callback_url_problem
from operations.notifications.webhook_sender import new_secret
from operations.statements import Statement

logger = logging.getLogger(__name__)

DELIVER_TASK = "operations.deliver_webhooks"
ESCALATED = "intent.escalated"
#: The event type announced when an intent enters each status (the terminal ones, and
#: SUCCEEDED, which only a compensation can leave).
EVENT_TYPES: dict[str, str] = {
    Intent.Status.SUCCEEDED: "intent.succeeded",
    Intent.Status.FAILED: "intent.failed",
    Intent.Status.REJECTED: "intent.rejected",
    Intent.Status.EXPIRED: "intent.expired",
    Intent.Status.CANCELLED: "intent.cancelled",
    Intent.Status.COMPENSATED: "intent.compensated",
}


# --- registration ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CallbackSet:
    """The agent as stored after ``agent_callback_set`` (read under its row lock: its URL and
    secret are the ones in force), and its new secret when this call made one (shown once)."""

    agent: Agent
    new_secret: str


def agent_callback_set(*, agent: Agent, url: str, rotate_secret: bool = False) -> CallbackSet:
    """Register ``url`` as ``agent``'s callback URL. A secret is made when the stored agent has
    none (the first URL, or the first since ``agent_callback_clear``) or when ``rotate_secret``;
    it is returned once, never shown again. Deliveries not yet sent use the URL and secret in
    force at their next attempt. Only ``agent.id`` is read from ``agent`` (a request's Agent may
    be cached since authentication); ``agent`` itself is not changed.

    Raises:
        CallbackRefused: ``callback_url_problem(url)`` names a problem; nothing changed.
    """
    problem = callback_url_problem(url)
    if problem:
        raise CallbackRefused(problem, errors=[{"field": "url", "message": problem}])
    with transaction.atomic():
        # The race this stops: two registrations (or one and a removal) deciding from rows read
        # before the other committed: two "shown once" secrets with one stored, or none made
        # after a removal so that every delivery fails for want of a secret.
        current = Agent.objects.select_for_update().get(id=agent.id)
        secret = new_secret() if rotate_secret or not current.callback_secret else ""
        current.callback_url = url
        current.callback_secret = secret or current.callback_secret
        Agent.objects.filter(id=current.id).update(
            callback_url=current.callback_url, callback_secret=current.callback_secret
        )
    return CallbackSet(agent=current, new_secret=secret)


def agent_callback_clear(*, agent: Agent) -> Agent:
    """Remove ``agent``'s callback URL and secret (only ``agent.id`` is read); returns the agent
    as stored. No new deliveries; pending ones are not sent (each attempt records that there is
    no URL) and fail after the last attempt, unless a URL is registered again meanwhile."""
    with transaction.atomic():
        # Under the same row lock as ``agent_callback_set``, so that a registration waits for
        # the removal and then makes a new secret.
        current = Agent.objects.select_for_update().get(id=agent.id)
        current.callback_url = current.callback_secret = ""
        Agent.objects.filter(id=current.id).update(callback_url="", callback_secret="")
    return current


# --- the outbox rows -------------------------------------------------------------------------

_INSERT = f"""
    INSERT INTO {WebhookDelivery._meta.db_table}
        (message_id, intent_id, agent_id, tenant, event_type, status, audit_seq, event_at, body, state,
         attempts, next_attempt_at, last_error, history, created_at)
    SELECT %s, i.id, a.id, i.tenant, %s, %s, %s, %s, '', 'pending', 0, statement_timestamp(), '', '[]',
           statement_timestamp()
    FROM {Intent._meta.db_table} i
    JOIN {Agent._meta.db_table} a ON a.tenant = i.tenant AND 'agent:' || a.name = i.principal
    WHERE i.id = %s AND a.callback_url <> ''
    RETURNING id
"""


def _insert(*, intent_id: uuid.UUID, event_type: str, status: str, event: AuditEvent) -> Statement:
    message_id = f"msg_{uuid.uuid4().hex}"
    params = (message_id, event_type, status, event.seq, event.created_at, intent_id)
    return Statement(_INSERT, params, returns=True)


def webhook_statement(*, intent_id: uuid.UUID, to_status: str, event: AuditEvent) -> Statement | None:
    """The INSERT of the webhook announcing ``event`` (the transition's audit event, unsaved is
    fine) when ``to_status`` is announced (``EVENT_TYPES``), else None. It inserts nothing when
    the intent's principal is not an agent with a callback URL, and returns the new row's id
    (None when nothing was inserted): send it last, and call ``webhook_kick_after_commit``
    when it inserted."""
    event_type = EVENT_TYPES.get(to_status)
    if event_type is None:
        return None
    return _insert(intent_id=intent_id, event_type=event_type, status=to_status, event=event)


def webhook_enqueue_escalation(*, intent_id: uuid.UUID, status: str, event: AuditEvent) -> None:
    """Write the ``intent.escalated`` webhook for ``event`` (the escalation's audit event) in
    the caller's transaction, when the intent's agent has a callback URL."""
    statement = _insert(intent_id=intent_id, event_type=ESCALATED, status=status, event=event)
    with connection.cursor() as cursor:
        cursor.execute(statement.sql, statement.params)
        if cursor.fetchone() is not None:
            webhook_kick_after_commit()


def webhook_kick_after_commit() -> None:
    """After the caller's transaction commits, ask a worker to deliver now (the beat's period
    is the safety net: a refused publication is only logged)."""

    def kick() -> None:
        try:
            current_app.send_task(DELIVER_TASK, retry=False)
        except Exception as exc:  # noqa: BLE001 - the beat delivers it within its period
            logger.warning(
                "webhook kick not published; the beat will deliver", extra={"error": str(exc)[:200]}
            )

    transaction.on_commit(kick)
