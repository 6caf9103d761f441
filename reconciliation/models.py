"""Reconciliation's own records: passes of the reconciler and the evidence they gathered."""

from __future__ import annotations

from django.db import models


class ReconciliationRun(models.Model):
    """One pass of the periodic reconciler, for the console and auditors."""

    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    examined = models.PositiveIntegerField(default=0)
    resolved = models.PositiveIntegerField(default=0)
    escalated = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [models.Index(fields=["-started_at"], name="recon_run_started")]

    def __str__(self) -> str:
        return f"reconciliation run {self.pk} at {self.started_at:%Y-%m-%d %H:%M:%S}"


class Evidence(models.Model):
    """What the reconciler (or an operator) learned about an intent's effect (insert-only).

    ``kind`` is ``lookup`` (a provider read), ``duplicate`` (two or more effects for one intent)
    or ``resolution`` (an operator's decision with what they were shown).
    """

    class Kind(models.TextChoices):
        LOOKUP = "lookup", "Lookup"
        DUPLICATE = "duplicate", "Duplicate found"
        RESOLUTION = "resolution", "Operator resolution"

    intent = models.ForeignKey("operations.Intent", on_delete=models.PROTECT, related_name="evidence")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    result = models.CharField(max_length=30, help_text="lookup status, or the resolution verb")
    provider_references = models.JSONField(default=list, blank=True)
    actor = models.CharField(max_length=200, default="reconciler")
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["intent", "-created_at"], name="evidence_intent")]

    def __str__(self) -> str:
        return f"{self.kind} {self.result} for {self.intent_id}"


class DuplicateFinding(models.Model):
    """A second (or further) effect at the provider for one intent, found by a duplicate check
    at a provider without idempotency keys. One row per extra effect (unique), kept for good.

    ``state``: ``compensating`` while its compensation intent runs; ``open`` when it needs an
    operator (the action has no compensation, e.g. an email, or the compensation failed, was
    rejected, expired or was cancelled); ``resolved`` once compensated or acknowledged.
    """

    class State(models.TextChoices):
        COMPENSATING = "compensating", "Compensation running"
        OPEN = "open", "Needs an operator"
        RESOLVED = "resolved", "Resolved"

    intent = models.ForeignKey(
        "operations.Intent", on_delete=models.PROTECT, related_name="duplicate_findings"
    )
    provider_reference = models.CharField(max_length=200, help_text="the extra effect at the provider")
    kept_reference = models.CharField(max_length=200, help_text="the effect the intent keeps")
    state = models.CharField(max_length=20, choices=State.choices)
    compensation = models.ForeignKey(
        "operations.Intent", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    note = models.TextField(blank=True, default="", help_text="why it is in this state")
    resolved_by = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["intent", "provider_reference"], name="duplicate_finding_unique"),
        ]
        indexes = [
            models.Index(fields=["created_at"], condition=models.Q(state="open"), name="duplicate_open_q"),
            models.Index(
                fields=["updated_at"],
                condition=models.Q(state="compensating"),
                name="duplicate_compensating_q",
            ),
        ]

    def __str__(self) -> str:
        return f"duplicate {self.provider_reference} of {self.intent_id} [{self.state}]"
