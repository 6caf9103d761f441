"""The rows of the console's long lists (the approvals inbox, the UNKNOWN intents of the
operators' queue, the intents search), shaped once in Python before rendering (issue 37).

A list shows up to 200 rows (the search 50 a page). Asked of the template, each row's money (Babel), target (the
action's adapter), links (``{% url %}``), dates and durations went through a template filter or
tag per cell: more than half of the page's server time at 10⁶ intents. Here each row is a
small frozen dataclass of the values its cells print, computed by the same functions the
filters call (``console.templatetags.console``), so the page reads the same; the template only
places them. No reads here: the views hand in the rows they selected.
"""

from __future__ import annotations

import unicodedata
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.urls import reverse
from django.utils import timezone
from django.utils.text import Truncator

from console.templatetags.console import age, amount, duration, remaining, status_class, target
from operations.models import Intent
from operations.services.assignment import Assignment, assignment_active

#: The intent columns the inbox's rows print (``ApprovalRow.of``); the view reads only these.
APPROVAL_COLUMNS = (
    "id", "tenant", "principal", "action", "reference", "arguments", "wait_reason",
    "approval_expires_at", "created_at",
)  # fmt: skip
#: The intent columns the UNKNOWN rows print (``UnknownRow.of``); the view reads only these.
UNKNOWN_COLUMNS = (
    "id", "tenant", "action", "reference", "arguments", "attempt_count", "lookup_count",
    "escalated_at", "last_error", "assigned_to", "assigned_at",
)  # fmt: skip
#: ``last_error`` is cut to this many characters in the queue (as ``truncatechars:80`` did).
LAST_ERROR_CHARS = 80
#: The search shows an intent's id cut to this many characters (as ``truncatechars:13`` did).
SHORT_ID_CHARS = 13
#: What a blank reference shows (as ``default:"—"`` did).
NO_REFERENCE = "—"


def url_maker(name: str) -> Callable[[uuid.UUID], str]:
    """The path of URL ``name`` for an intent id, e.g. ``url_maker("intent-detail")(id)`` ->
    ``/intents/<id>/``: ``reverse`` once with a placeholder id, then string formatting per
    row (a ``reverse`` costs tens of microseconds; a list makes hundreds). ``name`` must take
    exactly one ``<uuid:…>`` argument."""
    placeholder = str(uuid.UUID(int=0))
    head, found, tail = reverse(name, args=[placeholder]).partition(placeholder)
    assert found, name
    return lambda intent_id: f"{head}{intent_id}{tail}"


def _iso(moment: datetime | None) -> str:
    """``{{ moment|date:"c" }}``: ISO 8601 in the current time zone; blank for None."""
    return timezone.localtime(moment).isoformat() if moment is not None else ""


def _hour_minute(moment: datetime | None) -> str:
    """``{{ moment|date:"H:i" }}``: ``09:05`` in the current time zone; blank for None."""
    return timezone.localtime(moment).strftime("%H:%M") if moment is not None else ""


def _cut(text: str, length: int) -> str:
    """``{{ text|truncatechars:length }}`` (``Truncator.chars``), without building a
    ``Truncator`` for the text that is short enough already (its NFC form, as it returns)."""
    normal = unicodedata.normalize("NFC", text)
    return normal if len(normal) <= length else Truncator(text).chars(length)


@dataclass(frozen=True, slots=True)
class RiskLink:
    """Another intent approving a row's intent may duplicate: its page, id and status."""

    url: str
    id: uuid.UUID
    status: str


@dataclass(frozen=True, slots=True)
class ApprovalRow:
    """One row of the approvals inbox, as printed: ``risks`` are the other intents named by its
    duplicate-risk badge (empty: no badge); ``approvals`` is ``"given of required"``; the
    expiry as ISO 8601 (``datetime`` of the countdown) and as ``remaining`` says; ``submitted``
    as ``age`` says."""

    id: uuid.UUID
    url: str
    risk_tier: Any
    action: str
    wait_reason: str
    risks: list[RiskLink]
    tenant: str
    reference: str
    target: str
    amount: str
    principal: str
    approvals: str
    expires_iso: str
    expires_in: str
    submitted: str


