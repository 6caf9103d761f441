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
FOUND, several references     SUCCEEDED with the first; a compensation intent per extra
ABSENT (authoritative)        READY with the same key (only providers that honour keys)
NOT_FOUND_YET (eventual)      stay UNKNOWN; look again with backoff; escalate after patience
WITHDRAWN / INCONCLUSIVE      stay UNKNOWN; escalate after patience
============================  =======================================================

An empty list is never proof of absence: only an adapter whose lookup is authoritative for a
provider that honours keys can answer ABSENT.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models.functions import Now

from operations import metrics, services
from operations.adapters.base import ExecutionCall, LookupKind, LookupResult, LookupStatus
from operations.adapters.registry import get_adapter
from operations.exceptions import IntentMoved
from operations.models import Intent, Outcome
from reconciliation.models import Evidence

logger = logging.getLogger("reconciliation")

#: Seconds before looking again, by lookup number (then the last value): a lagging read path
#: gets time to catch up without the reconciler hammering the provider.
LOOKUP_BACKOFF_SECONDS = (1, 2, 4, 8, 15, 30, 60)


@dataclass
class LookupCounts:
    """What one pass did."""

    examined: int = 0
    resolved: int = 0
    escalated: int = 0
    errors: int = 0


def claim_unknown_batch(*, batch: int) -> list[uuid.UUID]:
    """Claim up to ``batch`` UNKNOWN intents due for a lookup (pushes ``next_lookup_at`` by 60 s,
    so a second reconciler skips them); served by the partial index ``intent_unknown_q``."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE operations_intent SET next_lookup_at = statement_timestamp() + interval '60 seconds'
            WHERE id IN (
                SELECT id FROM operations_intent
                WHERE status = 'UNKNOWN' AND next_lookup_at <= statement_timestamp()
                ORDER BY next_lookup_at
                LIMIT %s
                FOR UPDATE SKIP LOCKED
            )
            RETURNING id
            """,
            [batch],
        )
        return [row[0] for row in cursor.fetchall()]


def execution_call_for(intent: Intent) -> ExecutionCall:
    """The ``ExecutionCall`` describing ``intent`` as its last attempt sent it (for lookups)."""
    return ExecutionCall(
        intent_id=str(intent.id),
        action=intent.action,
        action_version=intent.action_version,
        arguments=intent.arguments,
        idempotency_key=intent.idempotency_key,
        fence=intent.fence,
        attempt_no=intent.attempt_count,
        deadline_seconds=float(settings.EFFECT_LEDGER["PROVIDER_TIMEOUT_SECONDS"]),
        reference=intent.reference,
    )


def _patience_spent(intent: Intent, lookups: int) -> bool:
    patience = intent.policy.get("unknown_patience", {})
    if lookups >= int(patience.get("lookups", 5)):
        return True
    seconds = patience.get("seconds")
    return (
        seconds is not None
        and Intent.objects.filter(id=intent.id, updated_at__lte=Now() - timedelta(seconds=seconds)).exists()
    )


def _record(intent: Intent, result: LookupResult) -> None:
    Evidence.objects.create(
        intent=intent,
        kind=Evidence.Kind.LOOKUP,
        result=result.status.value,
        provider_references=list(result.provider_references),
        detail=result.detail,
    )
    metrics.LOOKUPS.labels(result=result.status.value).inc()


def open_duplicate_compensations(intent: Intent, references: list[str], keep: str) -> int:
    """Record duplicates of ``intent`` and open one compensation intent per extra effect.

    Returns how many compensations exist for the extras (re-running opens no new ones).
    """
    extras = [ref for ref in references if ref != keep]
    if not extras:
        return 0
    Evidence.objects.create(
        intent=intent,
        kind=Evidence.Kind.DUPLICATE,
        result="duplicates_found",
        provider_references=references,
        detail={"kept": keep, "compensating": extras},
    )
    for ref in extras:
        services.intent_open_compensation(
            original=intent, provider_reference=ref, principal="system:reconciler", cause="duplicate"
        )
    return len(extras)


