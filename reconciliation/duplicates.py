"""Duplicate checks at providers without idempotency keys, and compensations that end badly.

An intent sent more than once to a provider that cannot deduplicate may have left two
effects. Whatever ended it (worker, reconciler, operator) scheduled checks over its lookup's
consistency window (``operations.services.duplicate_check_updates``); each check lists what the
provider holds for the intent. Every extra effect becomes a ``DuplicateFinding``: with its own
keyed, audited compensation intent where the action has one (``compensating``), else visible to
operators (``open``) — never an exception.

A compensation that fails, is rejected, expires or is cancelled is never a dead end:
``sweep_compensations`` puts the original (COMPENSATING) back in front of an operator
(escalated, with the evidence) and re-opens the finding of a duplicate whose compensation
failed. Operators then open a new compensation or settle it (``reconciliation.resolution``).

Each item is its own transaction; an error is logged, counted, returned to the pass and the
item is looked at again later (the claim already pushed its next check forward).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef

from operations import metrics, services
from operations.adapters.base import LookupStatus
from operations.adapters.registry import capabilities_for
from operations.engine.calls import provider_lookup
from operations.exceptions import ResolutionRefused
from operations.models import ENDED_WITHOUT_EFFECT, Intent
from reconciliation.attribution import attribute
from reconciliation.models import DuplicateFinding, Evidence
from reconciliation.schedule import lookup_delay_seconds

logger = logging.getLogger("reconciliation")


#: States in which the effect an intent keeps is known, so extra effects can be told apart.
ENDED_WITH_EFFECT = (Intent.Status.SUCCEEDED, Intent.Status.COMPENSATING, Intent.Status.COMPENSATED)


@dataclass
class DuplicateCounts:
    """What one pass of duplicate checks (or of the compensation sweep) did."""

    examined: int = 0
    found: int = 0
    escalated: int = 0
    errors: list[str] = field(default_factory=list)


def _kept_reference(intent: Intent, found: tuple[str, ...]) -> str:
    recorded = intent.outcomes.order_by("created_at").values_list("provider_reference", flat=True).first()
    return recorded or found[0]


def _open_compensation(intent: Intent, reference: str) -> Intent | None:
    """The compensation intent of duplicate ``reference``, or None when it cannot be opened (a
    declared compensation whose action is not served or whose arguments are refused; logged):
    the duplicate is then left open for operators, never dropped."""
    try:
        return services.intent_open_compensation(
            original=intent, provider_reference=reference, principal="system:reconciler", cause="duplicate"
        )
    except ResolutionRefused as exc:
        logger.warning("duplicate %s of intent %s left for operators: %s", reference, intent.id, exc)
        return None


def record_duplicates(*, intent: Intent, references: list[str], keep: str, ambiguous: str = "") -> int:
    """Record every effect in ``references`` other than ``keep`` as a ``DuplicateFinding`` of
    ``intent`` (once each), compensating it where the action has a compensation, else leaving
    it open for operators. Call inside a transaction; pass only effects that may be the
    intent's (``reconciliation.attribution``).

    Args:
        ambiguous: why the effects cannot be told apart from other intents' (C34): then none is
            compensated automatically; each finding is left open for operators, saying why.

    Returns:
        How many findings are new.
    """
    extras = [ref for ref in dict.fromkeys(references) if ref != keep]
    known = set(
        DuplicateFinding.objects.filter(intent=intent, provider_reference__in=extras).values_list(
            "provider_reference", flat=True
        )
    )
    new = [ref for ref in extras if ref not in known]
    if not new:
        return 0
    Evidence.objects.create(
        intent=intent,
        kind=Evidence.Kind.DUPLICATE,
        result="duplicates_found",
        provider_references=references,
        detail={"kept": keep, "extra": new},
    )
    compensation_action = capabilities_for(intent.action).compensation_action
    for ref in new:
        if ambiguous:
            DuplicateFinding.objects.create(
                intent=intent,
                provider_reference=ref,
                kept_reference=keep,
                state=DuplicateFinding.State.OPEN,
                note=f"not compensated automatically: {ambiguous}"[:1000],
            )
            handling = "flagged"
        elif compensation_action and (opened := _open_compensation(intent, ref)) is not None:
            compensation = opened
            DuplicateFinding.objects.create(
                intent=intent,
                provider_reference=ref,
                kept_reference=keep,
                state=DuplicateFinding.State.COMPENSATING,
                compensation=compensation,
                note=f"compensating with {compensation_action}",
            )
            handling = "compensating"
        else:
            why = (
                f"its compensation {compensation_action} cannot be opened (see the intent's audit)"
                if compensation_action
                else f"{intent.action} has no compensation"
            )
            DuplicateFinding.objects.create(
                intent=intent,
                provider_reference=ref,
                kept_reference=keep,
                state=DuplicateFinding.State.OPEN,
                note=f"{why}: an operator must decide"[:1000],
            )
            handling = "flagged"
        services.intent_note_duplicate(
            intent_id=intent.id, provider_reference=ref, kept=keep, handling=handling
        )
        metrics.DUPLICATES_FOUND.labels(handling=handling).inc()
    return len(new)


def _next_check(intent_id: uuid.UUID, checks: int, *, conclusive: bool) -> None:
    """Schedule the next check with backoff (``lookup_delay_seconds``). A conclusive check
    (the provider showed at least the effect the intent keeps) after the consistency window is
    the last; an inconclusive one never ends the checks: a read path that has not even caught
    up with the kept effect proves nothing about a second one, so they go on, at most hourly."""
    services.intent_schedule_duplicate_check(
        intent_id=intent_id, delay_seconds=lookup_delay_seconds(checks), end_after_window=conclusive
    )


def check_intent_for_duplicates(intent_id: uuid.UUID) -> int:
    """One duplicate check of one intent: look every effect up at the provider and record the
    extras. Returns how many new findings it recorded.

    An intent that has not ended yet (READY, RUNNING, UNKNOWN after an operator's ``absent``)
    is checked again later; one that ended without any effect needs no check.
    """
    intent = Intent.objects.get(id=intent_id)
    if intent.status in ENDED_WITHOUT_EFFECT:
        services.intent_end_duplicate_checks(intent_id=intent_id)
        return 0
    checks = (
        Evidence.objects.filter(
            intent=intent, kind=Evidence.Kind.LOOKUP, detail__purpose="duplicates"
        ).count()
        + 1
    )
    if intent.status not in ENDED_WITH_EFFECT:
        _next_check(intent_id, checks, conclusive=True)
        return 0
    result = provider_lookup(intent)  # never raises; storable (operations.adapters.bounds)
    Evidence.objects.create(
        intent=intent,
        kind=Evidence.Kind.LOOKUP,
        result=result.status.value,
        provider_references=list(result.provider_references),
        detail={**result.detail, "purpose": "duplicates"},
    )
    metrics.LOOKUPS.labels(result=result.status.value).inc()
    found = 0
    conclusive = False
    if result.status == LookupStatus.FOUND and result.provider_references:
        keep = _kept_reference(intent, result.provider_references)
        conclusive = keep in result.provider_references
        # Another intent's effect (a reference two tenants share) is never this one's duplicate.
        attribution = attribute(intent, result.provider_references)
        if len(attribution.own) > 1:
            with transaction.atomic():
                found = record_duplicates(
                    intent=intent,
                    references=list(attribution.own),
                    keep=keep,
                    ambiguous=attribution.ambiguous,
                )
    _next_check(intent_id, checks, conclusive=conclusive)
    return found


def run_duplicate_checks(*, batch: int | None = None) -> DuplicateCounts:
    """One pass: every intent due for a duplicate check, each on its own; one item's error
    never stops the pass (it is counted, reported and the item is checked again later)."""
    counts = DuplicateCounts()
    size = batch or int(settings.EFFECT_LEDGER["RECONCILE_BATCH"])
    for intent_id in services.intents_claim_due_duplicate_checks(batch=size):
        counts.examined += 1
        try:
            counts.found += check_intent_for_duplicates(intent_id)
        except Exception as exc:
            logger.exception("duplicate check failed", extra={"intent_id": str(intent_id)})
            metrics.RECONCILE_ITEM_ERRORS.labels(sweep="duplicates").inc()
            counts.errors.append(f"duplicate check of {intent_id}: {exc!r}"[:300])
    return counts


#: Compensation states a finding waits for: it succeeded, or it can no longer succeed.
COMPENSATION_ENDED = (Intent.Status.SUCCEEDED, *services.COMPENSATION_DEAD_ENDS)


def compensation_end(compensation: Intent) -> tuple[bool, str]:
    """What an ended compensation means for the finding it undoes (a duplicate finding or a
    provider finding): ``(True, note)`` resolved when it SUCCEEDED, else ``(False, note)`` with
    its state and last error, for the finding to be open again for operators."""
    if compensation.status == Intent.Status.SUCCEEDED:
        return True, f"compensated by {compensation.id}"
    return False, f"compensation {compensation.id} ended {compensation.status}: {compensation.last_error}"[
        :1000
    ]


def sweep_compensations(*, batch: int | None = None) -> DuplicateCounts:
    """Follow compensation intents to their end.

    * A duplicate's compensation that SUCCEEDED resolves its finding; one that ended FAILED,
      REJECTED, EXPIRED or CANCELLED re-opens the finding for operators.
    * An original in COMPENSATING none of whose own compensations can still succeed is
      escalated (``compensation_failed``) with the compensation's state and last error.
    """
    size = batch or int(settings.EFFECT_LEDGER["RECONCILE_BATCH"])
    counts = DuplicateCounts()
    findings = list(
        DuplicateFinding.objects.filter(
            state=DuplicateFinding.State.COMPENSATING, compensation__status__in=COMPENSATION_ENDED
        ).select_related("compensation")[:size]
    )
    for finding in findings:
        counts.examined += 1
        assert finding.compensation is not None
        resolved, note = compensation_end(finding.compensation)
        state = DuplicateFinding.State.RESOLVED if resolved else DuplicateFinding.State.OPEN
        if not resolved:
            counts.escalated += 1
        DuplicateFinding.objects.filter(id=finding.id, state=DuplicateFinding.State.COMPENSATING).update(
            state=state,
            note=note,
            resolved_by="reconciler" if state == DuplicateFinding.State.RESOLVED else "",
        )
    alive = services.own_live_compensations(OuterRef("pk"))
    stuck = (
        Intent.objects.filter(status=Intent.Status.COMPENSATING, escalated_at__isnull=True)
        .filter(~Exists(alive))
        .values_list("id", flat=True)[:size]
    )
    for intent_id in stuck:
        counts.examined += 1
        last = (
            Intent.objects.filter(compensates_id=intent_id)
            .exclude(metadata__cause="duplicate")
            .order_by("-created_at")
            .first()
        )
        detail: dict[str, str | None] = (
            {
                "compensation_intent": str(last.id),
                "compensation_status": last.status,
                "last_error": last.last_error[:500],
            }
            if last
            else {"compensation_intent": None}
        )
        what = f"compensation {last.id} ended {last.status}" if last else "no compensation intent exists"
        try:
            if services.intent_escalate(
                intent_id=intent_id,
                status=Intent.Status.COMPENSATING,
                event="compensation_failed",
                reason=f"{what}; the effect is not undone: open a new compensation or settle it",
                data=detail,
            ):
                counts.escalated += 1
        except Exception as exc:
            logger.exception("escalating a failed compensation failed", extra={"intent_id": str(intent_id)})
            metrics.RECONCILE_ITEM_ERRORS.labels(sweep="compensations").inc()
            counts.errors.append(f"compensation sweep of {intent_id}: {exc!r}"[:300])
    return counts
