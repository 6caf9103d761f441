"""Reads behind the console pages (no writes here).

Lists use keyset pagination on the indexes the ledger already has: intents on
``(created_at DESC, id ASC)`` (``intent_created`` / ``intent_status_created``), audit events
on ``(created_at DESC, id DESC)`` (``audit_created``), so a page costs the same at row one
million as at row one.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, IntegerField, Min, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Coalesce, Now, TruncMinute
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from operations.models import Approval, AuditEvent, Intent, Outcome

PAGE_SIZE = 50
# --- keyset cursors -------------------------------------------------------------------------


def encode_cursor(created_at: datetime, row_id: Any) -> str:
    """An opaque cursor for the row after which the next page starts."""
    raw = json.dumps([created_at.isoformat(), str(row_id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> tuple[datetime, str] | None:
    """The (created_at, id) a cursor names, or None for a missing or malformed cursor."""
    if not cursor:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_raw, row_id = json.loads(raw)
        created_at = parse_datetime(created_raw)
    except (binascii.Error, ValueError, TypeError):
        return None
    if created_at is None:
        return None
    return created_at, str(row_id)


@dataclass
class Page:
    """One page of a keyset-paginated list; ``next_cursor`` is None on the last page."""

    rows: list[Any]
    next_cursor: str | None


# --- approvals ------------------------------------------------------------------------------


def approvals_inbox() -> QuerySet[Intent]:
    """Intents awaiting a decision: highest risk tier first, then newest first (a top-N scan
    of the partial index ``intent_approvals_inbox``).

    Each row is annotated with ``risk_tier`` and ``approvals_given`` (approvals recorded), the
    latter as a subquery so it is computed only for the rows a page shows.
    """
    given = (
        Approval.objects.filter(intent=OuterRef("pk"), decision=Approval.Decision.APPROVED)
        .order_by()
        .values("intent")
        .annotate(n=Count("id"))
        .values("n")
    )
    return (
        Intent.objects.filter(status=Intent.Status.AWAITING_APPROVAL)
        .annotate(
            risk_tier=KeyTextTransform("risk_tier", "policy"),
            approvals_given=Coalesce(Subquery(given, output_field=IntegerField()), Value(0)),
        )
        .order_by("-risk_rank", "-created_at", "id")
    )


def previous_with_reference(intent: Intent) -> Intent | None:
    """The tenant's latest earlier intent with the same business reference, if any."""
    if not intent.reference:
        return None
    return (
        Intent.objects.filter(
            tenant=intent.tenant, reference=intent.reference, created_at__lt=intent.created_at
        )
        .exclude(id=intent.id)
        .order_by("-created_at", "-id")
        .first()
    )


@dataclass(frozen=True)
class DiffRow:
    """One changed leaf between two payloads; ``before``/``after`` are None when absent."""

    path: str
    before: Any
    after: Any


def payload_diff(before: Any, after: Any, path: str = "") -> list[DiffRow]:
    """Every leaf that differs between two JSON values, as dotted paths (``items[0].sku``)."""
    if isinstance(before, dict) and isinstance(after, dict):
        rows: list[DiffRow] = []
        for key in sorted(set(before) | set(after)):
            sub = f"{path}.{key}" if path else str(key)
            rows.extend(payload_diff(before.get(key), after.get(key), sub))
        return rows
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        rows = []
        for index, (old, new) in enumerate(zip(before, after, strict=True)):
            rows.extend(payload_diff(old, new, f"{path}[{index}]"))
        return rows
    if before != after:
        return [DiffRow(path or "(whole payload)", before, after)]
    return []


# --- intents search -------------------------------------------------------------------------


@dataclass
class IntentFilters:
    """What the intents search narrows by; empty fields do not filter."""

    q: str = ""
    tenant: str = ""
    action: str = ""
    status: str = ""
    principal: str = ""
    reference: str = ""
    created_after: datetime | None = None
    created_before: datetime | None = None


def intent_search(filters: IntentFilters, *, cursor: str | None = None, limit: int = PAGE_SIZE) -> Page:
    """Intents matching ``filters``, newest first, one keyset page of ``limit`` rows.

    ``q`` is an intent_id (exact) or else a reference (exact). The ordering
    ``(created_at DESC, id ASC)`` is the one the ``intent_created`` and
    ``intent_status_created`` indexes store, so PostgreSQL walks the index from the cursor.
    """
    queryset = Intent.objects.all()
    if filters.q:
        try:
            queryset = queryset.filter(id=uuid.UUID(filters.q.strip()))
        except ValueError:
            queryset = queryset.filter(reference=filters.q.strip())
    for name in ("tenant", "action", "status", "principal", "reference"):
        value = getattr(filters, name)
        if value:
            queryset = queryset.filter(**{name: value})
    if filters.created_after:
        queryset = queryset.filter(created_at__gte=filters.created_after)
    if filters.created_before:
        queryset = queryset.filter(created_at__lt=filters.created_before)
    position = decode_cursor(cursor)
    if position:
        created_at, row_id = position
        queryset = queryset.filter(created_at__lte=created_at).filter(
            Q(created_at__lt=created_at) | Q(id__gt=row_id)
        )
    rows = list(queryset.order_by("-created_at", "id")[: limit + 1])
    next_cursor = encode_cursor(rows[limit - 1].created_at, rows[limit - 1].id) if len(rows) > limit else None
    return Page(rows=rows[:limit], next_cursor=next_cursor)


