"""The outbox: messages written with a state change and handed to the broker after commit."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from operations.models.intents import Intent


class OutboxMessage(models.Model):
    """A message written in the same transaction as a state change, handed to the broker after
    commit and acknowledged by the claim that consumes it (``operations.workers.outbox``).

    ``id`` is the message id and ``body`` the frozen, byte-identical payload on every re-send
    (shared/cases C08). ``due_at`` keeps a delay in the database: the relay publishes the row
    no earlier than ``operations.workers.delivery.MAX_COUNTDOWN_SECONDS`` before it (shared/cases C15).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    intent = models.ForeignKey(Intent, null=True, blank=True, on_delete=models.PROTECT, related_name="outbox")
    task = models.CharField(max_length=200)
    body = models.TextField(help_text="canonical JSON, frozen at write time")
    created_at = models.DateTimeField(auto_now_add=True)
    due_at = models.DateTimeField(
        db_default=Now(),
        help_text="when the message may be delivered: the intent's not_before, or the time it was written",
    )
    sent_at = models.DateTimeField(
        null=True, blank=True, help_text="when last handed to the broker (after commit, or by the relay)"
    )
    publish_count = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    acked_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="when a claim consumed it (or the relay found its intent no longer READY)",
    )

    class Meta:
        indexes = [
            # The relay's queue: rows never handed over, by due time.
            models.Index(
                fields=["due_at"],
                condition=Q(sent_at__isnull=True, acked_at__isnull=True),
                name="outbox_due_q",
            ),
            # Handed over, not yet consumed: the relay re-publishes those past the stalled bound.
            models.Index(
                fields=["sent_at"],
                condition=Q(sent_at__isnull=False, acked_at__isnull=True),
                name="outbox_unacked",
            ),
            # Consumed rows, by when: the pruning deletes them past OUTBOX_RETENTION_SECONDS.
            models.Index(fields=["acked_at"], condition=Q(acked_at__isnull=False), name="outbox_acked"),
        ]
