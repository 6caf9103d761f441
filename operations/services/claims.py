"""The claim (DESIGN.md step 3): READY -> RUNNING for one worker under a fenced lease, and
READY -> AWAITING_APPROVAL when the claim would pass a spend or effects ceiling (issue 18).

``intent_claim`` is one short transaction and calls no provider; ``operations.engine.protocol``
calls it before anything is sent. What ends the attempt is in ``operations.services.attempts``
and ``operations.services.execution``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now

from operations import metrics
from operations.adapters.registry import serving_problem
from operations.audit.trail import (
    audit_appended,
    audit_event,
    audit_insert_statement,
    chain_head_returning,
    head_from_row,
)
from operations.models import FENCE_EPOCH_STRIDE, Attempt, Intent, OutboxMessage
from operations.policies.rules import Policy
from operations.services.ceilings import CeilingReached, ceiling_refusal, reservation_statements
from operations.services.transitions import check_allowed, transition
from operations.statements import Statement, insert_statement, run_together


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


def back_to_approvers(intent: Intent, wait_reason: str) -> dict[str, Any]:
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
            updates=back_to_approvers(intent, "ceiling"),
            also=(Statement(_ACK_SQL, (intent.id,)),),
        )
