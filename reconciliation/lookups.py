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
from operations.engine.calls import provider_lookup
from operations.exceptions import IntentMoved, ResendRefused
from operations.models import ENDED_WITHOUT_EFFECT, Intent, Outcome
from operations.policies.rules import Policy
from reconciliation.attribution import Attribution, attribute
from reconciliation.duplicates import record_duplicates
from reconciliation.late_evidence import LateProof, apply_late_proof, file_late_finding
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


def _record(intent: Intent, result: LookupResult, actor: str, attribution: Attribution | None = None) -> None:
    Evidence.objects.create(
        intent=intent,
        kind=Evidence.Kind.LOOKUP,
        result=result.status.value,
        provider_references=list(result.provider_references),
        actor=actor,
        detail={**result.detail, **(attribution.as_detail() if attribution else {})},
    )
    metrics.LOOKUPS.labels(result=result.status.value).inc()


def _lookup(intent: Intent) -> LookupResult:
    # Never raises; the answer is storable (NUL characters, over-long ids: operations.adapters.bounds).
    return provider_lookup(intent)


def _apply(intent: Intent, result: LookupResult, attribution: Attribution | None, actor: str) -> str | None:
    """Act on a conclusive lookup; None when it proves nothing. ``intent.status`` is UNKNOWN,
    or READY when the lookup was in flight as the intent was sent back (only FOUND acts then).

    A FOUND result acts only on the effects that may be the intent's (``reconciliation.
    attribution``, C34): another intent's effect is never taken nor compensated, and effects
    that cannot be told apart from other intents' are left to a person (escalated at once, with
    the reason; the lookups go on)."""
    if attribution is not None:
        if attribution.ambiguous:
            if intent.status != Intent.Status.UNKNOWN:
                return None
            return _escalate_now(
                intent, f"the provider shows effects by this reference, but {attribution.ambiguous}"
            )
        if not attribution.own:
            return None  # only other intents' effects: this one's is not seen (yet)
        keep = attribution.own[0]
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
            record_duplicates(intent=intent, references=list(attribution.own), keep=keep)
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


def _late(intent: Intent, result: LookupResult, attribution: Attribution | None, actor: str) -> str:
    """A lookup's answer for an intent that ended without effect while it was at the provider:
    a FOUND effect of the intent's is late evidence (``resolved``); anything else is kept on
    record and changes nothing (``moved``)."""
    if attribution is None or not attribution.own or intent.attempt_count == 0:
        return "moved"
    proof = LateProof(
        provider_reference=attribution.own[0],
        source=Outcome.Source.RECONCILER,
        actor=actor,
        what="a lookup that was at the provider when it ended found its effect",
        detail={"lookup": result.detail, **attribution.as_detail()},
    )
    try:
        with transaction.atomic():  # a savepoint: a failure here keeps the evidence recorded above
            if attribution.ambiguous:
                # Not surely its effect: a person tells (the finding says why); nothing moves.
                file_late_finding(intent, proof, ambiguous=attribution.ambiguous)
                return "moved"
            if apply_late_proof(intent, proof).result != "applied":
                return "moved"
            if len(attribution.own) > 1:
                record_duplicates(
                    intent=intent, references=list(attribution.own), keep=proof.provider_reference
                )
    except Exception:
        # The found evidence stays on record (the operators' pages show it); counted and logged.
        logger.exception("acting on late lookup evidence failed", extra={"intent_id": str(intent.id)})
        metrics.RECONCILE_ITEM_ERRORS.labels(sweep="unknown").inc()
        return "moved"
    return "resolved"


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
    * ended without effect (FAILED, REJECTED, EXPIRED, CANCELLED: an operator's ``absent``
      committed while this lookup was at the provider, C31) and FOUND: late evidence
      (``reconciliation.late_evidence``): SUCCEEDED with the found receipt, one open finding,
      the agent and the operators told.
    * anything else: the evidence is kept on record (an operator's later ``absent`` is refused
      while a found effect is on record) and nothing moves.

    Every FOUND is first attributed (``reconciliation.attribution``): an effect another intent
    holds is never this one's, and the attribution is kept with the evidence.

    Returns ``resolved``, ``retry``, ``waiting``, ``escalated`` or ``moved``.
    """
    with transaction.atomic():
        intent = Intent.objects.select_for_update().get(id=intent_id)
        found = result.status == LookupStatus.FOUND and bool(result.provider_references)
        attribution = attribute(intent, result.provider_references) if found else None
        _record(intent, result, actor, attribution)
        if intent.status in ENDED_WITHOUT_EFFECT:
            return _late(intent, result, attribution, actor)
        if intent.status not in {Intent.Status.UNKNOWN, Intent.Status.READY}:
            return "moved"
        try:
            with transaction.atomic():  # a savepoint: a failure here keeps the evidence above
                applied = _apply(intent, result, attribution, actor)
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