def reconcile_intent(intent_id: uuid.UUID) -> str:
    """Look one UNKNOWN intent up at its provider and act on the evidence.

    Returns ``resolved``, ``retry`` (authoritative absence), ``waiting``, ``escalated`` or
    ``moved`` (someone else resolved it first).
    """
    intent = Intent.objects.get(id=intent_id)
    if intent.status != Intent.Status.UNKNOWN:
        return "moved"
    adapter = get_adapter(intent.action)
    try:
        result = adapter.lookup(execution_call_for(intent))
    except Exception as exc:  # a lookup error is evidence of nothing
        logger.warning("lookup failed", extra={"intent_id": str(intent.id), "error": repr(exc)[:200]})
        result = LookupResult(status=LookupStatus.INCONCLUSIVE, detail={"error": repr(exc)[:500]})
    _record(intent, result)
    try:
        if result.status == LookupStatus.FOUND and result.provider_references:
            keep = result.provider_references[0]
            with transaction.atomic():
                services.intent_resolve_found(
                    intent_id=intent.id,
                    provider_reference=keep,
                    source=Outcome.Source.RECONCILER,
                    actor="reconciler",
                    reason="the provider has the effect",
                    detail=result.detail,
                )
                open_duplicate_compensations(intent, list(result.provider_references), keep)
            return "resolved"
        authoritative_absence = (
            result.status == LookupStatus.ABSENT
            and adapter.capabilities.idempotency_keys
            and adapter.capabilities.lookup == LookupKind.AUTHORITATIVE
        )
        if authoritative_absence:
            services.intent_resolve_absent(
                intent_id=intent.id,
                actor="reconciler",
                reason="the provider's authoritative lookup shows no effect; retrying with the same key",
            )
            return "retry"
    except IntentMoved:
        return "moved"
    lookups = intent.lookup_count + 1
    delay = LOOKUP_BACKOFF_SECONDS[min(lookups, len(LOOKUP_BACKOFF_SECONDS)) - 1]
    Intent.objects.filter(id=intent.id, status=Intent.Status.UNKNOWN).update(
        lookup_count=lookups, next_lookup_at=Now() + timedelta(seconds=delay)
    )
    if _patience_spent(intent, lookups) and services.intent_escalate(
        intent_id=intent.id,
        reason=f"still UNKNOWN after {lookups} lookup(s); last result {result.status.value}",
    ):
        return "escalated"
    return "waiting"


def reconcile_unknown(*, batch: int | None = None) -> LookupCounts:
    """One pass over a bounded batch of UNKNOWN intents that are due for a lookup."""
    counts = LookupCounts()
    for intent_id in claim_unknown_batch(batch=batch or int(settings.EFFECT_LEDGER["RECONCILE_BATCH"])):
        counts.examined += 1
        try:
            outcome = reconcile_intent(intent_id)
        except Exception:
            logger.exception("reconciling an intent failed", extra={"intent_id": str(intent_id)})
            counts.errors += 1
            continue
        if outcome in {"resolved", "retry"}:
            counts.resolved += 1
        elif outcome == "escalated":
            counts.escalated += 1
    return counts


def verify_duplicates(*, batch: int = 100) -> LookupCounts:
    """SUCCEEDED intents flagged ``verify_duplicates`` (several attempts at a provider that
    cannot deduplicate): list by our reference; compensate every effect beyond the one recorded."""
    counts = LookupCounts()
    with transaction.atomic():
        ids = list(
            Intent.objects.select_for_update(skip_locked=True)
            .filter(verify_duplicates=True)
            .order_by("updated_at")
            .values_list("id", flat=True)[:batch]
        )
        Intent.objects.filter(id__in=ids).update(verify_duplicates=False)
    for intent_id in ids:
        counts.examined += 1
        intent = Intent.objects.get(id=intent_id)
        try:
            result = get_adapter(intent.action).lookup(execution_call_for(intent))
        except Exception:
            logger.exception("duplicate check failed", extra={"intent_id": str(intent_id)})
            Intent.objects.filter(id=intent_id).update(verify_duplicates=True)  # try again next pass
            counts.errors += 1
            continue
        _record(intent, result)
        kept = intent.outcomes.order_by("created_at").values_list("provider_reference", flat=True).first()
        references = list(result.provider_references)
        if result.status == LookupStatus.FOUND and len(references) > 1:
            with transaction.atomic():
                counts.resolved += open_duplicate_compensations(intent, references, kept or references[0])
    return counts
