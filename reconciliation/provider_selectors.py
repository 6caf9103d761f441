"""Reads of provider evidence for the console and ``/metrics`` (issue 19): provider findings
and statement runs."""

from __future__ import annotations

from django.db.models import Count, Q, QuerySet

from operations.access.tenants import TenantScope
from reconciliation.models import ProviderFinding, StatementRun, StatementUpload


def findings_in_scope(scope: TenantScope) -> Q:
    """The findings a reader of ``scope`` may see: of their tenants' intents; those without an
    intent belong to no tenant and are seen with a role on every tenant only."""
    if scope.every:
        return Q()
    return Q(intent__tenant__in=sorted(scope.names))


def provider_findings(
    *, scope: TenantScope, state: str = "", kind: str = "", limit: int = 200
) -> QuerySet[ProviderFinding]:
    """Findings of ``scope``, newest first, filtered by ``state`` and ``kind`` when given."""
    found = ProviderFinding.objects.filter(findings_in_scope(scope)).select_related("intent", "compensation")
    if state:
        found = found.filter(state=state)
    if kind:
        found = found.filter(kind=kind)
    return found.order_by("-created_at", "-id")[:limit]


def provider_finding(finding_id: int, *, scope: TenantScope) -> ProviderFinding | None:
    """One finding, if ``scope`` may read it (else None, as for one that does not exist)."""
    return (
        ProviderFinding.objects.filter(findings_in_scope(scope), id=finding_id)
        .select_related("intent", "compensation", "line", "event", "run")
        .first()
    )


def findings_by_kind(*, scope: TenantScope, state: str) -> dict[str, int]:
    """Findings of ``scope`` in ``state`` per kind, every kind present (0 when none):
    ``{"orphan_event": n, "missing_at_provider": n, "extra_at_provider": n, "amount_mismatch": n}``."""
    counts = dict.fromkeys(ProviderFinding.Kind.values, 0)
    rows = (
        ProviderFinding.objects.filter(findings_in_scope(scope), state=state)
        .values("kind")
        .annotate(n=Count("id"))
    )
    for row in rows:
        counts[row["kind"]] = row["n"]
    return counts


def open_findings_by_kind(*, scope: TenantScope) -> dict[str, int]:
    """Open findings of ``scope`` per kind (``findings_by_kind``)."""
    return findings_by_kind(scope=scope, state=ProviderFinding.State.OPEN)


def compensating_findings_by_kind(*, scope: TenantScope) -> dict[str, int]:
    """Findings of ``scope`` whose compensation has not ended yet, per kind (``findings_by_kind``)."""
    return findings_by_kind(scope=scope, state=ProviderFinding.State.COMPENSATING)


def statement_runs(*, source: str = "", limit: int = 100) -> QuerySet[StatementRun]:
    """The latest statement runs (of ``source`` when given), newest first, each with its CSV
    upload when it came from one (``run.upload``, its file left unread)."""
    runs = StatementRun.objects.select_related("upload").defer("upload__data")
    if source:
        runs = runs.filter(source=source)
    return runs.order_by("-started_at", "-id")[:limit]


def statement_uploads_active() -> bool:
    """Whether an uploaded statement is still queued or importing (the statements page then
    refreshes its runs)."""
    return StatementUpload.objects.filter(
        status__in=[StatementUpload.Status.QUEUED, StatementUpload.Status.RUNNING]
    ).exists()
