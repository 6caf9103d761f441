"""Reads for the operators' queue (UNKNOWN intents, compensations that need a decision,
duplicate findings, unverified confirmations), evidence pages and reconciliation history."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import F, Prefetch, QuerySet
from django.db.models.functions import Now

from operations.models import Intent, Outcome
from reconciliation.models import DuplicateFinding, Evidence, ReconciliationRun

#: How far back the queue lists operator confirmations the provider could not verify.
UNVERIFIED_RECENT = timedelta(days=7)


def unknown_queue(*, escalated_only: bool = False) -> QuerySet[Intent]:
    """UNKNOWN intents, oldest first (served by the partial index ``intent_unknown_age``),
    annotated with ``age`` (an interval by the database clock)."""
    queryset = Intent.objects.filter(status=Intent.Status.UNKNOWN)
    if escalated_only:
        queryset = queryset.filter(escalated_at__isnull=False)
    return queryset.annotate(age=Now() - F("updated_at")).order_by("updated_at", "id")


def escalated_compensations() -> QuerySet[Intent]:
    """COMPENSATING intents whose compensation failed, was rejected, expired or was cancelled
    (``escalated_at`` set by ``reconciliation.duplicates.sweep_compensations``), the longest
    waiting first, annotated with ``age`` (since escalation, by the database clock), with
    their compensation intents prefetched as ``compensation_list`` (oldest first)."""
    return (
        Intent.objects.filter(status=Intent.Status.COMPENSATING, escalated_at__isnull=False)
        .annotate(age=Now() - F("escalated_at"))
        .prefetch_related(
            Prefetch(
                "compensations", queryset=Intent.objects.order_by("created_at", "id"), to_attr="compensation_list"
            )
        )
        .order_by("escalated_at", "id")
    )


def compensations_of(intent: Intent) -> list[Intent]:
    """Every compensation intent opened for ``intent`` (the original's effect or a duplicate
    of it), oldest first, with status and last error."""
    return list(Intent.objects.filter(compensates=intent).order_by("created_at", "id"))


def open_duplicate_findings() -> QuerySet[DuplicateFinding]:
    """Duplicate findings that need an operator (state ``open``), oldest first (served by the
    partial index ``duplicate_open_q``), with their intent, annotated with ``age``."""
    return (
        DuplicateFinding.objects.filter(state=DuplicateFinding.State.OPEN)
        .select_related("intent")
        .annotate(age=Now() - F("created_at"))
        .order_by("created_at", "id")
    )


def duplicate_finding(finding_id: int) -> DuplicateFinding | None:
    """One duplicate finding with its intent and compensation, or None."""
    return DuplicateFinding.objects.select_related("intent", "compensation").filter(id=finding_id).first()


def recently_unverified(*, within: timedelta = UNVERIFIED_RECENT) -> QuerySet[Outcome]:
    """Operator confirmations the provider could not verify (``detail.verified`` is False,
    recorded by ``reconciliation.resolution.resolve_confirmed`` with ``accept_unverified``)
    in the last ``within``, newest first, with their intent."""
    return (
        Outcome.objects.filter(
            source=Outcome.Source.OPERATOR, detail__verified=False, created_at__gte=Now() - within
        )
        .select_related("intent")
        .order_by("-created_at", "-id")
    )


def unverified_outcome(intent: Intent) -> Outcome | None:
    """``intent``'s newest operator outcome that the provider could not verify, or None."""
    return (
        Outcome.objects.filter(intent=intent, source=Outcome.Source.OPERATOR, detail__verified=False)
        .order_by("-created_at")
        .first()
    )


def decision_counts() -> dict[str, int]:
    """How many items wait for an operator's decision besides UNKNOWN intents:
    ``{"escalated_compensations": n, "open_duplicate_findings": n}``."""
    return {
        "escalated_compensations": Intent.objects.filter(
            status=Intent.Status.COMPENSATING, escalated_at__isnull=False
        ).count(),
        "open_duplicate_findings": DuplicateFinding.objects.filter(state=DuplicateFinding.State.OPEN).count(),
    }


def intent_evidence(intent: Intent) -> list[Evidence]:
    """Everything gathered about ``intent``'s effect, oldest first."""
    return list(Evidence.objects.filter(intent=intent).order_by("created_at", "id"))


def recent_runs(*, limit: int = 20) -> list[ReconciliationRun]:
    """The newest reconciliation passes."""
    return list(ReconciliationRun.objects.order_by("-started_at")[:limit])
