"""Reconcile UNKNOWN intents with provider evidence, and find duplicates at providers that
cannot deduplicate.

A batch is claimed by pushing ``next_lookup_at`` forward under ``FOR UPDATE SKIP LOCKED`` and
committing; the lookups then run outside any transaction; each result is recorded as
``Evidence`` and applied through ``operations.services`` (a compare-and-swap on UNKNOWN, so an
operator who resolved the intent meanwhile wins).

What a lookup proves (DESIGN.md "Reconciliation"):

============================  =======================================================
lookup result                 action
============================  =======================================================
FOUND, one reference          SUCCEEDED with that receipt (outcome source ``reconciler``)
FOUND, several references     SUCCEEDED with the first; each extra a duplicate finding,
                              compensated where the action has a compensation
ABSENT (authoritative)        READY with the same key (only providers that honour keys)
NOT_FOUND_YET (eventual)      stay UNKNOWN; look again with backoff; escalate after patience
WITHDRAWN / INCONCLUSIVE      stay UNKNOWN; escalate after patience; then look again
                              with backoff up to an hour
============================  =======================================================

An empty list is never proof of absence: only an adapter whose lookup is authoritative for a
provider that honours keys can answer ABSENT.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models.functions import Now

from operations import metrics, services
from operations.adapters.base import LookupResult, LookupStatus
from operations.adapters.registry import ActionUnavailable, capabilities_for, get_adapter, serving_problem
from operations.calls import provider_lookup
from operations.exceptions import IntentMoved, ResendRefused
from operations.models import Intent, Outcome
from operations.policies import Policy
from reconciliation.duplicates import record_duplicates
from reconciliation.models import Evidence
from reconciliation.schedule import lookup_delay_seconds

logger = logging.getLogger("reconciliation")


@dataclass
class LookupCounts:
    """What one pass did (``errors`` names each item that raised)."""

    examined: int = 0
    resolved: int = 0
    escalated: int = 0
    errors: list[str] = field(default_factory=list)


def claim_unknown_batch(*, batch: int) -> list[uuid.UUID]:
    """Claim up to ``batch`` UNKNOWN intents due for a lookup (``operations.services``
    pushes their ``next_lookup_at`` by 60 s, so a second reconciler skips them)."""
    return services.intents_claim_due_lookups(batch=batch)


def _patience_spent(intent: Intent, lookups: int) -> bool:
    patience = Policy.from_snapshot(intent.policy).unknown_patience
    if lookups >= patience.lookups:
        return True
    seconds = patience.seconds
    return (
        seconds is not None
        and Intent.objects.filter(id=intent.id, updated_at__lte=Now() - timedelta(seconds=seconds)).exists()
    )


def _record(intent: Intent, result: LookupResult, actor: str) -> None:
    Evidence.objects.create(
        intent=intent,
        kind=Evidence.Kind.LOOKUP,
        result=result.status.value,
        provider_references=list(result.provider_references),
        actor=actor,
        detail=result.detail,
    )
    metrics.LOOKUPS.labels(result=result.status.value).inc()


def _lookup(intent: Intent) -> LookupResult:
    # Never raises; the answer is storable (NUL characters, over-long ids: operations.bounds).
    return provider_lookup(intent)


def _apply(intent: Intent, result: LookupResult, actor: str) -> str | None:
    """Act on a conclusive lookup; None when it proves nothing. ``intent.status`` is UNKNOWN,
    or READY when the lookup was in flight as the intent was sent back (only FOUND acts then)."""
    if result.status == LookupStatus.FOUND and result.provider_references:
        keep = result.provider_references[0]
        waiting_resend = intent.status == Intent.Status.READY
        with transaction.atomic():
            services.intent_resolve_found(
                intent_id=intent.id,
                provider_reference=keep,
                source=Outcome.Source.RECONCILER,
                actor=actor,
                reason=(
                    "the provider has the effect: found by a lookup that was in flight when the intent "
                    "was sent back to READY, so it is not sent again"
                    if waiting_resend
                    else "the provider has the effect"
                ),
                detail=result.detail,
                from_status=intent.status,
            )
            # Two or more effects for one intent (a provider without keys): each extra one is
            # compensated or flagged for operators, in the same transaction.
            record_duplicates(intent=intent, references=list(result.provider_references), keep=keep)
        return "resolved"
    if (
        intent.status == Intent.Status.UNKNOWN
        and result.status == LookupStatus.ABSENT
        and capabilities_for(intent.action).absence_is_proof
    ):
        services.intent_resolve_absent(
            intent_id=intent.id,
            actor=actor,
            reason="the provider's authoritative lookup shows no effect; retrying with the same key",
        )
        return "retry"
    return None


def _wait_or_escalate(intent: Intent, status: str) -> str:
    lookups = intent.lookup_count + 1
    services.intent_schedule_lookup(
        intent_id=intent.id, lookups=lookups, delay_seconds=lookup_delay_seconds(lookups)
    )
    if _patience_spent(intent, lookups) and services.intent_escalate(
        intent_id=intent.id,
        reason=f"still UNKNOWN after {lookups} lookup(s); last result {status}",
    ):
        return "escalated"
    return "waiting"


def _escalate_now(intent: Intent, reason: str) -> str:
    """No lookup can settle it: escalate at once with ``reason`` (looking again, rarely)."""
    lookups = intent.lookup_count + 1
    services.intent_schedule_lookup(
        intent_id=intent.id, lookups=lookups, delay_seconds=lookup_delay_seconds(lookups)
    )
    return "escalated" if services.intent_escalate(intent_id=intent.id, reason=reason) else "waiting"


def reconcile_intent(intent_id: uuid.UUID, *, actor: str = "reconciler") -> str:
    """Look one UNKNOWN intent up at its provider and act on the evidence.

    Args:
        actor: who asked (``reconciler``, or ``user:<name>`` for an operator's fresh lookup).

    Returns ``resolved``, ``retry`` (authoritative absence), ``waiting``, ``escalated`` or
    ``moved`` (someone else resolved it first). An error while acting on the evidence is
    recorded as inconclusive evidence and the intent waits (and escalates) like any other.
    Escalated at once, with the reason (issue 21): an intent whose action this deployment
    cannot serve (no lookup is possible), and one the provider shows absent that must not be
    sent again (``operations.services.resend_refusal``: attempt budget spent, version not
    served).
    """
    intent = Intent.objects.get(id=intent_id)
    if intent.status != Intent.Status.UNKNOWN:
        return "moved"
    try:
        get_adapter(intent.action)
    except ActionUnavailable as exc:
        _record(intent, LookupResult(status=LookupStatus.INCONCLUSIVE, detail={"error": str(exc)}), actor)
        return _escalate_now(
            intent, f"no lookup is possible: {serving_problem(intent.action, intent.action_version)}"
        )
    return record_lookup(intent_id, _lookup(intent), actor=actor)


def record_lookup(intent_id: uuid.UUID, result: LookupResult, *, actor: str = "reconciler") -> str:
    """Record a lookup's evidence and act on it in one transaction, under the intent's row lock.

    The lock orders this against every other decision on the intent (an operator's ``absent``,
    a worker's claim), so evidence is never thrown away (issue 21 item 9):

    * UNKNOWN: act as the module table says.
    * READY (sent back by an operator's ``absent`` or an authoritative absence while this lookup
      was in flight, not yet claimed: a provider without keys waits ``lookup_settle_seconds``
      first) and FOUND: SUCCEEDED with the found receipt; nothing is sent again.
    * anything else: the evidence is kept on record (an operator's later ``absent`` is refused
      while a found effect is on record) and nothing moves.

    Returns ``resolved``, ``retry``, ``waiting``, ``escalated`` or ``moved``.
    """
    with transaction.atomic():
        intent = Intent.objects.select_for_update().get(id=intent_id)
        _record(intent, result, actor)
        if intent.status not in {Intent.Status.UNKNOWN, Intent.Status.READY}:
            return "moved"
        try:
            with transaction.atomic():  # a savepoint: a failure here keeps the evidence above
                applied = _apply(intent, result, actor)
        except IntentMoved:
            return "moved"
        except ResendRefused as refused:
            return _escalate_now(
                intent,
                f"the provider shows no effect, but {refused.why}: an operator decides (absent ends it FAILED)",
            )
        except Exception as exc:
            logger.exception("acting on a lookup failed", extra={"intent_id": str(intent.id)})
            metrics.RECONCILE_ITEM_ERRORS.labels(sweep="unknown").inc()
            _record(
                intent,
                LookupResult(status=LookupStatus.INCONCLUSIVE, detail={"error": repr(exc)[:500]}),
                actor,
            )
            applied, status = None, f"error {type(exc).__name__}"
        else:
            status = result.status.value
        if applied is not None:
            return applied
        if intent.status != Intent.Status.UNKNOWN:
            return "moved"
        return _wait_or_escalate(intent, status)


def reconcile_unknown(*, batch: int | None = None) -> LookupCounts:
    """One pass over a bounded batch of UNKNOWN intents that are due for a lookup; one item's
    error never stops the pass (it is counted and named, and the item is due again in 60 s)."""
    counts = LookupCounts()
    for intent_id in claim_unknown_batch(batch=batch or int(settings.EFFECT_LEDGER["RECONCILE_BATCH"])):
        counts.examined += 1
        try:
            outcome = reconcile_intent(intent_id)
        except Exception as exc:
            logger.exception("reconciling an intent failed", extra={"intent_id": str(intent_id)})
            metrics.RECONCILE_ITEM_ERRORS.labels(sweep="unknown").inc()
            counts.errors.append(f"lookup of {intent_id}: {exc!r}"[:300])
            continue
        if outcome in {"resolved", "retry"}:
            counts.resolved += 1
        elif outcome == "escalated":
            counts.escalated += 1
    return counts
