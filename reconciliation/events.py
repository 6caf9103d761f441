"""The inbox for provider events, and what an event proves (issue 19).

Receiving (``receive_provider_event``, called by ``POST /providers/<source>/events``): the
source's adapter verifies the signature on the raw body before anything reads it, then reads
the body; a refusal stores nothing. A new event is stored once per (source, event id)
(``INSERT ... ON CONFLICT DO NOTHING`` on the unique constraint) with an outbox message in the
same transaction; a redelivery finds the row and changes nothing. The answer does not wait for
processing.

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
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from operations import metrics, services
from operations.adapters.base import Adapter
from operations.adapters.events import EventFacts, EventInvalid, EventSignatureInvalid, check_storable
from operations.adapters.registry import evidence_source_actions, evidence_sources
from operations.adapters.secrets import PUBLISHED_SECRETS
from operations.idempotency import canonical_json
from operations.models import ENDED_WITHOUT_EFFECT, Intent, OutboxMessage, Outcome
from operations.statements import run_together
from operations.workers.outbox import Handoff, enqueue_statement, handoff_after_commit
from reconciliation.duplicates import ENDED_WITH_EFFECT, record_duplicates
from reconciliation.late_evidence import LateProof, apply_late_proof
from reconciliation.models import ProviderEvent, ProviderFinding

logger = logging.getLogger("reconciliation")

#: The Celery task that processes a stored event (``reconciliation.tasks``).
PROCESS_TASK = "reconciliation.process_provider_event"

#: Statuses in which an effect-proving event waits (deferred) for the intent to move.
_WAITING = (Intent.Status.RUNNING, Intent.Status.READY, Intent.Status.HELD, Intent.Status.AWAITING_APPROVAL)

#: A pending event older than this (seconds) is processed by the reconciler's sweep as well (its
#: outbox message was lost); the task and the sweep are serialised by row locks.
PENDING_SWEEP_AFTER_SECONDS = 60.0


class UnknownEventSource(LookupError):
    """No served adapter declares this event source (answered 404)."""


@dataclass(frozen=True)
class Received:
    """The answer to one delivery: the stored event's id and whether this delivery stored it."""

    event_pk: int
    created: bool


def event_source(source: str) -> Adapter:
    """The adapter that declares ``source``.

    Raises:
        UnknownEventSource: no served adapter declares it.
    """
    adapter = evidence_sources().get(source)
    if adapter is None or not adapter.receives_events():
        raise UnknownEventSource(f"no event source {source!r}")
    return adapter


_INSERT = f"""
    INSERT INTO {ProviderEvent._meta.db_table}
        (source, event_id, event_type, occurred_at, received_at, payload, idempotency_key,
         reference, provider_reference, amount, currency, intent_id, result, processed_at, detail)
    VALUES (%s, %s, %s, %s, statement_timestamp(), %s, %s, %s, %s, %s, %s, NULL, %s, NULL, '{{}}')
    ON CONFLICT (source, event_id) DO NOTHING
    RETURNING id
"""


