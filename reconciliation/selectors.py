"""Reads for the operators' queue (UNKNOWN intents, held intents, compensations that need a
decision, duplicate findings, unverified confirmations), evidence pages and reconciliation
history."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Case, F, IntegerField, Prefetch, QuerySet, Value, When
from django.db.models.functions import Now

from operations.access.tenants import TenantScope
from operations.adapters.base import LookupStatus
from operations.models import AuditEvent, Intent, Outcome
from operations.selectors.list_filters import (
    UNKNOWN_DEFAULT_SORT,
    UNKNOWN_SORTS,
    ListFilters,
    intents_filtered,
    sorted_by,
)
from reconciliation.models import DuplicateFinding, Evidence, ProviderEvent, ReconciliationRun

#: How far back the queue lists operator confirmations the provider could not verify.
UNVERIFIED_RECENT = timedelta(days=7)


def unknown_queue(
    *, scope: TenantScope, escalated_only: bool = False, filters: ListFilters | None = None
) -> QuerySet[Intent]:
    """UNKNOWN intents of ``scope``'s tenants narrowed by ``filters``, by default oldest first
    (served by the partial index ``intent_unknown_age``; ``filters.sort`` picks another of
    ``operations.selectors.UNKNOWN_SORTS``), annotated with ``age`` (an interval by the
    database clock)."""
    filters = filters or ListFilters()
    queryset = intents_filtered(Intent.objects.filter(scope.q(), status=Intent.Status.UNKNOWN), filters)
    if escalated_only:
        queryset = queryset.filter(escalated_at__isnull=False)
    queryset = queryset.annotate(age=Now() - F("updated_at"))
    return sorted_by(queryset, UNKNOWN_SORTS, filters.sort, UNKNOWN_DEFAULT_SORT)


def escalated_compensations(*, scope: TenantScope) -> QuerySet[Intent]:
    """COMPENSATING intents of ``scope``'s tenants whose compensation failed, was rejected, expired or was cancelled
    (``escalated_at`` set by ``reconciliation.duplicates.sweep_compensations``), the longest
    waiting first, annotated with ``age`` (since escalation, by the database clock), with
    their compensation intents prefetched as ``compensation_list`` (oldest first)."""
    return (
        Intent.objects.filter(scope.q(), status=Intent.Status.COMPENSATING, escalated_at__isnull=False)
        .annotate(age=Now() - F("escalated_at"))
        .prefetch_related(
            Prefetch(
                "compensations",
                queryset=Intent.objects.order_by("created_at", "id"),
                to_attr="compensation_list",
            )
        )
        .order_by("escalated_at", "id")
    )


def compensations_of(intent: Intent) -> list[Intent]:
    """Every compensation intent opened for ``intent`` (the original's effect or a duplicate
    of it), oldest first, with status and last error."""
    return list(Intent.objects.filter(compensates=intent).order_by("created_at", "id"))


def open_duplicate_findings(*, scope: TenantScope) -> QuerySet[DuplicateFinding]:
    """Duplicate findings of ``scope``'s tenants' intents that need an operator (state ``open``), oldest first (served by the
    partial index ``duplicate_open_q``), with their intent, annotated with ``age``."""
    return (
        DuplicateFinding.objects.filter(scope.q("intent__tenant"), state=DuplicateFinding.State.OPEN)
        .select_related("intent")
        .annotate(age=Now() - F("created_at"))
        .order_by("created_at", "id")
    )


def duplicate_finding(finding_id: int, *, scope: TenantScope) -> DuplicateFinding | None:
    """One duplicate finding of an intent of ``scope``'s tenants, with its intent and
    compensation, or None (another tenant's finding is invisible)."""
    return (
        DuplicateFinding.objects.select_related("intent", "compensation")
        .filter(scope.q("intent__tenant"), id=finding_id)
        .first()
    )


def recently_unverified(*, scope: TenantScope, within: timedelta = UNVERIFIED_RECENT) -> QuerySet[Outcome]:
    """Operator confirmations, on intents of ``scope``'s tenants, the provider could not verify (``detail.verified`` is False,
    recorded by ``reconciliation.resolution.resolve_confirmed`` with ``accept_unverified``)
    in the last ``within``, newest first, with their intent."""
    return (
        Outcome.objects.filter(
            scope.q("intent__tenant"),
            source=Outcome.Source.OPERATOR,
            detail__verified=False,
            created_at__gte=Now() - within,
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


def held_queue(*, scope: TenantScope) -> QuerySet[Intent]:
    """HELD intents of ``scope``'s tenants, each with the earlier intent for the same business action it waits behind
    (``held_behind``, selected): likely duplicates (escalated by ``reconciliation.held``: the
    earlier one SUCCEEDED) first, then the rest, oldest first in each group.

    Annotated with ``age`` (since submission: an intent is HELD from its insertion) and
    ``earlier_age`` (since the earlier intent last changed state), both intervals by the
    database clock.
    """
    return (
        Intent.objects.filter(scope.q(), status=Intent.Status.HELD)
        .select_related("held_behind")
        .annotate(
            age=Now() - F("created_at"),
            earlier_age=Now() - F("held_behind__updated_at"),
            waits_for_a_person=Case(
                When(escalated_at__isnull=False, then=Value(0)), default=Value(1), output_field=IntegerField()
            ),
        )
        .order_by("waits_for_a_person", "created_at", "id")
    )


def intents_held_behind(intent: Intent) -> list[Intent]:
    """Every intent that is or was held behind ``intent`` (``held_behind``), oldest first; those
    released or rejected keep the link, so the list is the business action's history."""
    return list(Intent.objects.filter(held_behind=intent).order_by("created_at", "id"))


def likely_duplicate_event(intent: Intent) -> AuditEvent | None:
    """The newest ``likely_duplicate`` audit event of a held intent (its reason names what the
    earlier intent already did), or None."""
    return intent.audit_events.filter(event="likely_duplicate").order_by("-seq").first()


def intent_evidence(intent: Intent) -> list[Evidence]:
    """Everything gathered about ``intent``'s effect, oldest first."""
    return list(Evidence.objects.filter(intent=intent).order_by("created_at", "id"))


def recent_runs(*, limit: int = 20) -> list[ReconciliationRun]:
    """The newest reconciliation passes."""
    return list(ReconciliationRun.objects.order_by("-started_at")[:limit])


def found_by_lookup(intent: Intent) -> Evidence | None:
    """The latest lookup on record that found the intent's effect at the provider, if any."""
    return (
        Evidence.objects.filter(intent=intent, kind=Evidence.Kind.LOOKUP, result=LookupStatus.FOUND.value)
        .exclude(provider_references=[])
        .order_by("-created_at")
        .first()
    )


def effect_on_record(intent: Intent) -> str | None:
    """What on record says the provider has the intent's effect, or None: a lookup that found
    it, or one that found it under an id that cannot be stored, an attempt the provider
    accepted whose id cannot be stored (``operations.adapters.bounds.reference_problem``), or a
    provider's signed event proving it that waits to be applied (issue 19)."""
    event = (
        ProviderEvent.objects.filter(intent=intent, processed_at__isnull=True, detail__deferred=True)
        .order_by("received_at")
        .first()
    )
    if event is not None:
        return (
            f"the provider's signed event {event.event_id} ({event.event_type}, "
            f"{event.received_at:%Y-%m-%d %H:%M:%S} UTC) shows {event.provider_reference or 'it'}"
        )
    found = found_by_lookup(intent)
    if found is not None:
        return (
            f"a lookup ({found.actor}, {found.created_at:%Y-%m-%d %H:%M:%S} UTC) found "
            f"{', '.join(found.provider_references)}"
        )
    unstorable = (
        Evidence.objects.filter(intent=intent, kind=Evidence.Kind.LOOKUP, detail__reported_status="found")
        .order_by("-created_at")
        .first()
    )
    if unstorable is not None:
        return (
            f"a lookup ({unstorable.actor}, {unstorable.created_at:%Y-%m-%d %H:%M:%S} UTC) found it under "
            "an id that cannot be stored (its sha256 and prefix are in the evidence)"
        )
    if AuditEvent.objects.filter(
        intent=intent, event="outcome_unknown", data__cause="reference_unstorable"
    ).exists():
        return "it accepted an attempt but answered an id that cannot be stored (see the attempt's evidence)"
    return None


def provider_events(*, scope: TenantScope, result: str = "") -> QuerySet[ProviderEvent]:
    """Provider events newest first (by arrival), of one ``result`` when named: those of the
    intents ``scope`` reads, and those matching no intent (orphans) only for a scope of every
    tenant (an orphan belongs to no tenant)."""
    rows = ProviderEvent.objects.select_related("intent").order_by("-received_at", "-id")
    if not scope.every:
        rows = rows.filter(scope.q("intent__tenant"))
    if result in ProviderEvent.Result.values:
        rows = rows.filter(result=result)
    return rows