# --- intent detail --------------------------------------------------------------------------


@dataclass(frozen=True)
class TimelineEntry:
    """One line of an intent's timeline: an audit event, approval, attempt, outcome or evidence."""

    at: datetime
    kind: str
    title: str
    actor: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    note: str = ""


def intent_evidence_rows(intent: Intent) -> list[Any]:
    """What the reconciler and operators learned about ``intent`` (``reconciliation.Evidence``)."""
    from reconciliation.models import Evidence

    return list(Evidence.objects.filter(intent=intent).order_by("created_at", "id"))


def intent_timeline(intent: Intent) -> list[TimelineEntry]:
    """Every audit event, approval, attempt (start and finish), outcome and piece of evidence
    of ``intent``, oldest first."""
    entries: list[TimelineEntry] = []
    for event in intent.audit_events.order_by("seq"):
        moved = f"{event.from_status or '·'} → {event.to_status}" if event.to_status else ""
        entries.append(
            TimelineEntry(
                event.created_at,
                "audit",
                f"{event.event} {moved}".strip(),
                event.actor,
                event.data,
                event.reason,
            )
        )
    for approval in intent.approvals.select_related("approver").order_by("created_at"):
        entries.append(
            TimelineEntry(
                approval.created_at,
                "approval",
                f"{approval.decision} by {approval.approver.get_username()}",
                f"user:{approval.approver.get_username()}",
                {"request_hash": approval.request_hash, "expires_at": approval.expires_at.isoformat()},
                approval.reason,
            )
        )
    for attempt in intent.attempts.order_by("attempt_no"):
        entries.append(
            TimelineEntry(
                attempt.started_at,
                "attempt",
                f"attempt {attempt.attempt_no} started, fence {attempt.fence}",
                f"worker:{attempt.worker}",
            )
        )
        if attempt.finished_at:
            entries.append(
                TimelineEntry(
                    attempt.finished_at,
                    "attempt",
                    f"attempt {attempt.attempt_no} (fence {attempt.fence}) {attempt.result}",
                    f"worker:{attempt.worker}",
                    attempt.detail,
                    attempt.error,
                )
            )
    for outcome in intent.outcomes.order_by("created_at"):
        entries.append(
            TimelineEntry(
                outcome.created_at,
                "outcome",
                f"outcome from {outcome.source}: {outcome.provider_reference or '(no reference)'}",
                outcome.source,
                outcome.detail,
            )
        )
    for evidence in intent_evidence_rows(intent):
        entries.append(
            TimelineEntry(
                evidence.created_at,
                "evidence",
                f"{evidence.get_kind_display()}: {evidence.result}",
                evidence.actor,
                {"provider_references": evidence.provider_references, **(evidence.detail or {})},
            )
        )
    return sorted(entries, key=lambda entry: entry.at)


def attempts_with_timings(intent: Intent) -> list[dict[str, Any]]:
    """The intent's attempts, oldest first, with their duration in seconds (None while open)."""
    rows = []
    for attempt in intent.attempts.order_by("attempt_no"):
        seconds = (attempt.finished_at - attempt.started_at).total_seconds() if attempt.finished_at else None
        rows.append({"attempt": attempt, "seconds": seconds})
    return rows


def intent_outcomes(intent: Intent) -> list[Outcome]:
    """Every outcome recorded for ``intent``, oldest first."""
    return list(intent.outcomes.order_by("created_at", "id"))


# --- audit log ------------------------------------------------------------------------------


@dataclass
class AuditFilters:
    """What the audit log narrows by; empty fields do not filter."""

    intent_id: uuid.UUID | None = None
    actor: str = ""
    event: str = ""
    created_after: datetime | None = None
    created_before: datetime | None = None


