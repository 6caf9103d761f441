"""A person's decision on an intent waiting for approval."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from operations.models.intents import Intent


class Approval(models.Model):
    """A human decision bound to (intent, request_hash), valid until ``expires_at``, used once."""

    class Decision(models.TextChoices):
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"

    intent = models.ForeignKey(Intent, on_delete=models.PROTECT, related_name="approvals")
    request_hash = models.CharField(max_length=64)
    approver = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    decision = models.CharField(max_length=10, choices=Decision.choices)
    reason = models.TextField(blank=True, default="")
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    round = models.PositiveSmallIntegerField(
        default=0, db_default=0, help_text="the intent's approval_round this decision belongs to"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # Four eyes: one decision per approver per intent and approval round.
            models.UniqueConstraint(fields=["intent", "approver", "round"], name="approval_one_per_approver"),
        ]
