"""``execute_intent``: steps 3-7 of the execution protocol (DESIGN.md).

claim (fence + lease, one transaction) -> re-check (the stored request re-hashed, approval
hash and expiry, ceilings) ->
act (adapter call, outside any transaction, deadline shorter than the lease) -> record
(conditional on the fence) -> classify:

==========================  ==============================================================
adapter outcome             next state
==========================  ==============================================================
ExecutionResult             SUCCEEDED (outcome source ``provider``); UNKNOWN, escalated at
                            once with its sha256, length and prefix, when its provider
                            reference cannot be stored faithfully (over 200 characters,
                            NUL, not text: ``operations.adapters.bounds.reference_problem``)
TerminalError               FAILED, stored, never retried
RetryableError              READY with backoff and the same key, within the retry budget;
                            FAILED when the budget or deadline is spent (nothing was applied)
NewerAttemptExists          UNKNOWN at once, cause ``stale_fence``: the provider has seen a
(409 ``stale_fence``)       higher fence for the key, so a newer attempt (perhaps one a
                            database restore lost) may have applied the effect; the
                            reconciler looks the key up. Never FAILED, never a same-key retry
                            (DESIGN.md, "When the database goes back in time"; issue 22)
AmbiguousOutcome            READY with the same key when the provider deduplicates on it and
                            the budget allows (after a timeout, not sooner than the attempt's
                            deadline: issue 38, item 6); otherwise UNKNOWN
"request in progress"       at a provider that deduplicates on the key: READY with the same
(``AmbiguousOutcome``,      key after max(Retry-After, backoff), not counted against the
``request_in_progress``)    attempt budget, within ``retry.in_progress_patience_seconds``
                            from the first such answer (and the retry deadline); after it,
                            UNKNOWN (counted). Never FAILED (issue 38, item 4; case C32)
any other exception         UNKNOWN (an adapter bug must never be read as "did not happen")
==========================  ==============================================================

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

Every text and JSON value a provider sends is made storable before it is recorded
(``operations.adapters.bounds``): NUL characters and lone surrogates, length, nesting, ``NaN``.
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
from operations.adapters.base import (
    Adapter,
    AmbiguousOutcome,
    ExecutionCall,
    ExecutionResult,
    LookupKind,
    LookupStatus,
    NewerAttemptExists,
    RetryableError,
    TerminalError,
)
from operations.adapters.bounds import reference_problem
from operations.adapters.registry import ActionUnavailable, capabilities_for, get_adapter
from operations.audit.request_integrity import stored_request_problem
from operations.engine.backoff import after_timeout_floor_seconds
from operations.engine.calls import provider_call, provider_lookup
from operations.engine.errors import answer_evidence, describe, transient_error
from operations.idempotency import key_digest
from operations.models import Intent
from operations.policies.approval_validity import Verdict
from operations.restore.recovery import pause_if_behind
from operations.services import claims
from operations.services import execution as svc
from operations.services.approvals import intent_mark_approvals_used
from operations.services.business import intent_hold_unserved
from operations.services.failover import RESTORE_GUARD_HOLD, database_now, execution_paused, guard_settle_at
from operations.services.recovery import intent_redispatch
from operations.workers.delivery import database_unavailable

logger = logging.getLogger("operations.engine.protocol")

#: Why an intent is UNKNOWN after a provider's stale-fence answer (its ``last_error`` begins so).
STALE_FENCE_REASON = "the provider has seen a newer attempt (stale_fence): reconcile"


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
        outcome = _classify(claim, adapter, answer, context, deadline_seconds=call.deadline_seconds)
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
    guarded = _restore_guard(claim, context)
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


#: Events after which a person has decided to send an intent the restore guard stopped.
_GUARD_OVERRIDES = ("released", "outcome_absent")


def _restore_guard(claim: claims.Claim, context: dict[str, object]) -> str | None:
    """Under the restore guard (``services.failover``; issue 22), before sending to a provider
    that cannot deduplicate on our key: did a timeline the database forgot already make this
    effect? None means send; otherwise the label of what happened instead:

    ==========================  =============================================================
    look-up                     what happens (nothing is sent)
    ==========================  =============================================================
    FOUND                       ``succeeded``: SUCCEEDED with the found receipt (outcome
                                source ``reconciler``); two or more schedule duplicate checks
    nothing found, before the   ``deferred``: READY again, due at the settle point (the
    settle point                recovery's start + a lease + the consistency window)
    nothing found, after it     None: send; ``held`` for a person when the intent has
                                ``forgotten_changes`` (the lost change may be a cancel)
    anything else               ``unknown``: UNKNOWN, cause ``restore_guard``, for the
                                reconciler and operators
    no look-up possible         ``held``: HELD for a person, unless one already released it
                                (or said ``absent``) since the recovery
    ==========================  =============================================================

    An intent with ``forgotten_changes`` is looked up at keyed providers too, and after the
    guard's window has ended.
    """
    since = claim.restore_guard_since
    intent = claim.intent
    marked = intent.forgotten_changes
    if since is None and not marked:
        return None
    try:
        capabilities = capabilities_for(intent.action)
    except ActionUnavailable:
        return None  # served when claimed (_hold_if_unserved); the call fails on its own
    if not capabilities.duplicates_possible and not marked:
        return None  # the provider deduplicates on our key: a replay, never a second effect
    # Only a person's decision counts (the reconciler's authoritative absence does not: the
    # forgotten change may have been a cancel, which no lookup can see).
    overrides = intent.audit_events.filter(event__in=_GUARD_OVERRIDES, actor__startswith="user:")
    if overrides.filter(created_at__gte=since).exists() if since else overrides.exists():
        return None  # a person decided to send it after the recovery
    if capabilities.lookup == LookupKind.NONE and not capabilities.list_by_reference:
        metrics.RESTORE_GUARD_CHECKS.labels(decision="held").inc()
        problem = (
            f"{RESTORE_GUARD_HOLD} the database went back in time and this provider offers no look-up, so whether "
            "the forgotten timeline already sent this"
            + (" (or cancelled or rejected it)" if marked else "")
            + " cannot be known here; confirm with the provider, then release or reject"
        )
        return "held" if svc.intent_hold_restored(claim=claim, problem=problem) else "stale"
    result = provider_lookup(intent)
    evidence = {"restore_guard": {"lookup": result.status.value, **result.detail}}
    found_storable = bool(result.provider_references) and not reference_problem(result.provider_references[0])
    if result.status == LookupStatus.FOUND and found_storable:
        metrics.RESTORE_GUARD_CHECKS.labels(decision="found").inc()
        logger.warning("restore guard found the effect; not sent again", extra=context)
        found = svc.intent_record_found_before_send(
            claim=claim, provider_references=list(result.provider_references), detail=evidence
        )
        return "succeeded" if found else "stale"
    if result.status in {LookupStatus.NOT_FOUND_YET, LookupStatus.ABSENT}:
        settle = guard_settle_at(guard_since=since, action=intent.action) if since else None
        if settle is not None and database_now() < settle:
            metrics.RESTORE_GUARD_CHECKS.labels(decision="deferred").inc()
            deferred = svc.intent_defer_for_restore(claim=claim, not_before=settle, detail=evidence)
            return "deferred" if deferred else "stale"
        if marked:
            # Not sent, yet changed after the restore point: perhaps cancelled or rejected.
            metrics.RESTORE_GUARD_CHECKS.labels(decision="held").inc()
            problem = (
                f"{RESTORE_GUARD_HOLD} a timeline the database forgot changed this intent after the restore point and "
                "the provider has no effect of it: it may have been cancelled, rejected or refused there; ask "
                "whoever submitted it, then release (send) or reject"
            )
            return "held" if svc.intent_hold_restored(claim=claim, problem=problem) else "stale"
        metrics.RESTORE_GUARD_CHECKS.labels(decision="send").inc()
        return None
    metrics.RESTORE_GUARD_CHECKS.labels(decision="unknown").inc()
    marked = svc.intent_mark_unknown(
        claim=claim,
        error=f"restore guard: the look-up before sending was {result.status.value}; nothing sent",
        cause="restore_guard",
        detail=evidence,
    )
    return "unknown" if marked else "stale"


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


def _classify(
    claim: claims.Claim,
    adapter: Adapter,
    answer: ExecutionResult | Exception,
    context: dict[str, object],
    *,
    deadline_seconds: float,
) -> str:
    """Steps 6-7: record the answer under the claim's fence; the label of what happened.

    ``deadline_seconds`` is the deadline the call was given (``ExecutionCall.deadline_seconds``):
    a same-key retry after a timeout waits at least that long
    (``backoff.after_timeout_floor_seconds``; issue 38, item 6)."""
    intent = claim.intent
    if isinstance(answer, TerminalError):
        failed = svc.intent_record_failure(claim=claim, error=describe(answer), detail=answer.detail)
        return "failed" if failed else "stale"
    if isinstance(answer, RetryableError):
        if svc.retry_allowed(intent):
            return (
                "retry"
                if svc.intent_schedule_retry(
                    claim=claim,
                    error=describe(answer),
                    detail=answer.detail,
                    min_delay_seconds=answer.retry_after_seconds,
                )
                else "stale"
            )
        error = f"retry budget spent; last error before the provider's commit point: {describe(answer)}"
        return (
            "failed" if svc.intent_record_failure(claim=claim, error=error, detail=answer.detail) else "stale"
        )
    if isinstance(answer, NewerAttemptExists):
        # Not a same-key retry: our fence is below one the provider has seen, so a resend may be
        # refused again while it spends the budget; only a lookup by key can tell what the newer
        # attempt did (DESIGN.md, "When the database goes back in time").
        marked = svc.intent_mark_unknown(
            claim=claim,
            error=f"{STALE_FENCE_REASON}; {describe(answer)}",
            cause="stale_fence",
            detail=answer.detail,
        )
        return "unknown" if marked else "stale"
    if isinstance(answer, AmbiguousOutcome):
        same_key_retry_safe = adapter.capabilities_for(intent.action).same_key_retry_safe
        if same_key_retry_safe and answer.in_progress:
            return _wait_in_progress(claim, answer)
        if same_key_retry_safe and svc.retry_allowed(intent):
            # Safe: the provider deduplicates on the key, so a same-key retry cannot double-apply.
            # After a timeout it waits at least the deadline: the first may still be in flight.
            return (
                "retry"
                if svc.intent_schedule_retry(
                    claim=claim,
                    error=describe(answer),
                    detail=answer.detail,
                    min_delay_seconds=answer.retry_after_seconds,
                    not_sooner_than_seconds=after_timeout_floor_seconds(
                        answer, deadline_seconds=deadline_seconds
                    ),
                )
                else "stale"
            )
        marked = svc.intent_mark_unknown(
            claim=claim, error=describe(answer), cause="ambiguous", detail=answer.detail
        )
        return "unknown" if marked else "stale"
    if isinstance(answer, Exception):
        logger.error(
            "adapter raised an unexpected error; treating the outcome as unknown",
            extra=context,
            exc_info=answer,
        )
        marked = svc.intent_mark_unknown(claim=claim, error=repr(answer), cause="adapter_error")
        return "unknown" if marked else "stale"
    problem = reference_problem(answer.provider_reference)
    if problem:
        # The effect happened, but its id cannot be stored faithfully (too long, NUL, not text):
        # UNKNOWN with the evidence (sha256, length, prefix), at once in front of operators.
        logger.warning("provider reference cannot be stored", extra={**context, "problem": problem})
        marked = svc.intent_mark_unknown(
            claim=claim,
            error=f"the provider accepted the effect but {problem}",
            cause="reference_unstorable",
            detail={"provider_answer": answer_evidence(answer)},
            escalate=(
                f"the provider accepted the effect but {problem}: confirm it with the provider "
                "(its sha256 and prefix are in the evidence)"
            ),
        )
        return "unknown" if marked else "stale"
    return "succeeded" if svc.intent_record_success(claim=claim, result=answer) else "stale"


def _wait_in_progress(claim: claims.Claim, answer: AmbiguousOutcome) -> str:
    """A provider that deduplicates on our key answered "request in progress": it holds a
    request under this key and will answer a same-key retry with that request's outcome. That
    is "wait", not "no" (issue 38, item 4; case C32), so:

    * within the policy's patience (``budget.in_progress_wait_refusal``): READY with the same
      key after max(``Retry-After`` or the classifier's 1 s, backoff), capped by
      ``retry.cap_seconds``; the attempt is not counted against the attempt budget;
    * after it: UNKNOWN, cause ``in_progress`` (the reconciler looks the key up), counted like
      any ambiguous attempt. Never FAILED: the provider never said the effect will not happen.
    """
    refusal = svc.in_progress_wait_refusal(claim.intent)
    if refusal is None:
        scheduled = svc.intent_schedule_retry(
            claim=claim,
            error=f"{describe(answer)}; waiting (not counted against the attempt budget)",
            detail=answer.detail,
            min_delay_seconds=answer.retry_after_seconds,
            in_progress=True,
        )
        return "retry" if scheduled else "stale"
    marked = svc.intent_mark_unknown(
        claim=claim,
        error=f"{describe(answer)}; not waited out any longer: {refusal}",
        cause="in_progress",
        detail=answer.detail,
    )
    return "unknown" if marked else "stale"


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
