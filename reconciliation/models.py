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
