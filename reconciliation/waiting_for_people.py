"""What waits for a person, most urgent first: the dashboard's "Waiting for a person" list
(issue 39 item 5).

The dashboard listed thirteen "waiting for an operator" rows whatever their counts, so the one
that needed somebody did not stand out. ``waiting_for_people`` answers only the kinds of item
with at least one waiting, in ``URGENCY`` order. The order, most urgent first:

1. What loses something if it waits: UNKNOWN intents escalated to operators (nobody knows
   whether the effect happened, the reconciler stopped guessing, the agent waits), then approval
   requests that expire within ``EXPIRING_SOON`` (missed, the request is lost).
2. An effect at a provider that needs a decision, so a customer is not left charged wrongly:
   compensations that ended without effect, duplicate findings (a second effect), then provider
   findings by kind, worst first (an intent that ended without effect whose effect the provider
   has, an effect we never asked for, a wrong amount, an effect missing, an event of no intent).
3. Intents held for a person, which send nothing until one decides: held by the restore guard,
   changed in the database after submission, likely duplicates, not served here.
4. Approval requests with more than ``EXPIRING_SOON`` left.
5. What the ledger is still handling itself, shown so nothing is hidden but not counted as
   waiting for a person (``needs_person`` False): UNKNOWN intents the reconciler still looks
   up, intents held behind an earlier one until it ends, provider findings whose compensation
   runs.

Every count covers the intents of ``scope``'s tenants only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Min, Q
from django.db.models.functions import Now

from operations.access.tenants import TenantScope
from operations.audit.request_integrity import MISMATCH_HOLD
from operations.models import Intent
from operations.services.failover import RESTORE_GUARD_HOLD
from reconciliation.models import DuplicateFinding, ProviderFinding
from reconciliation.provider_selectors import compensating_findings_by_kind, findings_in_scope

#: An approval request with this little time left comes first (most policies give ten minutes).
EXPIRING_SOON = timedelta(minutes=15)

#: Provider findings by kind, worst first (``ProviderFinding.Kind``); a kind not named here
#: comes after these.
FINDING_URGENCY = (
    ProviderFinding.Kind.EFFECT_AFTER_ENDING,
    ProviderFinding.Kind.EXTRA_AT_PROVIDER,
    ProviderFinding.Kind.AMOUNT_MISMATCH,
    ProviderFinding.Kind.MISSING_AT_PROVIDER,
    ProviderFinding.Kind.ORPHAN_EVENT,
)
_FINDING_KINDS = [*FINDING_URGENCY, *(k for k in ProviderFinding.Kind if k not in FINDING_URGENCY)]

#: Every kind of waiting item, most urgent first (the module docstring says why), with whether
#: a person must act on it (``False``: the ledger is still on it).
URGENCY: tuple[tuple[str, bool], ...] = (
    ("unknown_escalated", True),
    ("approvals_expiring", True),
    ("compensations", True),
    ("duplicate_findings", True),
    *((f"provider_findings:{kind.value}", True) for kind in _FINDING_KINDS),
    ("held_after_restore", True),
    ("held_request_mismatch", True),
    ("held_likely_duplicates", True),
    ("held_unserved", True),
    ("approvals", True),
    ("unknown_looking", False),
    ("held_behind", False),
    ("provider_findings_compensating", False),
)


@dataclass(frozen=True)
class Waiting:
    """One kind of item waiting, with how many.

    Attributes:
        key: one of ``URGENCY``'s keys (``unknown_escalated``, ``provider_findings:orphan_event``...).
        count: how many items of this kind wait (never 0 in ``waiting_for_people``'s answer).
        needs_person: a person must act; False where the ledger is still handling them.
        since: when the longest-waiting one began to wait (None where not tracked).
        due: the soonest deadline among them (approval requests: their expiry), else None.
    """

    key: str
    count: int
    needs_person: bool
    since: datetime | None = None
    due: datetime | None = None


def _held(query: Q) -> Q:
    return Q(status=Intent.Status.HELD) & query


def _intent_figures(scope: TenantScope) -> dict[str, tuple[int, datetime | None, datetime | None]]:
    """``key -> (count, since, due)`` of the kinds read from intents: one aggregate over the
    open states UNKNOWN, AWAITING_APPROVAL, COMPENSATING and HELD (few rows, on their indexes)."""
    status = Intent.Status
    soon = Now() + EXPIRING_SOON  # database time, as the expiry sweep reads it
    restore = Q(hold_reason__startswith=RESTORE_GUARD_HOLD)
    mismatch = Q(hold_reason__startswith=MISMATCH_HOLD)
    # key -> (which intents, the field whose minimum is "since", the one whose minimum is "due")
    kinds: dict[str, tuple[Q, str | None, str | None]] = {
        "unknown_escalated": (Q(status=status.UNKNOWN, escalated_at__isnull=False), "escalated_at", None),
        "unknown_looking": (Q(status=status.UNKNOWN, escalated_at__isnull=True), "updated_at", None),
        "approvals_expiring": (
            Q(status=status.AWAITING_APPROVAL, approval_expires_at__lte=soon),
            "created_at",
            "approval_expires_at",
        ),
        # An expiry that is NULL or later than ``soon`` (Django's negation keeps the NULLs).
        "approvals": (
            Q(status=status.AWAITING_APPROVAL) & ~Q(approval_expires_at__lte=soon),
            "created_at",
            "approval_expires_at",
        ),
        "compensations": (Q(status=status.COMPENSATING, escalated_at__isnull=False), "escalated_at", None),
        "held_after_restore": (_held(restore), "updated_at", None),
        "held_request_mismatch": (_held(mismatch), "updated_at", None),
        "held_unserved": (_held(~Q(hold_reason="") & ~restore & ~mismatch), "updated_at", None),
        "held_likely_duplicates": (
            _held(Q(hold_reason="", escalated_at__isnull=False)),
            "escalated_at",
            None,
        ),
        "held_behind": (_held(Q(hold_reason="", escalated_at__isnull=True)), "created_at", None),
    }
    aggregates: dict[str, Any] = {}
    for key, (which, since, due) in kinds.items():
        aggregates[f"{key}__n"] = Count("id", filter=which)
        if since:
            aggregates[f"{key}__since"] = Min(since, filter=which)
        if due:
            aggregates[f"{key}__due"] = Min(due, filter=which)
    open_states = [status.UNKNOWN, status.AWAITING_APPROVAL, status.COMPENSATING, status.HELD]
    row = Intent.objects.filter(scope.q(), status__in=open_states).aggregate(**aggregates)
    return {key: (row[f"{key}__n"], row.get(f"{key}__since"), row.get(f"{key}__due")) for key in kinds}


def waiting_for_people(*, scope: TenantScope) -> list[Waiting]:
    """The kinds of item waiting in ``scope``'s tenants, each with at least one, most urgent first
    (``URGENCY``; the module docstring gives the order and why). Four queries: the open
    intents' aggregate, open duplicate findings, open provider findings by kind, and provider
    findings being compensated."""
    figures = _intent_figures(scope)
    duplicates = DuplicateFinding.objects.filter(
        scope.q("intent__tenant"), state=DuplicateFinding.State.OPEN
    ).aggregate(n=Count("id"), since=Min("created_at"))
    figures["duplicate_findings"] = (duplicates["n"], duplicates["since"], None)
    open_findings = (
        ProviderFinding.objects.filter(findings_in_scope(scope), state=ProviderFinding.State.OPEN)
        .values("kind")
        .annotate(n=Count("id"), since=Min("created_at"))
    )
    for found in open_findings:
        figures[f"provider_findings:{found['kind']}"] = (found["n"], found["since"], None)
    compensating = sum(compensating_findings_by_kind(scope=scope).values())
    figures["provider_findings_compensating"] = (compensating, None, None)
    rows = []
    for key, needs_person in URGENCY:
        count, since, due = figures.get(key, (0, None, None))
        if count:
            rows.append(Waiting(key, count, needs_person, since, due))
    return rows
