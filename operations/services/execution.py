"""Transitions of the execution protocol (DESIGN.md steps 3, 4, 6, 7) and lease takeover.

Each function is one short transaction; none calls a provider. ``operations.engine.protocol`` calls
them around the adapter call, which happens outside any transaction.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Coalesce, Now

from operations import metrics
from operations.adapters.base import ExecutionResult
from operations.adapters.bounds import clean_detail, clean_text, reference_problem, unstorable_evidence
from operations.adapters.registry import serving_problem
from operations.audit.trail import (
    audit_append,
    audit_appended,
    audit_event,
    audit_insert_statement,
    chain_head_returning,
    head_from_row,
)
from operations.engine.backoff import backoff_seconds
from operations.models import FENCE_EPOCH_STRIDE, Approval, Attempt, Intent, OutboxMessage, Outcome
from operations.policies.approval_validity import Validity, Verdict, approval_validity
from operations.policies.rules import Policy
from operations.services.budget import (  # the engine's names for them (``svc.<name>``)
    in_progress_wait_refusal as in_progress_wait_refusal,
)
from operations.services.budget import retry_allowed as retry_allowed
from operations.services.ceilings import CeilingReached, ceiling_refusal, reservation_statements
from operations.services.duplicates import duplicate_check_updates
from operations.services.resolution import complete_compensated_original, intent_escalate
from operations.services.transitions import check_allowed, transition
from operations.statements import Statement, insert_statement, run_together, update_statement


@dataclass(frozen=True)
class Claim:
    """A won claim: this worker holds the intent's lease under ``fence`` until it expires."""

    intent: Intent
    attempt: Attempt
    fence: int
    worker: str
    #: When a recovery's restore guard covers this claim, the time that recovery began (the
    #: effect may have been sent before it by a timeline the database forgot); else None.
    restore_guard_since: datetime | None = None
    #: The ``data`` of the intent's ``submitted`` audit event, read by the claim (None: no such
    #: event), for ``request_integrity.stored_request_problem``.
    submitted_record: dict[str, Any] | None = None


def intent_claim(
    *, intent_id: uuid.UUID, worker: str, lease_seconds: int, delivery_retries: int = 0
) -> Claim | None:
    """READY -> RUNNING for one worker: increment the fence, take a lease of ``lease_seconds``
    by the database clock, insert the attempt row. Returns None when there is nothing to
    claim (a duplicate delivery, not yet due, another state, or execution paused).

    The same UPDATE reads the execution control row (issue 22): the fence is raised to at
    least ``fence_epoch * FENCE_EPOCH_STRIDE`` + 1, so no fence after a recovery is one a
    provider saw before the restore; nothing is claimed while execution is paused; and the
    claim learns whether the restore guard is on (``Claim.restore_guard_since``).

    ``delivery_retries`` > 0 (the message was re-delivered while the database was unreachable)
    is recorded in the ``claimed`` event with the reason, so the wait before it is explained.

    One write transaction of two statements (issue 13): the compare-and-swap ``_CLAIM_SQL``
    (``UPDATE ... RETURNING`` the row, the restore guard, the ``submitted`` event's data for the
    request-integrity check, and the audit chain's head), then one statement inserting the
    attempt and the ``claimed`` event, acknowledging the intent's outbox messages (``_ACK_SQL``)
    and reading the execution control row again (``_CONTROL_SQL``: a pause committed while the
    UPDATE waited for the row lock rolls the claim back; the guard is taken from this read).

    Ceilings (issue 18): the first claim since the intent last held no reservation reserves its
    amount and one effect against its ``SpendWindow`` rows in the second statement
    (``operations.services.ceilings``).

    Raises:
        NotServed: the intent's action or version is not served here (checked on the claimed
            row before anything is written; the claim is rolled back, no attempt is spent).
        CeilingWait: the reservation would pass a ceiling; the claim is rolled back and the
            intent moved to AWAITING_APPROVAL for a person.
    """
    # The one transition written as SQL (the hottest): it still obeys the transition table.
    check_allowed(intent_id=intent_id, current=Intent.Status.READY, target=Intent.Status.RUNNING)
    try:
        return _claim(
            intent_id=intent_id, worker=worker, lease_seconds=lease_seconds, delivery_retries=delivery_retries
        )
    except _ControlMoved:
        return None  # rolled back: the engine finds execution paused, or recovery re-dispatches
    except _CeilingHit as hit:
        # Rolled back: nothing was reserved or claimed. A person decides (issue 18, item 3).
        refusal = hit.refusal or ceiling_refusal(hit.intent, now=hit.now)
        if intent_wait_for_ceiling(intent=hit.intent, refusal=refusal, worker=worker):
            raise CeilingWait(refusal.reason) from hit
        return None


