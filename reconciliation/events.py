"""What a provider event proves, and acting on it (issue 19). Events are received and stored by
``reconciliation.event_inbox``; matched to their intent by ``reconciliation.event_matching``.

Processing (``process_provider_event``, the outbox's task; also the reconciler's sweep of
events not finally processed, ``sweep_provider_events``) is idempotent and does not depend on
the order events arrive in. The event is matched to its intent by our idempotency key when it
carries one (decisive: that intent or none), else by our business reference, then the
provider's reference (a recorded outcome) (``match_intent``); then, under the intent's row lock:

=========================================  ==========================================================
event and intent                           result
=========================================  ==========================================================
no intent matches                          ``orphan``: one ``ProviderFinding`` (orphan_event) per
                                           provider reference (or event id)
a type that proves no effect               ``ignored`` (on the intent's timeline all the same)
proves the effect; intent UNKNOWN, RUNNING ``applied``: SUCCEEDED, outcome source ``provider_event``
with an expired lease, or READY after a
send (an operator's ``absent`` waiting)
the same, but the event's amount or        ``recorded``, ``detail.contradicts`` names both amounts;
currency differs from the intent's         one ``ProviderFinding`` (amount_mismatch); the intent
arguments                                  stays as it was (reconciler's lookup or an operator)
proves it; intent SUCCEEDED (or            ``recorded`` when the provider reference is the one on
compensated) already                       record, else ``duplicate``: a ``DuplicateFinding``
                                           (``reconciliation.duplicates.record_duplicates``)
proves it; RUNNING with a live lease,      ``recorded``, *deferred*: left unfinished
READY never sent, HELD, AWAITING_APPROVAL  (``processed_at`` empty) and decided again by the
                                           reconciler's sweep once the intent moved, before any
                                           lookup
proves it; intent ended without effect     late evidence (``reconciliation.late_evidence``):
(FAILED, REJECTED, EXPIRED, CANCELLED)     ``applied``, SUCCEEDED and an ``effect_after_ending``
                                           finding; ``recorded`` and the finding only when the
                                           effect cannot be told apart from other intents';
                                           ``orphan`` when it is not the intent's (never sent)
=========================================  ==========================================================

What an event cannot prove: an event that never came proves nothing (delivery is at least once
only while the provider keeps trying; a lost event is silence, not absence).
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from operations import metrics, services
from operations.adapters.events import EventFacts, EventInvalid
from operations.adapters.registry import evidence_source_actions, evidence_sources
from operations.models import ENDED_WITHOUT_EFFECT, Intent, OutboxMessage, Outcome
from reconciliation.duplicates import ENDED_WITH_EFFECT, record_duplicates
from reconciliation.event_matching import match_intent, reference_tenants
from reconciliation.late_evidence import LateProof, apply_late_proof
from reconciliation.models import ProviderEvent, ProviderFinding

logger = logging.getLogger("reconciliation")

#: Statuses in which an effect-proving event waits (deferred) for the intent to move.
_WAITING = (Intent.Status.RUNNING, Intent.Status.READY, Intent.Status.HELD, Intent.Status.AWAITING_APPROVAL)

#: A pending event older than this (seconds) is processed by the reconciler's sweep as well (its
#: outbox message was lost); the task and the sweep are serialised by row locks.
PENDING_SWEEP_AFTER_SECONDS = 60.0


def _facts(event: ProviderEvent) -> EventFacts:
    """The stored event's facts, with what its type proves read from its source's adapter now."""
    adapter = evidence_sources().get(event.source)
    try:
        proving = (
            adapter.parse_event(json.dumps(event.payload).encode(), webhook_id=event.event_id).proves_action
            if adapter is not None
            else ""
        )
    except EventInvalid:  # stored before its adapter refused such events: it proves nothing
        proving = ""
    return EventFacts(
        event_id=event.event_id,
        event_type=event.event_type,
        occurred_at=event.occurred_at,
        idempotency_key=event.idempotency_key,
        reference=event.reference,
        provider_reference=event.provider_reference,
        amount=event.amount,
        currency=event.currency,
        object_kind=str((event.payload.get("data") or {}).get("object", "")),
        proves_action=proving,
    )


@dataclass(frozen=True)
class _Decision:
    result: str
    detail: dict[str, Any]
    final: bool = True


def _orphan(event: ProviderEvent, facts: EventFacts) -> _Decision:
    tenants = reference_tenants(facts=facts, actions=evidence_source_actions(event.source))
    ambiguity = (
        {
            "ambiguous": f"intents of tenants {', '.join(tenants)} have reference {facts.reference!r}: link it to the right one"
        }
        if len(tenants) > 1
        else {}
    )
    fingerprint = (
        f"extra:{event.source}:{facts.provider_reference}"
        if facts.provider_reference
        else f"orphan:{event.source}:{facts.event_id}"
    )
    finding, created = ProviderFinding.objects.get_or_create(
        fingerprint=fingerprint,
        defaults={
            "kind": ProviderFinding.Kind.ORPHAN_EVENT,
            "source": event.source,
            "event": event,
            "provider_reference": facts.provider_reference,
            "amount": facts.amount,
            "currency": facts.currency,
            "detail": {"event_type": facts.event_type, "reference": facts.reference, **ambiguity},
        },
    )
    if not created and finding.event_id is None:
        # the same effect seen first on a statement: one finding, now with its event too
        ProviderFinding.objects.filter(id=finding.id, event__isnull=True).update(event=event)
    return _Decision(
        ProviderEvent.Result.ORPHAN, {"finding": finding.id, "new_finding": created, **ambiguity}
    )


def _asked(intent: Intent) -> tuple[int | None, str]:
    """The intent's ``amount`` (minor units) and ``currency`` (ISO 4217) from its arguments;
    None / "" where it has none."""
    arguments = intent.arguments if isinstance(intent.arguments, dict) else {}
    amount = arguments.get("amount")
    currency = arguments.get("currency")
    return (
        amount if isinstance(amount, int) and not isinstance(amount, bool) else None,
        currency.upper()[:3] if isinstance(currency, str) else "",
    )


def _money_disagrees(facts: EventFacts, intent: Intent) -> bool:
    """Whether the event's amount or currency differ from the intent's; a side either lacks is
    not compared."""
    amount, currency = _asked(intent)
    return (facts.amount is not None and amount is not None and facts.amount != amount) or bool(
        facts.currency and currency and facts.currency != currency
    )


def _amount_mismatch(event: ProviderEvent, facts: EventFacts, intent: Intent) -> _Decision:
    """An effect-proving event for ``intent`` whose money differs: not applied; one
    ``ProviderFinding`` (amount_mismatch, ``mismatch:<source>:<intent id>:<provider reference>``)
    for an operator; the intent is left as it is (its lookup or an operator decides it)."""
    expected_amount, expected_currency = _asked(intent)
    finding, created = ProviderFinding.objects.get_or_create(
        fingerprint=f"mismatch:{event.source}:{intent.id}:{facts.provider_reference}",
        defaults={
            "kind": ProviderFinding.Kind.AMOUNT_MISMATCH,
            "source": event.source,
            "intent": intent,
            "event": event,
            "provider_reference": facts.provider_reference,
            "amount": facts.amount,
            "currency": facts.currency,
            "expected_amount": expected_amount,
            "expected_currency": expected_currency,
            "detail": {"event_type": facts.event_type, "event_id": facts.event_id},
        },
    )
    shown = f"{facts.amount if facts.amount is not None else '?'} {facts.currency or '?'}"
    wanted = f"{expected_amount if expected_amount is not None else '?'} {expected_currency or '?'}"
    return _Decision(
        ProviderEvent.Result.RECORDED,
        {
            "contradicts": f"the provider shows {shown}, the intent asked {wanted} (minor units)",
            "note": "not applied: the amount or currency differ; an operator decides",
            "finding": finding.id,
            "new_finding": created,
        },
    )


def _lease_expired(intent: Intent) -> bool:
    return Intent.objects.filter(id=intent.id, lease_expires_at__lt=Now()).exists()


def _decide(event: ProviderEvent, facts: EventFacts, intent: Intent | None) -> _Decision:
    """What ``event`` proves about ``intent`` (locked by the caller); acts on it."""
    if intent is None:
        return _orphan(event, facts)
    if not facts.proves_effect:
        return _Decision(ProviderEvent.Result.IGNORED, {"note": f"{facts.event_type} proves no new effect"})
    if intent.action != facts.proves_action:
        return _Decision(
            ProviderEvent.Result.RECORDED, {"note": f"proves a {facts.proves_action}, not a {intent.action}"}
        )
    reference = facts.provider_reference
    if intent.status in ENDED_WITH_EFFECT:
        kept = (
            intent.outcomes.order_by("created_at").values_list("provider_reference", flat=True).first() or ""
        )
        if not reference or not kept or reference == kept:
            return _Decision(ProviderEvent.Result.RECORDED, {"note": "the effect on record"})
        new = record_duplicates(intent=intent, references=[kept, reference], keep=kept)
        return _Decision(ProviderEvent.Result.DUPLICATE, {"kept": kept, "new_finding": bool(new)})
    applicable = (
        intent.status == Intent.Status.UNKNOWN
        or (intent.status == Intent.Status.RUNNING and _lease_expired(intent))
        or (intent.status == Intent.Status.READY and intent.attempt_count > 0)
    )
    if applicable and reference and _money_disagrees(facts, intent):
        return _amount_mismatch(event, facts, intent)
    if applicable and reference:
        services.intent_resolve_found(
            intent_id=intent.id,
            provider_reference=reference,
            source=Outcome.Source.PROVIDER_EVENT,
            actor=f"provider:{event.source}",
            reason=f"the provider's signed event {facts.event_id} ({facts.event_type}) proves the effect",
            detail={"event_id": facts.event_id, "event_type": facts.event_type},
            from_status=intent.status,
        )
        return _Decision(ProviderEvent.Result.APPLIED, {"from_status": intent.status})
    if intent.status in _WAITING:
        return _Decision(
            ProviderEvent.Result.RECORDED,
            {"deferred": True, "note": f"the intent is {intent.status}: decided again once it moves"},
            final=False,
        )
    if intent.status in ENDED_WITHOUT_EFFECT and reference:
        return _late(event, facts, intent)
    return _Decision(
        ProviderEvent.Result.RECORDED,
        {
            "contradicts": intent.status,
            "note": f"the provider shows an effect of an intent that ended {intent.status}",
        },
    )


def _late(event: ProviderEvent, facts: EventFacts, intent: Intent) -> _Decision:
    """An effect-proving event for an intent that ended without effect: late evidence
    (``reconciliation.late_evidence``; its amount is checked first, as for any proof). An
    effect that is not the intent's (never sent, another intent's) is an orphan."""
    if _money_disagrees(facts, intent):
        return _amount_mismatch(event, facts, intent)
    ended = intent.status
    late = apply_late_proof(
        intent,
        LateProof(
            provider_reference=facts.provider_reference,
            source=Outcome.Source.PROVIDER_EVENT,
            actor=f"provider:{event.source}",
            what=f"the provider's signed event {facts.event_id} ({facts.event_type}) proves its effect",
            by_key=bool(facts.idempotency_key),
            amount=facts.amount,
            currency=facts.currency,
            detail={"event_id": facts.event_id, "event_type": facts.event_type},
        ),
        event=event,
    )
    if late.result != "applied":
        decision = _orphan(event, facts)
        return _Decision(decision.result, {**decision.detail, "not_its_effect": late.why})
    return _Decision(ProviderEvent.Result.APPLIED, {"from_status": ended, "late": True})


def _ack(message_id: uuid.UUID | None) -> None:
    if message_id is not None:
        OutboxMessage.objects.filter(id=message_id, acked_at__isnull=True).update(acked_at=Now())


def process_provider_event(*, event_pk: int, message_id: uuid.UUID | None = None) -> str:
    """Decide what a stored event proves and act on it (module table), once; acknowledge its
    outbox message (``message_id``) in the same transaction. Idempotent: an event already
    processed changes nothing; a deferred one is decided again.

    Locks: the intent's row first, then the event's (the same order as every caller), so two
    deliveries of one event, or the task and the reconciler's sweep, run one after the other.

    Returns the event's result (``applied``, ``recorded``, ``duplicate``, ``orphan``,
    ``ignored``; ``missing`` when no such event).
    """
    event = ProviderEvent.objects.filter(id=event_pk).first()
    if event is None or event.processed_at is not None:
        _ack(message_id)
        return event.result if event is not None else "missing"
    facts = _facts(event)
    with transaction.atomic():
        matched = match_intent(facts=facts, actions=evidence_source_actions(event.source))
        intent = Intent.objects.select_for_update().get(id=matched.id) if matched is not None else None
        event = ProviderEvent.objects.select_for_update().get(id=event_pk)
        if event.processed_at is not None:
            _ack(message_id)
            return event.result
        decision = _decide(event, facts, intent)
        ProviderEvent.objects.filter(id=event_pk).update(
            intent=intent,
            result=decision.result,
            detail=decision.detail,
            processed_at=timezone.now() if decision.final else None,
        )
        _ack(message_id)
    metrics.PROVIDER_EVENTS_PROCESSED.labels(result=decision.result if decision.final else "deferred").inc()
    return str(decision.result)


def sweep_provider_events(*, batch: int = 100) -> int:
    """Decide again the events not finally processed whose intent may now be decided: deferred
    ones whose intent left a waiting state (or whose lease expired), and pending ones older than
    ``PENDING_SWEEP_AFTER_SECONDS`` (their message was lost). Run by the reconciler before its
    lease take-overs and lookups, so a stored event settles an intent before any lookup.
    Returns how many were processed; one event's error is logged and never stops the sweep."""
    still_waiting = Q(intent__status__in=_WAITING) & ~Q(
        intent__status=Intent.Status.RUNNING, intent__lease_expires_at__lt=Now()
    )
    stale = Now() - timedelta(seconds=PENDING_SWEEP_AFTER_SECONDS)
    due = (
        ProviderEvent.objects.filter(processed_at__isnull=True)
        .filter(
            (Q(result=ProviderEvent.Result.PENDING) & Q(received_at__lt=stale))
            | (~Q(result=ProviderEvent.Result.PENDING) & ~still_waiting)
        )
        .order_by("received_at")
        .values_list("id", flat=True)[:batch]
    )
    done = 0
    for event_pk in list(due):
        try:
            process_provider_event(event_pk=event_pk)
            done += 1
        except Exception:
            logger.exception("processing a provider event failed", extra={"event": event_pk})
            metrics.RECONCILE_ITEM_ERRORS.labels(sweep="provider_events").inc()
    return done
