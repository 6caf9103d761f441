"""``execute_intent``: steps 3-7 of the execution protocol (DESIGN.md).

claim (fence + lease, one transaction) -> re-check (the stored request re-hashed, approval
hash and expiry, ceilings) ->
act (adapter call, outside any transaction, deadline shorter than the lease) -> record
(conditional on the fence) -> classify. The next state each adapter answer leads to is the
table in ``operations.engine.classification``; after a database restore, the look-up made
before a send is ``operations.engine.restore_guard``.

Our own errors (issue 21, item 6): no intent stays RUNNING because of them.

==========================  ==============================================================
where it fails              next state
==========================  ==============================================================
before the call, database   READY with backoff within the attempt budget (nothing was
or network (transient)      sent); FAILED when the budget is spent
before the call, anything   FAILED, named "programming error before the provider call";
else                        attempt ``skipped`` (nothing was sent; no retry can fix it)
after the call (classifying UNKNOWN with the evidence (the provider's answer, the error),
or recording)               escalated, in a fresh transaction
the fallback write fails    database unreachable: the task retries the delivery; otherwise
                            the lease lapses and the takeover moves it (attempt budget)
==========================  ==============================================================
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from django.conf import settings
from django.db.models.functions import Now

from operations import metrics
from operations.adapters.base import Adapter, ExecutionCall, ExecutionResult
from operations.adapters.registry import get_adapter
from operations.audit.request_integrity import stored_request_problem
from operations.engine.calls import provider_call
from operations.engine.classification import classify_answer
from operations.engine.errors import answer_evidence, describe, transient_error
from operations.engine.restore_guard import restore_guard
from operations.idempotency import key_digest
from operations.models import Intent
from operations.policies.approval_validity import Verdict
from operations.restore.recovery import pause_if_behind
from operations.services import claims
from operations.services import execution as svc
from operations.services.approvals import intent_mark_approvals_used
from operations.services.business import intent_hold_unserved
from operations.services.failover import execution_paused
from operations.services.recovery import intent_redispatch
from operations.workers.delivery import database_unavailable

logger = logging.getLogger("operations.engine.protocol")


def worker_identity() -> str:
    """``<hostname>:<pid>``, and ``/<thread name>`` in a pool thread (Celery's threads pool): the
    lease owner recorded on claims (for people; fences, not owners, decide who may write)."""
    thread = threading.current_thread()
    suffix = "" if thread is threading.main_thread() else f"/{thread.name}"
    return f"{socket.gethostname()}:{os.getpid()}{suffix}"


def provider_deadline_seconds() -> float:
    """The adapter's wall-clock deadline for the whole call, in seconds: the configured provider
    timeout, but at most half the lease and at least ``PROVIDER_DEADLINE_MARGIN_SECONDS`` shorter
    than it, so the worker gives up and records the answer while it still holds the lease (the
    margin covers the re-check before the call and the recording after it)."""
    conf = settings.EFFECT_LEDGER
    lease = float(conf["LEASE_SECONDS"])
    margin = float(conf.get("PROVIDER_DEADLINE_MARGIN_SECONDS", 1.0))
    return min(float(conf["PROVIDER_TIMEOUT_SECONDS"]), lease / 2, lease - margin)


def _log_context(claim: claims.Claim) -> dict[str, object]:
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

    No intent stays RUNNING because of our own error: an unexpected error before the provider
    call ends the attempt READY with backoff (the database or network failed; within the
    attempt budget) or FAILED (a programming error no retry can fix, named as such; nothing was
    sent); one after the call (while classifying or recording the answer) ends it UNKNOWN with
    the evidence, in a fresh transaction. Only when the database itself is unreachable does the
    error propagate (the task retries the delivery; the lease takeover is the last net).

    At the claim, an intent this deployment cannot run (its action is not registered, its
    adapter cannot be loaded, or its ``action_version`` is no longer served: ``serving_problem``)
    is HELD for a person with that reason (the claim is rolled back); nothing is sent and no
    attempt is spent.

    After the claim, the claimed row is re-hashed before anything else: a row whose stored
    request no longer hashes to its request_hash is HELD for a person (nothing is sent).

    Returns a label of what happened: ``held`` (not served here, or its stored request does not
    match its request_hash, or the restore guard cannot look it up; a person decides),
    ``paused`` (execution is paused after the database went back in time; nothing claimed),
    ``deferred`` (the restore guard waits out the provider's window before sending),
    ``duplicate`` (nothing to claim), ``refused`` (re-check failed, nothing sent), ``succeeded``, ``failed``, ``retry``, ``unknown``, ``stale`` (a
    newer fence took over while we were calling; our write was refused), or ``unrecorded``
    (even the fallback could not be written; the lease takeover moves the intent on).
    """
    metrics.DELIVERIES.inc()
    worker = worker or worker_identity()
    if delivery_retries:
        # The database was away: perhaps a failover to a replica that lagged. Check before
        # claiming (the beat checks every RESTORE_CHECK_PERIOD_SECONDS anyway).
        pause_if_behind(actor=f"detector:{worker}")
    try:
        claim = claims.intent_claim(
            intent_id=intent_id,
            worker=worker,
            lease_seconds=settings.EFFECT_LEDGER["LEASE_SECONDS"],
            delivery_retries=delivery_retries,
        )
    except claims.NotServed as unserved:
        return "held" if _hold_unserved(intent_id, worker, unserved.problem) else "duplicate"
    except claims.CeilingWait:
        return "awaiting_approval"  # a ceiling reached: an approver decides (issue 18)
    if claim is None:
        if execution_paused():
            # Recovery re-dispatches every READY intent when it resumes execution.
            metrics.PAUSED_CLAIMS.inc()
            return "paused"
        metrics.DUPLICATE_DELIVERIES.inc()
        _redispatch_if_early(intent_id, worker)
        return "duplicate"
    context = _log_context(claim)
    try:
        prepared = _prepare(claim, context)
    except Exception as exc:
        return _error_before_call(claim, exc, context)
    if isinstance(prepared, str):
        return prepared
    adapter, call = prepared
    logger.info("calling provider", extra=context)
    answer = _call(adapter, call)
    try:
        outcome = classify_answer(claim, adapter, answer, context, deadline_seconds=call.deadline_seconds)
    except Exception as exc:
        outcome = _error_after_call(claim, answer, exc, context)
    logger.info("attempt recorded", extra={**context, "outcome": outcome})
    return outcome


def _prepare(claim: claims.Claim, context: dict[str, object]) -> tuple[Adapter, ExecutionCall] | str:
    """Step 4 (re-check) and the call to make; ``held`` when the claimed row no longer hashes to
    its request_hash (the call would be built from exactly this row), ``refused`` when the
    approval or ceiling re-check refused it."""
    problem = stored_request_problem(claim.intent, recorded=claim.submitted_record)
    if problem:
        logger.error(
            "stored request does not match its request_hash; held", extra={**context, "reason": problem}
        )
        return "held" if svc.intent_hold_mismatch(claim=claim, problem=problem) else "stale"
    # Before the approval re-check: a flagged intent whose approval the restore lost is held
    # for a person (whose release asks for approval again), not FAILED for a missing approval.
    guarded = restore_guard(claim, context)
    if guarded is not None:
        return guarded
    refusal = svc.precheck_refusal(claim.intent)
    if refusal is not None and refusal.verdict == Verdict.EXPIRED:
        # C22: the approval was given in time but lapsed before a worker ran the intent; the
        # approvers decide again (never FAILED, nothing sent).
        reason = f"approval lapsed before execution: {refusal.reason}"
        logger.warning("approval lapsed; back to the approvers", extra={**context, "reason": reason})
        svc.intent_wait_for_lapsed_approval(claim=claim, reason=reason)
        return "awaiting_approval"
    if refusal is not None:
        logger.warning("re-check refused the attempt", extra={**context, "reason": refusal.reason})
        svc.intent_record_failure(claim=claim, error=refusal.reason, sent=False)
        return "refused"
    intent_mark_approvals_used(intent=claim.intent)
    adapter = get_adapter(claim.intent.action)
    call = provider_call(
        claim.intent,
        fence=claim.fence,
        attempt_no=claim.attempt.attempt_no,
        deadline_seconds=provider_deadline_seconds(),
    )
    return adapter, call


def _call(adapter: Adapter, call: ExecutionCall) -> ExecutionResult | Exception:
    """Step 5: the adapter call, outside any transaction. What it raises is returned, not
    raised; a return value that is not an ``ExecutionResult`` is an adapter bug (a TypeError)."""
    started = time.monotonic()
    try:
        result = adapter.execute(call)
    except Exception as exc:
        return exc
    finally:
        metrics.PROVIDER_SECONDS.observe(time.monotonic() - started)
    if not isinstance(result, ExecutionResult):
        return TypeError(f"the adapter returned {type(result).__name__}, not an ExecutionResult")
    return result


def _error_before_call(claim: claims.Claim, exc: Exception, context: dict[str, object]) -> str:
    """Our own error after the claim and before anything was sent: READY with backoff (within
    the attempt budget) when the database or the network failed, else FAILED, named a
    programming error (nothing was sent; no retry can fix it)."""
    logger.error("error before the provider call; nothing was sent", extra=context, exc_info=exc)
    detail = {"sent": False, "error_type": type(exc).__name__}
    try:
        if transient_error(exc) and svc.retry_allowed(claim.intent):
            error = f"error before the provider call (nothing was sent; retried): {describe(exc)}"
            return "retry" if svc.intent_schedule_retry(claim=claim, error=error, detail=detail) else "stale"
        kind = "transient error, attempt budget spent" if transient_error(exc) else "programming error"
        error = f"{kind} before the provider call (nothing was sent; no retry can fix it): {exc!r}"
        failed = svc.intent_record_failure(
            claim=claim, error=error, detail={**detail, "cause": kind}, sent=False
        )
        return "failed" if failed else "stale"
    except Exception as again:
        return _unrecorded(again, context)


def _error_after_call(
    claim: claims.Claim, answer: ExecutionResult | Exception, exc: Exception, context: dict[str, object]
) -> str:
    """Our own error while classifying or recording the provider's answer: UNKNOWN with the
    evidence (what the provider answered, what failed), escalated to operators, in a fresh
    transaction; then without the answer, should that be what cannot be written."""
    logger.error("recording the provider's answer failed; recording UNKNOWN", extra=context, exc_info=exc)
    error = f"our own error while recording the provider's answer: {exc!r}"
    escalate = (
        "our own error while recording the provider's answer; the effect may exist: look it up or confirm"
    )
    tries: list[dict[str, Any]] = [
        {"recording_error": repr(exc), "provider_answer": answer_evidence(answer)},
        {"recording_error": type(exc).__name__},
    ]
    for detail in tries:
        try:
            marked = svc.intent_mark_unknown(
                claim=claim, error=error, cause="recording_error", detail=detail, escalate=escalate
            )
        except Exception as again:
            last: Exception = again
            continue
        return "unknown" if marked else "stale"
    return _unrecorded(last, context)


def _unrecorded(exc: Exception, context: dict[str, object]) -> str:
    # Even the fallback failed. With the database unreachable the task retries the delivery;
    # otherwise the intent stays RUNNING until its lease lapses and the takeover (which spends
    # the same attempt budget) moves it on.
    if database_unavailable(exc):
        raise exc
    logger.critical(
        "could not record the attempt's outcome; the lease takeover will", extra=context, exc_info=exc
    )
    return "unrecorded"


def _hold_unserved(intent_id: uuid.UUID, worker: str, problem: str) -> bool:
    # Versioned actions survive upgrades (issue 21, item 7): an intent runs with the version it
    # was submitted under, or not at all. The claim checks it on the row it locked and rolls
    # back (no attempt spent); READY -> HELD here.
    held = intent_hold_unserved(intent_id=intent_id, reason=problem, actor=f"worker:{worker}")
    if held:
        logger.warning("intent held: not served here", extra={"intent_id": str(intent_id), "reason": problem})
    return held


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