def approval_rows(
    intents: Iterable[Intent], risks: Mapping[uuid.UUID, Sequence[Intent]]
) -> list[ApprovalRow]:
    """The inbox's rows of ``intents`` (from ``operations.selectors.approvals_inbox``, with its
    ``risk_tier`` and ``approvals_given`` and this module's ``approvals_required``
    annotations, read with ``APPROVAL_COLUMNS``), each with its duplicate risks from ``risks``
    (``operations.selectors.duplicate_risk.duplicate_risks``)."""
    detail_url, intent_url = url_maker("approval-detail"), url_maker("intent-detail")
    rows = []
    for intent in intents:
        others = [RiskLink(intent_url(o.id), o.id, o.status) for o in risks.get(intent.id, ())]
        rows.append(
            ApprovalRow(
                id=intent.id,
                url=detail_url(intent.id),
                risk_tier=getattr(intent, "risk_tier", None),
                action=intent.action,
                wait_reason=intent.wait_reason,
                risks=others,
                tenant=intent.tenant,
                reference=intent.reference or NO_REFERENCE,
                target=target(intent),
                amount=amount(intent.arguments),
                principal=intent.principal,
                approvals=_approvals(intent),
                expires_iso=_iso(intent.approval_expires_at),
                expires_in=remaining(intent.approval_expires_at),
                submitted=age(intent.created_at),
            )
        )
    return rows


@dataclass(frozen=True, slots=True)
class UnknownRow:
    """One row of the UNKNOWN intents of the operators' queue, as printed: ``age`` as
    ``duration`` says; ``escalated_ago`` blank when not escalated; ``owner`` who is on it (None:
    nobody), with ``owner_since`` (``H:i``, UTC) and ``owner_for`` (``age``)."""

    id: uuid.UUID
    url: str
    age: str
    action: str
    tenant: str
    reference: str
    target: str
    amount: str
    attempt_count: int
    lookup_count: int
    escalated: bool
    escalated_ago: str
    last_error: str
    owner: Assignment | None
    owner_since: str
    owner_for: str


def unknown_rows(intents: Iterable[Intent]) -> list[UnknownRow]:
    """The queue's rows of ``intents`` (from ``reconciliation.selectors.unknown_queue``, with its
    ``age`` annotation, a ``timedelta``; read with ``UNKNOWN_COLUMNS``)."""
    detail_url = url_maker("unknown-detail")
    now = timezone.now()
    rows = []
    for intent in intents:
        owner = assignment_active(intent, now=now)
        since = owner.since if owner is not None else None
        rows.append(
            UnknownRow(
                id=intent.id,
                url=detail_url(intent.id),
                age=duration(intent.age.total_seconds()),  # type: ignore[attr-defined]
                action=intent.action,
                tenant=intent.tenant,
                reference=intent.reference or NO_REFERENCE,
                target=target(intent),
                amount=amount(intent.arguments),
                attempt_count=intent.attempt_count,
                lookup_count=intent.lookup_count,
                escalated=intent.escalated_at is not None,
                escalated_ago=age(intent.escalated_at),
                last_error=_cut(intent.last_error, LAST_ERROR_CHARS),
                owner=owner,
                owner_since=_hour_minute(since),
                owner_for=age(since),
            )
        )
    return rows


@dataclass(frozen=True, slots=True)
class IntentRow:
    """One row of the intents search, as printed: ``created`` (``Y-m-d H:i:s`` in the current
    time zone), ``short_id`` (the id cut to 13 characters) and ``status_class`` (its badge)."""

    id: uuid.UUID
    url: str
    created: str
    short_id: str
    status: str
    status_class: str
    action: str
    tenant: str
    principal: str
    reference: str
    target: str
    amount: str
    attempt_count: int


def intent_rows(intents: Iterable[Intent]) -> list[IntentRow]:
    """The search's rows of ``intents`` (a page of ``operations.selectors.intent_search``)."""
    detail_url = url_maker("intent-detail")
    return [
        IntentRow(
            id=intent.id,
            url=detail_url(intent.id),
            created=timezone.localtime(intent.created_at).strftime("%Y-%m-%d %H:%M:%S"),
            short_id=_cut(str(intent.id), SHORT_ID_CHARS),
            status=intent.status,
            status_class=status_class(intent.status),
            action=intent.action,
            tenant=intent.tenant,
            principal=intent.principal,
            reference=intent.reference or NO_REFERENCE,
            target=target(intent),
            amount=amount(intent.arguments),
            attempt_count=intent.attempt_count,
        )
        for intent in intents
    ]


def _approvals(intent: Intent) -> str:
    """``"1 of 2"``: approvals given in the current round of those its policy requires (blank
    when the snapshot names none, as the template's lookup of a missing key printed)."""
    required = getattr(intent, "approvals_required", None)
    return f"{getattr(intent, 'approvals_given', 0)} of {'' if required is None else required}"