class _ControlMoved(Exception):
    """The execution control row changed while the claim waited for the intent's row lock."""


class _CeilingHit(Exception):
    """The claim's reservation would pass a ceiling; the claim is rolled back. ``refusal`` is
    None when a window upsert came back empty: it is read after the rollback (so it does not
    count this claim's own writes)."""

    def __init__(self, refusal: CeilingReached | None, *, intent: Intent, now: datetime) -> None:
        super().__init__("ceiling reached")
        self.refusal = refusal
        self.intent = intent
        self.now = now


def _claim(*, intent_id: uuid.UUID, worker: str, lease_seconds: int, delivery_retries: int) -> Claim | None:
    with transaction.atomic():
        # The race this stops: two deliveries of the same message (or two workers) claiming
        # one intent. The UPDATE's WHERE is re-checked under the row lock, so exactly one
        # wins and the fence increments once (shared/cases C05). RETURNING saves a re-read.
        params = [
            Intent.Status.RUNNING,
            FENCE_EPOCH_STRIDE,
            worker,
            lease_seconds,
            intent_id,
            Intent.Status.READY,
        ]
        claimed = list(Intent.objects.raw(_CLAIM_SQL, params))
        if len(claimed) != 1:
            return None
        intent = claimed[0]
        # Before anything is written: an intent this deployment cannot run is not claimed.
        problem = serving_problem(intent.action, intent.action_version)
        if problem is not None:
            raise NotServed(problem)
        head = head_from_row(intent.chain_now, intent.chain_seq, intent.chain_hash)  # type: ignore[attr-defined]
        attempt = Attempt(
            intent=intent,
            attempt_no=intent.attempt_count,
            fence=intent.fence,
            worker=worker,
            started_at=head.now,
        )
        event = audit_event(
            head=head,
            intent_id=intent_id,
            event="claimed",
            actor=f"worker:{worker}",
            from_status=Intent.Status.READY,
            to_status=Intent.Status.RUNNING,
            reason=(
                f"delivered after {delivery_retries} retries while the database was unreachable"
                if delivery_retries
                else ""
            ),
            data={
                "fence": intent.fence,
                "attempt_no": attempt.attempt_no,
                **({"delivery_retries": delivery_retries} if delivery_retries else {}),
            },
        )
        # Ceilings (issue 18): the first claim since the intent last held no reservation reserves
        # its amount and one effect in this same statement; a refusal rolls the claim back.
        try:
            reserve = [] if intent.holds_reservation else reservation_statements(intent, now=head.now)  # type: ignore[attr-defined]
        except CeilingReached as refusal:
            raise _CeilingHit(refusal, intent=intent, now=head.now) from refusal
        attempt.id, event_id, control, *reserved = run_together(
            insert_statement(attempt, returning="id"),
            audit_insert_statement(event),
            Statement(_ACK_SQL, (intent_id,)),
            Statement(_CONTROL_SQL, (), returns=True),
            *reserve,
        )
        if any(value is None for value in reserved):
            raise _CeilingHit(None, intent=intent, now=head.now)
        # The UPDATE read the control row in the snapshot it took before it waited for the
        # intent's row lock (READ COMMITTED re-checks only the intent row after a wait); this
        # statement's snapshot is newer. A pause (or an epoch) committed meanwhile rolls back.
        paused, epoch, guard_since = _control_values(control)
        if paused or intent.fence <= epoch * FENCE_EPOCH_STRIDE:
            raise _ControlMoved
        intent.restore_guard_since = guard_since  # type: ignore[attr-defined]
        audit_appended(event, event_id)
        attempt._state.adding, attempt._state.db = False, "default"  # saved, as save() would mark it
    metrics.ATTEMPTS.inc()
    return Claim(
        intent=intent,
        attempt=attempt,
        fence=intent.fence,
        worker=worker,
        restore_guard_since=getattr(intent, "restore_guard_since", None),
        submitted_record=_json_or_none(getattr(intent, "submitted_record", None)),
    )


def _json_or_none(value: Any) -> dict[str, Any] | None:
    # A jsonb column read through a raw query arrives as text (Django parses JSONField only).
    loaded = json.loads(value) if isinstance(value, str) else value
    return loaded if isinstance(loaded, dict) else None


class CeilingWait(Exception):
    """The claim would have passed a ceiling: it was rolled back and the intent now awaits its
    approvers (``intent_wait_for_ceiling``); nothing is to be executed."""