def audit_queryset(filters: AuditFilters) -> QuerySet[AuditEvent]:
    """Audit events matching ``filters``, newest first (``audit_created`` index order)."""
    queryset = AuditEvent.objects.all()
    if filters.intent_id:
        queryset = queryset.filter(intent_id=filters.intent_id)
    if filters.actor:
        queryset = queryset.filter(actor=filters.actor)
    if filters.event:
        queryset = queryset.filter(event=filters.event)
    if filters.created_after:
        queryset = queryset.filter(created_at__gte=filters.created_after)
    if filters.created_before:
        queryset = queryset.filter(created_at__lt=filters.created_before)
    return queryset.order_by("-created_at", "-id")


def audit_search(filters: AuditFilters, *, cursor: str | None = None, limit: int = PAGE_SIZE) -> Page:
    """One keyset page of the audit log, newest first."""
    queryset = audit_queryset(filters)
    position = decode_cursor(cursor)
    if position:
        created_at, row_id = position
        try:
            last_id = int(row_id)
        except ValueError:
            last_id = 0
        queryset = queryset.filter(created_at__lte=created_at).filter(
            Q(created_at__lt=created_at) | Q(id__lt=last_id)
        )
    rows = list(queryset[: limit + 1])
    next_cursor = encode_cursor(rows[limit - 1].created_at, rows[limit - 1].id) if len(rows) > limit else None
    return Page(rows=rows[:limit], next_cursor=next_cursor)


# --- dashboard ------------------------------------------------------------------------------

UNKNOWN_AGE_BUCKETS: list[tuple[str, timedelta | None, timedelta | None]] = [
    ("under 5 minutes", None, timedelta(minutes=5)),
    ("5 to 60 minutes", timedelta(minutes=5), timedelta(hours=1)),
    ("1 to 24 hours", timedelta(hours=1), timedelta(days=1)),
    ("over 24 hours", timedelta(days=1), None),
]


def unknown_by_age() -> list[tuple[str, int]]:
    """UNKNOWN intents counted by time since they became UNKNOWN (their last update)."""
    aggregates: dict[str, Any] = {}
    for index, (_, older_than, younger_than) in enumerate(UNKNOWN_AGE_BUCKETS):
        condition = Q()
        if older_than is not None:
            condition &= Q(updated_at__lte=Now() - older_than)
        if younger_than is not None:
            condition &= Q(updated_at__gt=Now() - younger_than)
        aggregates[f"b{index}"] = Count("id", filter=condition)
    counts = Intent.objects.filter(status=Intent.Status.UNKNOWN).aggregate(**aggregates)
    return [(label, counts[f"b{index}"]) for index, (label, _, _) in enumerate(UNKNOWN_AGE_BUCKETS)]


def approvals_waiting() -> dict[str, Any]:
    """How many intents await approval and when the oldest was submitted."""
    row = Intent.objects.filter(status=Intent.Status.AWAITING_APPROVAL).aggregate(
        count=Count("id"), oldest=Min("created_at")
    )
    return {"count": row["count"], "oldest": row["oldest"]}


def throughput_last_hour(now: datetime | None = None) -> list[dict[str, Any]]:
    """Intents that finished (SUCCEEDED or FAILED) per minute over the last 60 minutes, oldest
    minute first: ``[{"minute": datetime, "succeeded": int, "failed": int}]`` (60 rows).

    Read from audit events (served by the ``audit_created`` index)."""
    now = now or timezone.now()
    end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    start = end - timedelta(minutes=60)
    buckets = {start + timedelta(minutes=i): {"succeeded": 0, "failed": 0} for i in range(60)}
    rows = (
        AuditEvent.objects.filter(
            created_at__gte=start, created_at__lt=end, to_status__in=["SUCCEEDED", "FAILED"]
        )
        .annotate(minute=TruncMinute("created_at"))
        .values("minute", "to_status")
        .annotate(n=Count("id"))
    )
    for row in rows:
        bucket = buckets.get(row["minute"])
        if bucket is not None:
            bucket["succeeded" if row["to_status"] == "SUCCEEDED" else "failed"] += row["n"]
    return [{"minute": minute, **counts} for minute, counts in buckets.items()]


def process_counters() -> dict[str, float]:
    """Counters summed over every process on this machine that wrote to the Prometheus
    multiprocess folder (``PROMETHEUS_MULTIPROC_DIR``): duplicate deliveries absorbed and stale
    fences rejected. Machines other than this one are not included; ``/metrics`` scraped by
    Prometheus is the fleet-wide source."""
    from prometheus_client import CollectorRegistry, multiprocess

    import operations.metrics  # noqa: F401  (sets PROMETHEUS_MULTIPROC_DIR)

    wanted = {
        "effect_ledger_duplicate_deliveries_total": "duplicate_deliveries",
        "effect_ledger_stale_fences_rejected_total": "stale_fences_rejected",
    }
    totals = dict.fromkeys(wanted.values(), 0.0)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name in wanted:
                totals[wanted[sample.name]] += sample.value
    return totals
