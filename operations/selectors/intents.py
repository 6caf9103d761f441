"""Reads of intents: one intent, lists and searches, approvals waiting, attempts and outcomes."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, IntegerField, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Coalesce

from operations.access.tenants import TenantScope
from operations.models import Approval, AuditEvent, Intent, Outcome
from operations.selectors.list_filters import (
    APPROVAL_DEFAULT_SORT,
    APPROVAL_SORTS,
    INTENT_DEFAULT_SORT,
    INTENT_SORTS,
    InvalidFilter,
    ListFilters,
    intent_id_range,
    intents_filtered,
    reference_filter,
    sorted_by,
)
from operations.selectors.pagination import PAGE_SIZE, Page, decode_cursor, encode_cursor


def intent_get(*, tenant: str, intent_id: uuid.UUID, principal: str | None = None) -> Intent | None:
    """The tenant's intent with ``intent_id``, or None (another tenant's intent is invisible).

    Args:
        principal: only an intent this principal submitted (an agent whose scope is ``own``);
            None: any of the tenant's.
    """
    queryset = Intent.objects.filter(tenant=tenant, id=intent_id)
    if principal is not None:
        queryset = queryset.filter(principal=principal)
    return queryset.first()


def intent_status(*, intent_id: uuid.UUID) -> str | None:
    """The intent's status (an ``Intent.Status`` value), or None when there is no such intent;
    one indexed read of one column (``operations.api.waiting`` re-reads it after each wake-up)."""
    return Intent.objects.filter(id=intent_id).values_list("status", flat=True).first()


def intent_list(
    *,
    tenant: str,
    status: str | None = None,
    action: str | None = None,
    reference: str | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    principal: str | None = None,
) -> QuerySet[Intent]:
    """The tenant's intents, filtered (``principal``: only those it submitted); newest first
    (callers paginate by cursor)."""
    queryset = Intent.objects.filter(tenant=tenant)
    if principal is not None:
        queryset = queryset.filter(principal=principal)
    if status:
        queryset = queryset.filter(status=status)
    if action:
        queryset = queryset.filter(action=action)
    if reference:
        queryset = queryset.filter(reference=reference)
    if created_after:
        queryset = queryset.filter(created_at__gte=created_after)
    if created_before:
        queryset = queryset.filter(created_at__lt=created_before)
    return queryset


def intent_latest_outcome(intent: Intent) -> Outcome | None:
    """The newest outcome recorded for ``intent`` (provider, reconciler or operator)."""
    return intent.outcomes.order_by("-created_at", "-id").first()


def intent_latest_decision(intent: Intent) -> AuditEvent | None:
    """The newest decision a person (``user:<name>``) made that moved ``intent`` (an approval,
    a rejection, an operator's "found" or "absent", a release, a cancel), or None: one read of
    its audit chain, newest first. What the API reports as the intent's ``resolution``."""
    return (
        intent.audit_events.filter(actor__startswith="user:").exclude(to_status="").order_by("-seq").first()
    )


def intent_likely_duplicate(intent: Intent) -> AuditEvent | None:
    """Why ``intent`` was held (or rejected) as a likely duplicate of the intent it was held
    behind, whose effect stands: its newest ``likely_duplicate`` audit event, or None.

    Read only for an intent that can have one (HELD and escalated behind an earlier intent, or
    REJECTED after being held), so the representation of every other intent, the happy path's
    included, costs no query."""
    if not may_be_likely_duplicate(intent):
        return None
    return intent.audit_events.filter(event="likely_duplicate").order_by("-seq").first()


def may_be_likely_duplicate(intent: Intent) -> bool:
    """Whether ``intent`` can have a ``likely_duplicate`` event: held behind an earlier intent
    for its business action (not for a person's other reason), and HELD for a person or
    REJECTED by the policy."""
    if intent.held_behind_id is None or intent.hold_reason:
        return False
    held_for_a_person = intent.status == Intent.Status.HELD and intent.escalated_at is not None
    return held_for_a_person or intent.status == Intent.Status.REJECTED


def approvals_inbox(*, scope: TenantScope, filters: ListFilters | None = None) -> QuerySet[Intent]:
    """Intents of ``scope``'s tenants awaiting a decision, narrowed by ``filters``: by default
    highest risk tier first, then newest first (a top-N scan of the partial index
    ``intent_approvals_inbox``); ``filters.sort`` picks another of ``APPROVAL_SORTS``.

    Each row is annotated with ``risk_tier`` and ``approvals_given`` (approvals recorded in the
    current approval round), the latter as a subquery so it is computed only for the rows a page
    shows.
    """
    given = (
        Approval.objects.filter(
            intent=OuterRef("pk"), round=OuterRef("approval_round"), decision=Approval.Decision.APPROVED
        )
        .order_by()
        .values("intent")
        .annotate(n=Count("id"))
        .values("n")
    )
    filters = filters or ListFilters()
    queryset = intents_filtered(
        Intent.objects.filter(scope.q(), status=Intent.Status.AWAITING_APPROVAL), filters
    ).annotate(
        risk_tier=KeyTextTransform("risk_tier", "policy"),
        approvals_given=Coalesce(Subquery(given, output_field=IntegerField()), Value(0)),
    )
    return sorted_by(queryset, APPROVAL_SORTS, filters.sort, APPROVAL_DEFAULT_SORT)


WAIT_EVENTS = {"ceiling": "ceiling_reached", "approval_lapsed": "approval_lapsed"}


def wait_note(intent: Intent) -> str:
    """Why an intent is back in front of its approvers (issue 18): the reason of its latest
    ``ceiling_reached`` or ``approval_lapsed`` event, with the window's reservations; empty
    when it awaits its policy's first approval."""
    event = WAIT_EVENTS.get(intent.wait_reason)
    if intent.status != Intent.Status.AWAITING_APPROVAL or event is None:
        return ""
    reason = (
        AuditEvent.objects.filter(intent=intent, event=event)
        .order_by("-seq")
        .values_list("reason", flat=True)
        .first()
    )
    return reason or event.replace("_", " ")


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


@dataclass
class IntentFilters:
    """What the intents search narrows by; empty fields do not filter.

    ``intent_id`` is a prefix of hex digits, ``reference`` any case (``*`` at the end: a
    prefix), ``principal`` a plain name or ``user:``/``agent:`` one (``list_filters``); ``sort``
    a key of ``INTENT_SORTS`` (blank: newest first)."""

    q: str = ""
    intent_id: str = ""
    tenant: str = ""
    action: str = ""
    status: str = ""
    principal: str = ""
    reference: str = ""
    created_after: datetime | None = None
    created_before: datetime | None = None
    sort: str = ""


#: Fewer hex digits than this in ``q`` are taken for a reference, not an intent id's start.
QUICK_ID_DIGITS = 8


def _quick_search(queryset: QuerySet[Intent], text: str) -> QuerySet[Intent]:
    """The search box ``q``: a whole intent_id, or else a reference in any case
    (``list_filters.reference_filter``); 8 to 31 hex digits (with or without dashes) are also
    the start of an intent id, since a reference can be hex digits too (``12345678``): either
    matches, as a ``BitmapOr`` of the primary key and ``intent_reference_upper``."""
    text = text.strip()
    try:
        return queryset.filter(id=uuid.UUID(text))
    except ValueError:
        pass
    by_reference = reference_filter(queryset, text)
    if len(text.replace("-", "")) < QUICK_ID_DIGITS:
        return by_reference
    try:
        low, high = intent_id_range(text)
    except InvalidFilter:
        return by_reference
    return by_reference | queryset.filter(id__gte=low, id__lte=high)


def intent_search_queryset(
    filters: IntentFilters, *, scope: TenantScope, cursor: str | None = None
) -> QuerySet[Intent]:
    """The rows ``intent_search`` pages through, in its order, from after ``cursor``.

    Either order is the ``intent_created`` index ``(created_at DESC, id ASC)`` read forwards or
    backwards (``intent_status_created`` with a status), so PostgreSQL walks the index from the
    cursor; an id prefix or a reference is a range of the primary key or of
    ``intent_reference_upper`` instead (few rows, then sorted).

    Raises:
        InvalidCursor: ``cursor`` is not one this list wrote, or was written under another sort.
        InvalidFilter: ``filters.intent_id`` is not hex digits.
    """
    sort_key = _intent_sort(filters)
    queryset = Intent.objects.filter(scope.q())
    if filters.q:
        queryset = _quick_search(queryset, filters.q)
    queryset = intents_filtered(queryset, filters)
    if filters.status:
        queryset = queryset.filter(status=filters.status)
    if filters.created_after:
        queryset = queryset.filter(created_at__gte=filters.created_after)
    if filters.created_before:
        queryset = queryset.filter(created_at__lt=filters.created_before)
    position = decode_cursor(cursor, row_id=uuid.UUID, sort=_cursor_sort(sort_key))
    if position:
        created_at, row_id = position
        if sort_key == "created":  # (created_at ASC, id DESC): the index read backwards
            queryset = queryset.filter(created_at__gte=created_at).filter(
                Q(created_at__gt=created_at) | Q(id__lt=row_id)
            )
        else:
            queryset = queryset.filter(created_at__lte=created_at).filter(
                Q(created_at__lt=created_at) | Q(id__gt=row_id)
            )
    return queryset.order_by(*INTENT_SORTS[sort_key].order_by)


def _intent_sort(filters: IntentFilters) -> str:
    return filters.sort if filters.sort in INTENT_SORTS else INTENT_DEFAULT_SORT


def _cursor_sort(sort_key: str) -> str:
    """What a cursor names of its sort: nothing for the default (the cursors written before
    sorts existed stay valid), else the sort's key."""
    return "" if sort_key == INTENT_DEFAULT_SORT else sort_key


def intent_search(
    filters: IntentFilters, *, scope: TenantScope, cursor: str | None = None, limit: int = PAGE_SIZE
) -> Page:
    """Intents of ``scope``'s tenants matching ``filters``, one keyset page of ``limit`` rows,
    newest first or (``filters.sort == "created"``) oldest first (``intent_search_queryset``).
    The next page's cursor names the sort, so it cannot be followed under another.

    Raises:
        InvalidCursor: ``cursor`` is not one this list wrote, or was written under another sort.
        InvalidFilter: ``filters.intent_id`` is not hex digits.
    """
    rows = list(intent_search_queryset(filters, scope=scope, cursor=cursor)[: limit + 1])
    next_cursor = None
    if len(rows) > limit:
        last = rows[limit - 1]
        next_cursor = encode_cursor(last.created_at, last.id, _cursor_sort(_intent_sort(filters)))
    return Page(rows=rows[:limit], next_cursor=next_cursor)


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