class NotServed(Exception):
    """The claimed intent's action or version is not served by this deployment
    (``operations.adapters.registry.serving_problem``); the claim was rolled back."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


#: The claim's compare-and-swap (see ``intent_claim``); it returns the row, the restore guard's
#: start when the guard is on, and the audit chain's head with the database time.
_CLAIM_SQL = f"""
    UPDATE operations_intent
    SET status = %s,
        fence = GREATEST(fence, (SELECT fence_epoch * %s FROM operations_executioncontrol)) + 1,
        attempt_count = attempt_count + 1,
        lease_owner = %s, lease_expires_at = statement_timestamp() + make_interval(secs => %s),
        updated_at = statement_timestamp()
    WHERE id = %s AND status = %s
      AND (not_before IS NULL OR not_before <= statement_timestamp())
      AND NOT EXISTS (SELECT 1 FROM operations_executioncontrol WHERE paused_at IS NOT NULL)
    RETURNING *, (
        SELECT guard_started_at FROM operations_executioncontrol
        WHERE guard_until > statement_timestamp()
    ) AS restore_guard_since, (
        SELECT data FROM operations_auditevent
        WHERE intent_id = operations_intent.id AND seq = 1 AND event = 'submitted'
    ) AS submitted_record, EXISTS (
        SELECT 1 FROM operations_reservation
        WHERE intent_id = operations_intent.id AND released_at IS NULL
    ) AS holds_reservation,
    {chain_head_returning()}
"""

#: The execution control row as of the claim's second statement (see ``_claim``): paused,
#: fence epoch, and the restore guard's start while it is on.
_CONTROL_SQL = """
    SELECT json_build_object(
        'paused', paused_at IS NOT NULL, 'epoch', fence_epoch,
        'guard', CASE WHEN guard_until > statement_timestamp() THEN guard_started_at END)::text
    FROM operations_executioncontrol
"""


def _control_values(control: Any) -> tuple[bool, int, datetime | None]:
    values = json.loads(control) if isinstance(control, str) else {}
    guard = values.get("guard")
    return (
        bool(values.get("paused")),
        int(values.get("epoch") or 0),
        datetime.fromisoformat(guard) if guard else None,
    )


#: The claim consumes the intent's outbox messages (``operations.workers.outbox``).
_ACK_SQL = (
    f"UPDATE {OutboxMessage._meta.db_table} SET acked_at = statement_timestamp() "
    "WHERE intent_id = %s AND acked_at IS NULL"
)


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


def _back_to_approvers(intent: Intent, wait_reason: str) -> dict[str, Any]:
    """The columns that put an intent in front of its approvers again: a new approval round
    (decisions of earlier rounds no longer count), a fresh request expiry by the database clock
    and why it waits (issue 18)."""
    ttl = timedelta(seconds=Policy.from_snapshot(intent.policy).approval_ttl_seconds)
    return {
        "wait_reason": wait_reason,
        # An earlier override of a ceiling does not carry over: the approver decides again.
        "ceiling_override": False,
        "approval_round": F("approval_round") + 1,
        "approval_expires_at": Now() + ttl,
        "not_before": None,
    }


def intent_wait_for_ceiling(*, intent: Intent, refusal: CeilingReached, worker: str) -> bool:
    """READY -> AWAITING_APPROVAL: the claim would have passed a ceiling (issue 18, item 3).

    Nothing was claimed or sent (the claim rolled back). The approvers see the reason and the
    window's reservations (audit event ``ceiling_reached``); approving lets this one intent pass
    its ceilings (``ceiling_override``), rejecting ends it. Its outbox messages are consumed in
    the same statement. Returns True when it moved (False: someone else moved it first).
    """
    with transaction.atomic():
        return transition(
            intent_id=intent.id,
            from_status=Intent.Status.READY,
            to_status=Intent.Status.AWAITING_APPROVAL,
            actor=f"worker:{worker}",
            event="ceiling_reached",
            reason=refusal.reason,
            data=refusal.data,
            updates=_back_to_approvers(intent, "ceiling"),
            also=(Statement(_ACK_SQL, (intent.id,)),),
        )


def intent_wait_for_lapsed_approval(*, claim: Claim, reason: str) -> bool:
    """RUNNING -> AWAITING_APPROVAL: the approval expired before a worker ran the intent
    (case C22). Nothing was sent; the attempt is ``skipped``, the lease and any reservation
    released, and the intent is back in the approvals inbox with ``reason`` (audit event
    ``approval_lapsed``) for a new decision, never FAILED. Conditional on the claim's fence."""
    with transaction.atomic():
        return _record(
            claim,
            to_status=Intent.Status.AWAITING_APPROVAL,
            event="approval_lapsed",
            attempt_result=Attempt.Result.SKIPPED,
            error=reason,
            data={"sent": False},
            updates=_back_to_approvers(claim.intent, "approval_lapsed"),
        )


