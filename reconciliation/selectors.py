"""Reads for the UNKNOWN queue, evidence pages and reconciliation history."""

from __future__ import annotations

from django.db.models import F, QuerySet
from django.db.models.functions import Now

from operations.models import Intent
from reconciliation.models import DrillRun, Evidence, ReconciliationRun


def unknown_queue(*, escalated_only: bool = False) -> QuerySet[Intent]:
    """UNKNOWN intents, oldest first (served by the partial index ``intent_unknown_age``),
    annotated with ``age`` (an interval by the database clock)."""
    queryset = Intent.objects.filter(status=Intent.Status.UNKNOWN)
    if escalated_only:
        queryset = queryset.filter(escalated_at__isnull=False)
    return queryset.annotate(age=Now() - F("updated_at")).order_by("updated_at", "id")


def intent_evidence(intent: Intent) -> list[Evidence]:
    """Everything gathered about ``intent``'s effect, oldest first."""
    return list(Evidence.objects.filter(intent=intent).order_by("created_at", "id"))


def recent_runs(*, limit: int = 20) -> list[ReconciliationRun]:
    """The newest reconciliation passes."""
    return list(ReconciliationRun.objects.order_by("-started_at")[:limit])


def drill_runs(*, limit: int = 50) -> list[DrillRun]:
    """The newest crash-lab and acceptance runs."""
    return list(DrillRun.objects.order_by("-started_at")[:limit])
