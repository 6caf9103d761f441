"""Deciding held intents once the earlier intent for the same business action has ended
(``operations.services.business`` states the rule).

Each pass takes a bounded batch of HELD intents whose earlier intent is no longer open, oldest
first, each in its own transaction: released when the earlier one left no effect or had it
undone, put in front of a person (or rejected, by policy) when it SUCCEEDED.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

from django.conf import settings

from operations import metrics, services
from operations.exceptions import IntentMoved
from operations.models import ENDED_WITHOUT_EFFECT, OPEN_STATUSES, Intent
from operations.policies.rules import Policy

logger = logging.getLogger("reconciliation")


@dataclass
class HeldCounts:
    """What one pass over held intents did."""

    examined: int = 0
    released: int = 0
    to_a_person: int = 0
    rejected: int = 0
    errors: list[str] = field(default_factory=list)


def _reason(earlier: Intent) -> str:
    """``likely_duplicate_reason`` for ``earlier``: its first outcome (time and provider
    reference; its last change when it has none) and how many effects its identity has."""
    outcome = earlier.outcomes.order_by("created_at", "id").first()
    done = Intent.objects.filter(
        business_key=earlier.business_key, status__in=[Intent.Status.SUCCEEDED, Intent.Status.COMPENSATING]
    ).count()
    return services.likely_duplicate_reason(
        earlier_id=earlier.id,
        action=earlier.action,
        reference=earlier.reference,
        arguments=earlier.arguments,
        provider_reference=outcome.provider_reference if outcome else "",
        done_at=outcome.created_at if outcome else earlier.updated_at,
        effects=done,
    )


def _deciding(earlier: Intent) -> Intent:
    """The intent whose ending decides a held one: ``earlier``, or, when ``earlier`` was itself a
    held intent that ended without ever running (rejected or cancelled while it waited), the one
    it waited behind, and so on. A re-plan held behind a likely duplicate must not be released
    because a person rejected that duplicate: the business action did succeed before it."""
    seen = {earlier.id}
    while (
        earlier.held_behind_id is not None
        and earlier.attempt_count == 0
        and earlier.status in ENDED_WITHOUT_EFFECT
        and earlier.held_behind_id not in seen
    ):
        earlier = Intent.objects.get(id=earlier.held_behind_id)
        seen.add(earlier.id)
    return earlier


def decide_one(intent_id: uuid.UUID) -> str:
    """Decide one held intent. Returns ``released``, ``to_a_person``, ``rejected`` or
    ``waiting`` (its earlier intent is still open, or it moved meanwhile)."""
    intent = Intent.objects.select_related("held_behind").get(id=intent_id)
    # Held for a person (hold_reason: its action or version is not served here), not behind an
    # earlier intent: no rule decides it, whatever its held_behind says.
    if intent.status != Intent.Status.HELD or intent.held_behind is None or intent.hold_reason:
        return "waiting"
    earlier = _deciding(intent.held_behind)
    if earlier.status in OPEN_STATUSES:
        return "waiting"
    try:
        if earlier.status in ENDED_WITHOUT_EFFECT or earlier.status == Intent.Status.COMPENSATED:
            services.intent_release_held(
                intent_id=intent.id,
                actor="reconciler",
                reason=f"the earlier intent {earlier.id} for the same business action ended {earlier.status}",
            )
            return "released"
        reason = _reason(earlier)
        data = {"earlier": str(earlier.id), "earlier_status": earlier.status}
        if Policy.from_snapshot(intent.policy).after_success == "reject":
            services.intent_reject_likely_duplicate(intent_id=intent.id, reason=reason, data=data)
            return "rejected"
        services.intent_hold_for_a_person(intent_id=intent.id, reason=reason, data=data)
        return "to_a_person"
    except IntentMoved:
        return "waiting"


def decide_held(*, batch: int | None = None) -> HeldCounts:
    """One pass over held intents whose earlier intent has ended (partial index
    ``intent_held_q``), oldest first; one item's error never stops the pass."""
    counts = HeldCounts()
    size = batch or int(settings.EFFECT_LEDGER["RECONCILE_BATCH"])
    ids = list(
        Intent.objects.filter(
            status=Intent.Status.HELD, escalated_at__isnull=True, held_behind__isnull=False, hold_reason=""
        )
        .exclude(held_behind__status__in=OPEN_STATUSES)
        .order_by("created_at", "id")
        .values_list("id", flat=True)[:size]
    )
    for intent_id in ids:
        counts.examined += 1
        try:
            outcome = decide_one(intent_id)
        except Exception as exc:
            logger.exception("deciding a held intent failed", extra={"intent_id": str(intent_id)})
            metrics.RECONCILE_ITEM_ERRORS.labels(sweep="held").inc()
            counts.errors.append(f"held {intent_id}: {exc!r}"[:300])
            continue
        if outcome == "released":
            counts.released += 1
        elif outcome == "to_a_person":
            counts.to_a_person += 1
        elif outcome == "rejected":
            counts.rejected += 1
    return counts
