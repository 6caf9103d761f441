"""``execute_intent``: steps 3-7 of the execution protocol (DESIGN.md).

claim (fence + lease, one transaction) -> re-check (approval hash and expiry, ceilings) ->
act (adapter call, outside any transaction, deadline shorter than the lease) -> record
(conditional on the fence) -> classify:

==========================  ==============================================================
adapter outcome             next state
==========================  ==============================================================
ExecutionResult             SUCCEEDED (outcome source ``provider``)
TerminalError               FAILED, stored, never retried
RetryableError              READY with backoff and the same key, within the retry budget;
                            FAILED when the budget or deadline is spent (nothing was applied)
AmbiguousOutcome            READY with the same key when the provider deduplicates on it and
                            the budget allows; otherwise UNKNOWN
any other exception         UNKNOWN (an adapter bug must never be read as "did not happen")
==========================  ==============================================================
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid

from django.conf import settings
from django.db.models.functions import Now

from operations import metrics
from operations.adapters.base import AmbiguousOutcome, RetryableError, TerminalError
from operations.adapters.registry import get_adapter
from operations.calls import provider_call
from operations.idempotency import key_digest
from operations.models import Intent
from operations.services import execution as svc
from operations.services.approvals import intent_mark_approvals_used
from operations.services.recovery import intent_redispatch

logger = logging.getLogger("operations.engine")


def worker_identity() -> str:
    """``<hostname>:<pid>``, the lease owner recorded on claims."""
    return f"{socket.gethostname()}:{os.getpid()}"


def provider_deadline_seconds() -> float:
    """The adapter's wall-clock deadline for the whole call, in seconds: the configured provider
    timeout, but at most half the lease and at least ``PROVIDER_DEADLINE_MARGIN_SECONDS`` shorter
    than it, so the worker gives up and records the answer while it still holds the lease (the
    margin covers the re-check before the call and the recording after it)."""
    conf = settings.EFFECT_LEDGER
    lease = float(conf["LEASE_SECONDS"])
    margin = float(conf.get("PROVIDER_DEADLINE_MARGIN_SECONDS", 1.0))
    return min(float(conf["PROVIDER_TIMEOUT_SECONDS"]), lease / 2, lease - margin)


def _log_context(claim: svc.Claim) -> dict[str, object]:
    return {
        "intent_id": str(claim.intent.id),
        "action": claim.intent.action,
        "attempt_no": claim.attempt.attempt_no,
        "fence": claim.fence,
        "key_digest": key_digest(claim.intent.idempotency_key),
    }


def execute_intent(intent_id: uuid.UUID, *, worker: str | None = None, delivery_retries: int = 0) -> str:
    """Run one delivery of ``execute_intent(intent_id)``.

    ``delivery_retries`` is how often this message was re-delivered because the database was
    unreachable (``operations.tasks.execute_intent``); the claim's audit event records it.

    Returns a label of what happened: ``duplicate`` (nothing to claim), ``refused`` (re-check
    failed, nothing sent), ``succeeded``, ``failed``, ``retry``, ``unknown``, or ``stale`` (a
    newer fence took over while we were calling; our write was refused).
    """
    metrics.DELIVERIES.inc()
    worker = worker or worker_identity()
    claim = svc.intent_claim(
        intent_id=intent_id,
        worker=worker,
        lease_seconds=settings.EFFECT_LEDGER["LEASE_SECONDS"],
        delivery_retries=delivery_retries,
    )
    if claim is None:
        metrics.DUPLICATE_DELIVERIES.inc()
        _redispatch_if_early(intent_id, worker)
        return "duplicate"
    context = _log_context(claim)
    refusal = svc.precheck_refusal(claim.intent)
    if refusal:
        logger.warning("re-check refused the attempt", extra={**context, "reason": refusal})
        svc.intent_record_failure(claim=claim, error=refusal, sent=False)
        return "refused"
    intent_mark_approvals_used(intent=claim.intent)

    intent = claim.intent
    adapter = get_adapter(intent.action)
    call = provider_call(
        intent,
        fence=claim.fence,
        attempt_no=claim.attempt.attempt_no,
        deadline_seconds=provider_deadline_seconds(),
    )
    logger.info("calling provider", extra=context)
    started = time.monotonic()
    try:
        result = adapter.execute(call)
    except TerminalError as exc:
        outcome = (
            "failed" if svc.intent_record_failure(claim=claim, error=str(exc), detail=exc.detail) else "stale"
        )
    except RetryableError as exc:
        if svc.retry_allowed(intent):
            outcome = (
                "retry"
                if svc.intent_schedule_retry(claim=claim, error=str(exc), detail=exc.detail, min_delay_seconds=exc.retry_after_seconds)
                else "stale"
            )
        else:
            error = f"retry budget spent; last error before the provider's commit point: {exc}"
            outcome = (
                "failed"
                if svc.intent_record_failure(claim=claim, error=error, detail=exc.detail)
                else "stale"
            )
    except AmbiguousOutcome as exc:
        if adapter.capabilities_for(intent.action).same_key_retry_safe and svc.retry_allowed(intent):
            # Safe: the provider deduplicates on the key, so a same-key retry cannot double-apply.
            outcome = (
                "retry"
                if svc.intent_schedule_retry(claim=claim, error=str(exc), detail=exc.detail, min_delay_seconds=exc.retry_after_seconds)
                else "stale"
            )
        else:
            marked = svc.intent_mark_unknown(
                claim=claim, error=str(exc), cause="ambiguous", detail=exc.detail
            )
            outcome = "unknown" if marked else "stale"
    except Exception as exc:
        logger.exception("adapter raised an unexpected error; treating the outcome as unknown", extra=context)
        marked = svc.intent_mark_unknown(claim=claim, error=repr(exc)[:500], cause="adapter_error")
        outcome = "unknown" if marked else "stale"
    else:
        outcome = "succeeded" if svc.intent_record_success(claim=claim, result=result) else "stale"
    finally:
        metrics.PROVIDER_SECONDS.observe(time.monotonic() - started)
    logger.info("attempt recorded", extra={**context, "outcome": outcome})
    return outcome


def _redispatch_if_early(intent_id: uuid.UUID, worker: str) -> None:
    # A delivery that arrived before the retry's not_before (clock skew between the publisher
    # and the worker, an early ETA) must not strand the intent: write a fresh outbox row due at
    # not_before, which the relay publishes within the countdown bound; audited.
    if Intent.objects.filter(id=intent_id, status=Intent.Status.READY, not_before__gt=Now()).exists():
        intent_redispatch(
            intent_id=intent_id,
            actor=f"worker:{worker}",
            reason="delivered before its not_before; a fresh message waits in the outbox until then",
        )
