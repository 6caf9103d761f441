"""Transitions of the execution protocol after the claim (DESIGN.md steps 4, 6, 7): the re-check
right before acting, and what a provider's answer (or a restore guard's look-up) makes of a
RUNNING intent.

Each function is one short transaction; none calls a provider. ``operations.engine.protocol`` calls
them around the adapter call, which happens outside any transaction. The claim itself is in
``operations.services.claims``; the fenced write they all end with in ``operations.services.attempts``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Coalesce, Now

from operations import metrics
from operations.adapters.base import ExecutionResult
from operations.adapters.bounds import clean_detail, reference_problem, unstorable_evidence
from operations.engine.backoff import backoff_seconds
from operations.models import Approval, Attempt, Intent, Outcome
from operations.policies.approval_validity import Validity, Verdict, approval_validity
from operations.policies.rules import Policy
from operations.services.attempts import attempt_finish
from operations.services.budget import (  # the engine's names for them (``svc.<name>``)
    in_progress_wait_refusal as in_progress_wait_refusal,
)
from operations.services.budget import retry_allowed as retry_allowed
from operations.services.claims import Claim, back_to_approvers
from operations.services.compensation import complete_compensated_original
from operations.services.duplicates import duplicate_check_updates
from operations.services.resolution import intent_escalate
from operations.statements import insert_statement


def precheck_refusal(intent: Intent) -> Validity | None:
    """Step 4: re-check, right before acting, what could have changed since submission.

    Returns why the approvals on record may not be used (``approval_validity``: given on the
    intent's current request_hash, unexpired, enough different approvers; C10), or None. A
    ``Verdict.EXPIRED`` answer means the approval lapsed before execution (C22): the engine
    sends the intent back to its approvers, unless an earlier attempt of this round already
    used the approval (a retry after a send: the same use, so it is not refused; an intent
    that was sent never goes back to its approvers). Ceilings are not re-checked here: they were
    reserved in the claim's own transaction (``operations.services.ceilings``; issue 18).
    """
    validity = approval_validity(intent)
    if validity.usable:
        return None
    if validity.verdict == Verdict.EXPIRED and _approval_already_used(intent):
        # A retry of an attempt the approval let through is the same use (issue 38): the
        # approval lapsing since cannot send a sent intent back to its approvers, where an
        # expiry or a reject would end it "without effect" while the provider may hold it.
        return None
    return validity


def _approval_already_used(intent: Intent) -> bool:
    """Whether an earlier attempt of this approval round ran on the current request_hash (its
    approvals carry ``used_at``, ``approvals.intent_mark_approvals_used``)."""
    return Approval.objects.filter(
        intent=intent,
        round=intent.approval_round,
        decision=Approval.Decision.APPROVED,
        request_hash=intent.request_hash,
        used_at__isnull=False,
    ).exists()


def intent_wait_for_lapsed_approval(*, claim: Claim, reason: str) -> bool:
    """RUNNING -> AWAITING_APPROVAL: the approval expired before a worker ran the intent
    (case C22). Nothing was sent; the attempt is ``skipped``, the lease and any reservation
    released, and the intent is back in the approvals inbox with ``reason`` (audit event
    ``approval_lapsed``) for a new decision, never FAILED. Conditional on the claim's fence."""
    with transaction.atomic():
        return attempt_finish(
            claim,
            to_status=Intent.Status.AWAITING_APPROVAL,
            event="approval_lapsed",
            attempt_result=Attempt.Result.SKIPPED,
            error=reason,
            data={"sent": False},
            updates=back_to_approvers(claim.intent, "approval_lapsed"),
        )


def intent_record_success(*, claim: Claim, result: ExecutionResult) -> bool:
    """RUNNING -> SUCCEEDED with the provider's receipt, conditional on the claim's fence.

    An intent sent more than once to a provider that cannot deduplicate gets duplicate checks
    scheduled over its lookup's consistency window (``duplicate_check_updates``). The receipt's
    detail is made storable (``operations.adapters.bounds.clean_detail``); a response digest that is not
    64 hex characters is kept as evidence in the detail instead.

    Returns False (and counts ``stale_fences_rejected``) when a newer fence took over.

    Raises:
        ValueError: the provider reference cannot be stored faithfully
            (``operations.adapters.bounds.reference_problem``); the engine records such an answer with
            ``intent_mark_unknown`` instead, so this guards other callers.
    """
    problem = reference_problem(result.provider_reference)
    if problem:
        raise ValueError(problem)
    detail = clean_detail({**result.detail, "replayed": result.replayed})
    digest = result.response_digest if isinstance(result.response_digest, str) else ""
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        if digest:
            detail["response_digest_unstorable"] = unstorable_evidence(result.response_digest)
        digest = ""
    outcome = Outcome(
        intent=claim.intent,
        attempt=claim.attempt,
        source=Outcome.Source.PROVIDER,
        provider_reference=result.provider_reference,
        response_digest=digest,
        detail=detail,
    )
    with transaction.atomic():
        moved = attempt_finish(
            claim,
            to_status=Intent.Status.SUCCEEDED,
            event="succeeded",
            attempt_result=Attempt.Result.SUCCEEDED,
            detail={"provider_reference": result.provider_reference},
            data={"replayed": bool(result.replayed)},
            updates=duplicate_check_updates(action=claim.intent.action, attempts=claim.attempt.attempt_no),
            also=(insert_statement(outcome),),
        )
        if moved:
            complete_compensated_original(compensation=claim.intent)
    if moved:
        metrics.ACCEPTED_EFFECTS.labels(source="provider").inc()
        if result.replayed:
            metrics.IDEMPOTENCY_HITS.labels(layer="provider").inc()
    return moved


def intent_record_failure(
    *, claim: Claim, error: str, detail: dict[str, Any] | None = None, sent: bool = True
) -> bool:
    """RUNNING -> FAILED: a definite refusal (or a re-check refusal when ``sent`` is False).
    Stored, never retried. Conditional on the fence."""
    with transaction.atomic():
        moved = attempt_finish(
            claim,
            to_status=Intent.Status.FAILED,
            event="failed",
            attempt_result=Attempt.Result.FAILED if sent else Attempt.Result.SKIPPED,
            error=error,
            detail=detail,
            data={"sent": sent},
        )
    if moved:
        metrics.TERMINAL_FAILURES.inc()
    return moved


def intent_hold_mismatch(*, claim: Claim, problem: str) -> bool:
    """RUNNING -> HELD for a person, before anything was sent: the stored request no longer
    hashes to its request_hash (``operations.audit.request_integrity.stored_request_problem``). The
    attempt is ``skipped``, the lease released; ``hold_reason`` (starting ``request_hash
    mismatch``) and ``escalated_at`` put it in the operators' queue at once, with the audit
    event ``request_hash_mismatch``. Release is refused while the mismatch lasts; an operator
    rejects it. Conditional on the claim's fence; returns True when it moved.
    """
    moved = _hold(claim, event="request_hash_mismatch", problem=problem)
    if moved:
        metrics.REQUEST_MISMATCHES.labels(stage="execution").inc()
    return moved


def _hold(claim: Claim, *, event: str, problem: str) -> bool:
    """RUNNING -> HELD, nothing sent: ``hold_reason`` = ``problem``, escalated at once, the
    attempt ``skipped``. Conditional on the claim's fence."""
    with transaction.atomic():
        return attempt_finish(
            claim,
            to_status=Intent.Status.HELD,
            event=event,
            attempt_result=Attempt.Result.SKIPPED,
            error=problem,
            data={"sent": False, "hold_reason": problem},
            updates={"hold_reason": problem, "escalated_at": Now(), "not_before": None},
        )


def intent_schedule_retry(
    *,
    claim: Claim,
    error: str,
    detail: dict[str, Any] | None = None,
    min_delay_seconds: float | None = None,
    not_sooner_than_seconds: float | None = None,
    in_progress: bool = False,
) -> bool:
    """RUNNING -> READY with backoff (``not_before`` by database time), the same key, and an
    outbox message due at the same time so a worker picks it up when due. Conditional on the
    fence.

    Args:
        min_delay_seconds: the least delay the provider asked for (``Retry-After``, RFC 9110
            §10.2.3, or a request still in progress), in seconds; the delay is the larger of it
            and the backoff, but never more than the policy's ``retry.cap_seconds``.
        not_sooner_than_seconds: a floor under the delay, in seconds, applied after the cap:
            after a timed-out attempt, its own deadline (``backoff.after_timeout_floor_seconds``,
            issue 38 item 6), so the retry does not meet the first request still at the
            provider. Recorded in the audit event as ``not_sooner_than_seconds``.
        in_progress: the provider answered "request in progress" and the answer is waited out
            (issue 38, item 4; the caller asked ``budget.in_progress_wait_refusal``): the
            attempt does not spend the attempt budget (``in_progress_waits`` + 1, and
            ``in_progress_since`` set to the database time if this is the first such answer),
            and the audit event and the attempt row say ``in_progress_wait: true``.
    """
    retry = Policy.from_snapshot(claim.intent.policy).retry
    delay = backoff_seconds(
        attempt_no=claim.attempt.attempt_no, base=retry.base_seconds, cap=retry.cap_seconds
    )
    if min_delay_seconds is not None:
        delay = max(delay, min(float(min_delay_seconds), retry.cap_seconds))
    if not_sooner_than_seconds is not None:
        delay = max(delay, float(not_sooner_than_seconds))
    updates: dict[str, Any] = {"not_before": Now() + timedelta(seconds=delay)}
    marks: dict[str, Any] = {}
    if in_progress:
        # Written under the claim's fence like the rest of the record: a stale worker's answer
        # (its write refused by the compare-and-swap) counts no wait.
        updates.update(
            in_progress_waits=F("in_progress_waits") + 1,
            in_progress_since=Coalesce(F("in_progress_since"), Now()),
        )
        marks = {"in_progress_wait": True}
    with transaction.atomic():
        moved = attempt_finish(
            claim,
            to_status=Intent.Status.READY,
            event="retry_scheduled",
            attempt_result=Attempt.Result.RETRY,
            error=error,
            detail={**(detail or {}), **marks} or None,
            data={
                "backoff_seconds": round(delay, 3),
                **({"provider_asked_seconds": min_delay_seconds} if min_delay_seconds is not None else {}),
                **(
                    {"not_sooner_than_seconds": not_sooner_than_seconds}
                    if not_sooner_than_seconds is not None
                    else {}
                ),
            },
            updates=updates,
            dispatch=True,
        )
    if moved:
        metrics.RETRIES_SCHEDULED.inc()
        if in_progress:
            metrics.IN_PROGRESS_WAITS.inc()
    return moved


def intent_mark_unknown(
    *, claim: Claim, error: str, cause: str, detail: dict[str, Any] | None = None, escalate: str = ""
) -> bool:
    """RUNNING -> UNKNOWN: the effect may or may not have happened. Conditional on the fence;
    the reconciler takes it from here.

    ``lookup_count`` is kept, not reset: the reconciler's patience counts every lookup in the
    intent's life, so an intent that comes back to UNKNOWN again and again reaches operators
    instead of starting over (issue 21, item 7).

    Args:
        cause: why (``ambiguous``, ``stale_fence``: the provider has seen a newer attempt,
            ``in_progress``: a "request in progress" answer past the policy's patience,
            ``adapter_error``, ``recording_error``, ``reference_unstorable``), recorded in the
            audit event and the metric's label.
        escalate: when given, the reason to hand the intent to operators at once, in the same
            transaction (a lookup cannot settle it, e.g. a reference we cannot store).
    """
    with transaction.atomic():
        moved = attempt_finish(
            claim,
            to_status=Intent.Status.UNKNOWN,
            event="outcome_unknown",
            attempt_result=Attempt.Result.UNKNOWN,
            error=error,
            detail=detail,
            data={"cause": cause},
            updates={"next_lookup_at": Now()},
        )
        if moved and escalate:
            intent_escalate(intent_id=claim.intent.id, reason=escalate, actor=f"worker:{claim.worker}")
    if moved:
        metrics.UNKNOWN_OUTCOMES.labels(cause=cause).inc()
    return moved


def intent_record_found_before_send(
    *, claim: Claim, provider_references: list[str], detail: dict[str, Any] | None = None
) -> bool:
    """RUNNING -> SUCCEEDED without sending: under the restore guard, the look-up before the
    send found the effect (made by a timeline the restored database forgot, for this intent or
    for the one an agent re-submitted after the restore lost it; issue 22). The first reference
    is the receipt (outcome source ``reconciler``); two or more schedule duplicate checks (the
    sweep records each extra one as a finding). The attempt is ``skipped``. Conditional on the
    claim's fence; returns True when it moved.
    """
    keep = provider_references[0]
    problem = reference_problem(keep)
    if problem:
        raise ValueError(problem)
    evidence = clean_detail({**(detail or {}), "provider_references": provider_references[:20]})
    with transaction.atomic():
        moved = attempt_finish(
            claim,
            to_status=Intent.Status.SUCCEEDED,
            event="outcome_found",
            attempt_result=Attempt.Result.SKIPPED,
            error="found by the restore guard's look-up before sending; not sent again",
            detail={"provider_reference": keep, "source": Outcome.Source.RECONCILER, "restore_guard": True},
            data={"sent": False},
            updates=duplicate_check_updates(action=claim.intent.action, attempts=len(provider_references)),
        )
        if moved:
            complete_compensated_original(compensation=claim.intent)
            Outcome.objects.create(
                intent=claim.intent,
                source=Outcome.Source.RECONCILER,
                provider_reference=keep,
                detail=evidence,
            )
    if moved:
        metrics.ACCEPTED_EFFECTS.labels(source=Outcome.Source.RECONCILER).inc()
    return moved


def intent_defer_for_restore(*, claim: Claim, not_before: datetime, detail: dict[str, Any]) -> bool:
    """RUNNING -> READY, nothing sent: under the restore guard the look-up found nothing, but
    the provider's read path may still miss an effect the forgotten timeline made until
    ``not_before`` (``services.failover.guard_settle_at``). An outbox message is due then; the
    attempt is ``skipped`` (it still counts against the attempt budget). Conditional on the
    claim's fence; returns True when it moved."""
    with transaction.atomic():
        moved = attempt_finish(
            claim,
            to_status=Intent.Status.READY,
            event="restore_guard_deferred",
            attempt_result=Attempt.Result.SKIPPED,
            error="restore guard: nothing found yet; looking again once the provider's window has passed",
            detail=detail,
            data={"sent": False, "not_before": not_before.isoformat()},
            updates={"not_before": not_before},
            dispatch=True,
        )
    return moved


def intent_hold_restored(*, claim: Claim, problem: str) -> bool:
    """RUNNING -> HELD for a person, nothing sent: under the restore guard, at a provider that
    cannot deduplicate and offers no look-up, so whether the forgotten timeline already sent it
    cannot be known here (issue 22). ``hold_reason`` says so; the operator confirms with the
    provider, then releases (sends) or rejects. Conditional on the fence."""
    return _hold(claim, event="restore_guard_held", problem=problem)
