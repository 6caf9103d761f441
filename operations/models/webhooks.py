"""Signed webhooks to agents about their intents (``WebhookDelivery``)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from operations.models.agents import Agent
from operations.models.intents import Intent


class WebhookDelivery(models.Model):
    """One signed webhook to an agent: the outbox of callbacks (``operations.services.webhooks``).

    Written in the transaction of the terminal transition (or escalation) it announces, claimed
    by the delivery task, POSTed outside any transaction, retried with backoff. ``message_id``
    (the ``webhook-id`` header) and ``body`` never change once written: the body is frozen at
    the first attempt, so every attempt and every re-send carries the same bytes (Standard
    Webhooks, "Idempotency"). Not ``OutboxMessage``: the relay reads a row with an intent as an
    ``execute_intent`` message.
    """

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed after the last attempt"

    message_id = models.CharField(max_length=40, unique=True, help_text="msg_<32 hex>: the webhook-id header")
    intent = models.ForeignKey(Intent, on_delete=models.PROTECT, related_name="webhook_deliveries")
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="webhook_deliveries")
    tenant = models.CharField(max_length=100, help_text="the intent's tenant (console lists filter on it)")
    event_type = models.CharField(
        max_length=40, help_text="intent.succeeded, intent.failed, ... intent.escalated"
    )
    status = models.CharField(max_length=20, help_text="the intent's status the event records")
    audit_seq = models.PositiveIntegerField(
        help_text="the audit event it announces: its seq in the intent's chain"
    )
    event_at = models.DateTimeField(help_text="when the event happened (its audit event's time)")
    body = models.TextField(blank=True, default="", help_text="canonical JSON, frozen at the first attempt")
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(
        null=True, blank=True, help_text="when it is due (a claim pushes it forward as its lease)"
    )
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    history = models.JSONField(
        default=list, blank=True, help_text="per attempt: {at, status_code, error, duration_ms, url}"
    )
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=["pending", "delivered", "failed"]), name="webhook_state_valid"
            ),
            # One delivery per announced audit event: a retried transaction cannot announce twice.
            models.UniqueConstraint(fields=["intent", "audit_seq", "agent"], name="webhook_event_unique"),
        ]
        indexes = [
            # The delivery task's queue.
            models.Index(fields=["next_attempt_at"], condition=Q(state="pending"), name="webhook_pending_q"),
            models.Index(fields=["tenant", "-created_at", "-id"], name="webhook_tenant_created"),
            models.Index(fields=["-created_at", "-id"], name="webhook_created"),
        ]

    def __str__(self) -> str:
        return f"{self.message_id} {self.event_type} [{self.state}]"
