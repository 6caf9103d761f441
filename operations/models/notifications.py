"""Notices to people: a ``Notification`` per event (an outbox row), the addresses they go to
(``NotificationRecipient``) and one ``NotificationDelivery`` per notice and recipient.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from operations.models.intents import Intent


class Notification(models.Model):
    """A notice to people, written in the same transaction as the event it reports (an outbox
    row: if the event commits, so does its notice; if it rolls back, nothing is queued).

    Recipients are resolved when it is fanned out (``operations.services.notifications``),
    not here: the event's transaction writes one row and reads nothing, and whoever holds the
    role when the notice goes out receives it (a grant revoked meanwhile is honoured).
    """

    class Kind(models.TextChoices):
        APPROVAL_REQUESTED = "approval_requested", "Approval requested"
        APPROVAL_EXPIRING = "approval_expiring", "Approval about to expire"
        ESCALATED = "escalated", "Escalated to operators"
        EFFECT_FOUND_LATE = "effect_found_late", "Effect found after the intent ended"

    kind = models.CharField(max_length=30, choices=Kind.choices)
    intent = models.ForeignKey(Intent, on_delete=models.PROTECT, related_name="+")
    approval_round = models.PositiveSmallIntegerField(
        default=0,
        db_default=0,
        help_text="the intent's approval_round the notice is about (approval notices)",
    )
    created_at = models.DateTimeField(db_default=Now())
    fanned_out_at = models.DateTimeField(
        null=True, blank=True, help_text="when its deliveries (one per recipient) were written"
    )
    outcome = models.CharField(
        max_length=20,
        blank=True,
        default="",
        db_default="",
        help_text="after fan-out: 'delivering', 'obsolete' (the intent moved on first) or 'no_recipient'",
    )

    class Meta:
        constraints = [
            # One approval notice of each kind per approval round: a second write is a no-op
            # (ON CONFLICT DO NOTHING), so the expiry scan may find the same intent every pass.
            models.UniqueConstraint(
                fields=["intent", "kind", "approval_round"],
                condition=Q(kind__in=["approval_requested", "approval_expiring"]),
                name="notification_once_per_round",
            ),
        ]
        indexes = [
            # The fan-out's queue.
            models.Index(
                fields=["id"], condition=Q(fanned_out_at__isnull=True), name="notification_fan_out_q"
            ),
        ]


class NotificationRecipient(models.Model):
    """One address notices go to: an email address, or ``slack`` (the webhook URL is a secret
    and stays in the settings). Carries the rate limit: nothing is sent to it before
    ``due_at`` (the last message plus ``NOTIFY_INTERVAL_SECONDS``, or a failure's backoff)."""

    class Channel(models.TextChoices):
        EMAIL = "email", "Email"
        SLACK = "slack", "Slack-compatible webhook"

    channel = models.CharField(max_length=10, choices=Channel.choices)
    address = models.CharField(max_length=254, help_text="the email address; 'slack' for the webhook")
    due_at = models.DateTimeField(
        db_default=Now(), help_text="no message before this time (rate limit, backoff)"
    )
    failures = models.PositiveIntegerField(default=0, help_text="failed sends in a row (backoff)")
    lease_until = models.DateTimeField(
        null=True,
        blank=True,
        help_text="a sender claimed it until then (the send runs outside the transaction)",
    )
    last_sent_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["channel", "address"], name="notification_recipient_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.channel}:{self.address}"


class NotificationDelivery(models.Model):
    """One notice for one recipient: pending until a message carrying it was sent (then
    ``sent``), or ``dropped`` when the intent moved on before it went out."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        SENT = "sent", "Sent"
        DROPPED = "dropped", "Dropped as obsolete"

    notification = models.ForeignKey(Notification, on_delete=models.CASCADE, related_name="deliveries")
    recipient = models.ForeignKey(NotificationRecipient, on_delete=models.CASCADE, related_name="deliveries")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0, help_text="messages that carried it and failed")
    created_at = models.DateTimeField(db_default=Now())
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["notification", "recipient"], name="notification_delivery_unique"
            ),
        ]
        indexes = [
            # A recipient's pending notices: what its next message carries.
            models.Index(
                fields=["recipient", "id"], condition=Q(status="pending"), name="notification_pending_q"
            ),
        ]