def _close_attempt(
    claim: Claim, result: str, *, error: str = "", detail: dict[str, Any] | None = None
) -> Statement:
    # An attempt row is inserted at claim and closed exactly once (finished_at IS NULL guard).
    # ``_record`` hands it text and JSON already made storable (``operations.adapters.bounds``).
    return update_statement(
        Attempt.objects.filter(id=claim.attempt.id, finished_at__isnull=True),
        {"finished_at": Now(), "result": result, "error": error, "detail": detail or {}},
    )


def release_lease() -> dict[str, Any]:
    """The columns that release a lease (set in the same UPDATE as the transition)."""
    return {"lease_owner": "", "lease_expires_at": None}


def _record(
    claim: Claim,
    *,
    to_status: str,
    event: str,
    attempt_result: str,
    error: str = "",
    detail: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
    updates: dict[str, Any] | None = None,
    dispatch: bool = False,
    also: tuple[Statement, ...] = (),
) -> bool:
    """RUNNING -> ``to_status`` for the claim's fence (a stale worker's write moves nothing),
    releasing the lease and closing the attempt (and running ``also``, e.g. the outcome's
    INSERT) in the statement that appends the audit event (``transition``). Call inside the
    caller's transaction.

    A refused write is recorded too (``_record_fenced_out``): the attempt row says it was
    fenced out and what the provider answered, and the intent's chain gets an audit event.

    ``error`` and ``detail`` usually carry what a provider sent: they are made storable here
    (``operations.adapters.bounds``: NUL characters, lone surrogates, length, depth, NaN), so nothing a
    provider sends can make this write fail.
    """
    error = clean_text(error)
    detail = clean_detail(detail) if detail else None
    moved = transition(
        intent_id=claim.intent.id,
        from_status=Intent.Status.RUNNING,
        to_status=to_status,
        fence=claim.fence,
        actor=f"worker:{claim.worker}",
        event=event,
        reason=error[:500],
        data={"fence": claim.fence, **(data or {}), **(detail or {})},
        updates={**release_lease(), "last_error": error, **(updates or {})},
        dispatch=dispatch,
        also=(_close_attempt(claim, attempt_result, error=error, detail=detail), *also),
    )
    if not moved:
        _record_fenced_out(
            claim,
            would_be=to_status,
            answer={"result": attempt_result, "error": error[:500], **(detail or {})},
        )
    return moved


def _record_fenced_out(claim: Claim, *, would_be: str, answer: dict[str, Any]) -> None:
    """Record a write refused by the fence: a newer attempt (a lease takeover) moved the intent
    while this worker was calling the provider. Its answer still matters — a stale worker that
    did apply the effect is the one a duplicate check or a lookup must account for.

    The attempt (still pending, or marked ``abandoned`` by the takeover) becomes ``fenced_out``
    with the provider's answer; an audit event ``stale_write_refused`` is appended. At a
    provider without keys, a stale success on an intent that already SUCCEEDED schedules a
    duplicate check. Call inside the caller's transaction.
    """
    # Lock the intent row: the audit chain is appended under it (operations.audit.trail).
    row = (
        Intent.objects.select_for_update()
        .filter(id=claim.intent.id)
        .values_list("status", "attempt_count")
        .first()
    )
    if row is None:
        return
    current, attempts = row
    Attempt.objects.filter(
        id=claim.attempt.id, result__in=[Attempt.Result.PENDING, Attempt.Result.ABANDONED]
    ).update(
        finished_at=Coalesce(F("finished_at"), Now()),
        result=Attempt.Result.FENCED_OUT,
        error="fenced out: a newer attempt took over before this one recorded its outcome",
        detail={"provider_answer": answer, "would_have_become": would_be},
    )
    audit_append(
        intent_id=claim.intent.id,
        event="stale_write_refused",
        actor=f"worker:{claim.worker}",
        reason="a newer attempt took over; this attempt's outcome was not applied",
        data={
            "fence": claim.fence,
            "attempt_no": claim.attempt.attempt_no,
            "would_have_become": would_be,
            "provider_answer": answer,
        },
    )
    metrics.FENCED_OUT_ATTEMPTS.labels(answer=answer.get("result", "")).inc()
    if would_be == Intent.Status.SUCCEEDED and current == Intent.Status.SUCCEEDED:
        Intent.objects.filter(id=claim.intent.id).update(
            **duplicate_check_updates(action=claim.intent.action, attempts=attempts)
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
        moved = _record(
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
        moved = _record(
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
        return _record(
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
        moved = _record(
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
        moved = _record(
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
        moved = _record(
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
        moved = _record(
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