def receive_provider_event(*, source: str, body: bytes, headers: Mapping[str, str]) -> Received:
    """Verify, read and store one delivery of a provider event; nothing is stored on a refusal.

    Args:
        source: the event source slug from the URL (``sandbox-payments``).
        body: the raw request body, exactly as received (the signature covers these bytes).
        headers: the request headers (``webhook-id``, ``webhook-timestamp``,
            ``webhook-signature`` for Standard Webhooks).

    Returns:
        ``Received``: the stored event's id, and ``created`` False for a redelivery (same
        source and event id: nothing changed).

    Raises:
        UnknownEventSource: no adapter declares ``source`` (404).
        EventSignatureInvalid: missing, wrong or stale signature (401), checked first; or a
            real provider's source whose secret is a published one (``PUBLISHED_SECRETS``:
            anyone could sign with it).
        EventInvalid: a signed body that is not such an event (400): malformed, a type or
            object the source does not send, a negative amount, ``created`` outside
            2000-01-01..2100-01-01 UTC, a NUL or text not encodable as UTF-8 in any string.
    """
    try:
        adapter = event_source(source)
        if not adapter.test_endpoint and adapter.event_secret() in PUBLISHED_SECRETS:
            raise EventSignatureInvalid("this source's secret is published; set its own (issue 33 item 6)")
        webhook_id = adapter.verify_event(body, headers)
        facts = adapter.parse_event(body, webhook_id=webhook_id)
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise EventInvalid("the body is not JSON") from exc
        check_storable(payload)  # whatever the adapter's reader: jsonb takes no NUL, no surrogate
    except UnknownEventSource:
        metrics.PROVIDER_EVENTS_REFUSED.labels(reason="unknown_source").inc()
        raise
    except EventSignatureInvalid:
        metrics.PROVIDER_EVENTS_REFUSED.labels(reason="signature").inc()
        raise
    except EventInvalid:
        metrics.PROVIDER_EVENTS_REFUSED.labels(reason="invalid").inc()
        raise
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                _INSERT,
                [
                    source,
                    facts.event_id,
                    facts.event_type,
                    facts.occurred_at,
                    json.dumps(payload),
                    facts.idempotency_key,
                    facts.reference,
                    facts.provider_reference,
                    facts.amount,
                    facts.currency,
                    ProviderEvent.Result.PENDING,
                ],
            )
            row = cursor.fetchone()
        if row is None:  # a redelivery: the first delivery's row and message stand
            event_pk = ProviderEvent.objects.filter(source=source, event_id=facts.event_id).values_list(
                "id", flat=True
            )[0]
            metrics.PROVIDER_EVENTS_RECEIVED.labels(source=source, delivery="redelivery").inc()
            return Received(event_pk=event_pk, created=False)
        event_pk = int(row[0])
        message_id = uuid.uuid4()
        handoff = Handoff(
            id=message_id,
            task=PROCESS_TASK,
            body=canonical_json(
                {"message_id": str(message_id), "provider_event_id": event_pk, "task": PROCESS_TASK}
            ).decode(),
        )
        (countdown,) = run_together(enqueue_statement(handoff, intent_id=None))
        handoff_after_commit(handoff, countdown)
    metrics.PROVIDER_EVENTS_RECEIVED.labels(source=source, delivery="new").inc()
    return Received(event_pk=event_pk, created=True)


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


def match_intent(*, facts: EventFacts, actions: tuple[str, ...]) -> Intent | None:
    """The intent an event is about, or None.

    When the event carries our idempotency key (``data.idempotency_key``, or the key inside an
    email's Message-ID) the key decides: the intent with that key, or none (an orphan) — an
    effect made under another key is not this intent's, whatever reference it names. Only an
    event without a key is matched by our business reference (the intent's ``reference`` or
    ``arguments.reference``; of several, the one whose outcome has the event's provider
    reference, else the newest — within one tenant only: a reference that intents of several
    tenants hold is ambiguous, and the event matches none of them, for an operator to link;
    ``reference_tenants``), then by the provider's reference on a recorded outcome (so an intent
    found that way never has a key the event contradicts). An
    effect-proving event is matched only to intents of the action it proves
    (``charge.succeeded`` never matches a refund).
    """
    if facts.proves_action:
        actions = (facts.proves_action,)
    intents = Intent.objects.filter(action__in=actions)
    if facts.idempotency_key:
        return intents.filter(idempotency_key=facts.idempotency_key).first()
    if facts.reference:
        candidates = intents.filter(Q(reference=facts.reference) | Q(arguments__reference=facts.reference))
        if facts.provider_reference:
            same = candidates.filter(outcomes__provider_reference=facts.provider_reference).first()
            if same is not None:
                return same
        if len(reference_tenants(facts=facts, actions=actions)) > 1:
            return None
        newest = candidates.order_by("-created_at").first()
        if newest is not None:
            return newest
    if facts.provider_reference:
        outcome = (
            Outcome.objects.filter(provider_reference=facts.provider_reference, intent__action__in=actions)
            .order_by("created_at")
            .select_related("intent")
            .first()
        )
        if outcome is not None:
            return outcome.intent
    return None


def reference_tenants(*, facts: EventFacts, actions: tuple[str, ...]) -> list[str]:
    """The tenants whose intents of ``actions`` (or of the action the event proves) hold the
    event's business reference, sorted; [] for an event without one. A business reference is
    the caller's, unique at most within a tenant, while a provider account serves them all."""
    if not facts.reference:
        return []
    if facts.proves_action:
        actions = (facts.proves_action,)
    return sorted(
        set(
            Intent.objects.filter(action__in=actions)
            .filter(Q(reference=facts.reference) | Q(arguments__reference=facts.reference))
            .values_list("tenant", flat=True)
        )
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
