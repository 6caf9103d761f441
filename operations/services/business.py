"""One business action at a time: a second intent for the same business object waits (HELD)
while an earlier one may still cause or be an effect.

The rule (seed 004: while an earlier action's outcome is unknown, do not execute a new one merely
because it has a new key; Temporal's one open execution per workflow id and its reuse policy):

* The **business identity** of an intent is ``(tenant, action, reference)``, or the argument
  fields its policy names (``business_identity_fields``). Compensation intents have none (they
  are opened by people and the reconciler, each for one provider effect).
* At submission, under a transaction-scoped advisory lock on the identity (so concurrent
  submissions queue, race-free), a new intent whose identity matches an open one
  (``OPEN_STATUSES``) is inserted HELD, linked to the earliest open one (``held_behind``).
* When the earlier one ends, ``reconciliation`` decides the held one by a rule: the earlier left
  no effect (FAILED, REJECTED, EXPIRED, CANCELLED) or had it undone (COMPENSATED) → it is
  released (READY, or AWAITING_APPROVAL when its own policy wants a person); the earlier
  SUCCEEDED → a likely duplicate: a person decides (policy ``after_success = "ask"``, it stays
  HELD and escalated) or it is rejected (``"reject"``). An operator may release it earlier,
  accepting the duplicate risk. The others held for the same identity then wait behind the
  released one, so only one proceeds at a time.
* The rule does not end when the earlier intent ends (issue 38 item 5, case C33: an agent
  restarted and ran its plan again): a new intent submitted while no intent of its identity is
  open (or only held ones), but one SUCCEEDED and its effect was recorded less than its policy's
  ``reuse_window_seconds`` ago (``Policy.reuse_window_for``: 24 h for money by default), is the
  same likely duplicate, decided at once by the same ``after_success``: inserted HELD behind
  that intent and escalated to a person (audited ``likely_duplicate``, the reason naming the
  earlier intent), or REJECTED (``"reject"``). The submission's answer says so
  (``likely_duplicate`` in the API).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models.functions import Now

from operations import metrics
from operations.adapters.registry import serving_problem
from operations.audit.request_integrity import stored_request_problem
from operations.audit.trail import audit_append
from operations.exceptions import IntentMoved, ResolutionRefused
from operations.idempotency import canonical_json
from operations.models import OPEN_STATUSES, Intent, Outcome
from operations.money import Money, format_plain
from operations.policies.rules import Policy
from operations.services.assignment import refuse_if_assigned_elsewhere
from operations.services.transitions import transition, transition_or_raise


def business_key(*, tenant: str, action: str, reference: str, arguments: Any, policy: Policy) -> str:
    """sha256 hex of the canonical ``[tenant, action, identity]``; ``""`` when the intent names
    no business identity (no reference, or none of the policy's identity fields).

    ``identity`` is ``arguments["reference"]`` when present (what the adapters send to the
    provider), else the request's reference, or ``{field: value}`` of
    ``policy.business_identity_fields``.
    """
    if policy.business_identity_fields:
        values = {name: arguments.get(name) for name in policy.business_identity_fields}
        if all(value is None for value in values.values()):
            return ""
        identity: Any = values
    else:
        # The business object is the one the provider acts on: the adapters send the arguments'
        # reference when there is one (else the request's), so the guard watches the same one.
        in_arguments = arguments.get("reference") if isinstance(arguments, dict) else None
        identity = in_arguments if isinstance(in_arguments, str) and in_arguments else reference
        if not identity:
            return ""
    return hashlib.sha256(canonical_json([tenant, action, identity])).hexdigest()


def lock_identity(key: str) -> datetime:
    """Take the transaction-scoped advisory lock on business identity ``key`` (none when it is
    empty) and return the database's ``statement_timestamp()``, in one round trip.

    A concurrent submission for the same identity waits here until this transaction commits,
    then sees its row (``earlier_intent_for``, a later statement with a later snapshot). The time
    dates the submission's first audit event (``operations.audit.trail``: events carry database time).
    """
    with connection.cursor() as cursor:
        # The race this stops: two submissions with two keys for one order both seeing no open
        # intent and both proceeding. hashtextextended gives the lock a 64-bit key.
        if key:
            cursor.execute(
                "SELECT statement_timestamp() FROM pg_advisory_xact_lock(hashtextextended(%s, 0))", [key]
            )
        else:
            cursor.execute("SELECT statement_timestamp()")
        (now,) = cursor.fetchone()
    assert isinstance(now, datetime)
    return now


@dataclass(frozen=True)
class EarlierIntent:
    """The earlier intent a new one with the same business identity waits behind: an open one,
    or (``effect_at`` set) one that SUCCEEDED within the new one's reuse window, which makes the
    new one a likely duplicate. For the latter, what the reason names: its first outcome's time
    and provider reference, its reference and arguments, and how many intents of the identity
    have an effect that stands (``effects``: SUCCEEDED or COMPENSATING)."""

    id: uuid.UUID
    status: str
    effect_at: datetime | None = None
    provider_reference: str = ""
    reference: str = ""
    arguments: Any = None
    effects: int = 0


_OPEN_LIST = ", ".join(f"'{status}'" for status in sorted(OPEN_STATUSES))
_INTENTS, _OUTCOMES = Intent._meta.db_table, Outcome._meta.db_table

# Two reads of the ``intent_business_key`` index in one statement, the best candidate kept:
# the earliest open intent, rank 0 (or rank 2 when it is itself held: only held ones are open,
# their own earlier intent has just ended or they wait for a person); and, rank 1, the intent
# whose effect was recorded most recently within the window: every SUCCEEDED intent of the
# identity (a handful per business object) with its first outcome (the outcome's intent index).
# A window of 0 skips rank 1. An outcome's created_at is the recording process's clock, compared
# with the database's: a skew of seconds moves a window of hours by as much.
_EARLIER_INTENT_SQL = f"""
    SELECT id, status, effect_at, provider_reference, reference, arguments, effects FROM (
        (SELECT id, status, CASE WHEN status = 'HELD' THEN 2 ELSE 0 END AS rank,
                NULL::timestamptz AS effect_at, ''::text AS provider_reference, ''::text AS reference,
                NULL::text AS arguments, 0::bigint AS effects
         FROM {_INTENTS}
         WHERE business_key = %(key)s AND status IN ({_OPEN_LIST})
         ORDER BY status = 'HELD', created_at, id
         LIMIT 1)
        UNION ALL
        (SELECT i.id, i.status, 1, first_outcome.created_at, first_outcome.provider_reference::text,
                i.reference::text, i.arguments::text,
                (SELECT count(*) FROM {_INTENTS} AS e
                 WHERE e.business_key = %(key)s AND e.status IN ('SUCCEEDED', 'COMPENSATING'))
         FROM {_INTENTS} AS i
         CROSS JOIN LATERAL (
             SELECT created_at, provider_reference FROM {_OUTCOMES}
             WHERE intent_id = i.id ORDER BY created_at, id LIMIT 1
         ) AS first_outcome
         WHERE %(window)s > 0 AND i.business_key = %(key)s AND i.status = 'SUCCEEDED'
           AND first_outcome.created_at > statement_timestamp() - make_interval(secs => %(window)s)
         ORDER BY first_outcome.created_at DESC, i.id
         LIMIT 1)
    ) AS candidates
    ORDER BY rank
    LIMIT 1
"""


def earlier_intent_for(key: str, *, reuse_window_seconds: int) -> EarlierIntent | None:
    """The intent a new one with business identity ``key`` must wait behind, or None.

    Call inside the submission's transaction after ``lock_identity(key)``. In order: the
    earliest open intent that is not itself held; else the intent of that identity that
    SUCCEEDED and whose effect was first recorded (its first ``Outcome``) less than
    ``reuse_window_seconds`` ago (by the database clock; the new one is then a likely
    duplicate, ``effect_at`` set); else the earliest held one. One statement
    (``_EARLIER_INTENT_SQL``).

    An intent that ended without effect (FAILED, REJECTED, EXPIRED, CANCELLED) or had it undone
    (COMPENSATED) holds nothing back, as in ``reconciliation.held.decide_one``.
    """
    with connection.cursor() as cursor:
        cursor.execute(_EARLIER_INTENT_SQL, {"key": key, "window": int(reuse_window_seconds)})
        row = cursor.fetchone()
    if row is None:
        return None
    intent_id, status, effect_at, provider_reference, reference, arguments, effects = row
    return EarlierIntent(
        id=intent_id,
        status=status,
        effect_at=effect_at,
        provider_reference=provider_reference or "",
        reference=reference or "",
        arguments=json.loads(arguments) if arguments is not None else None,
        effects=int(effects or 0),
    )


def likely_duplicate_reason(
    *,
    earlier_id: uuid.UUID,
    action: str,
    reference: str,
    arguments: Any,
    provider_reference: str,
    done_at: datetime,
    effects: int,
) -> str:
    """Why a new intent is a likely duplicate of ``earlier_id``, whose effect stands, in words
    for the operator, the audit and the agent: ``"likely duplicate: order-77 was already done
    49.90 EUR by intent … as ch_… at 2026-05-01 10:00:00 UTC"`` (``effects``: how many intents
    of the identity have an effect that stands; named when more than one)."""
    money = Money.of(arguments)  # converted by its currency's exponent, not read as major units
    what = f" {format_plain(money.amount_minor, money.currency)}" if money else ""
    ref = f" as {provider_reference}" if provider_reference else ""
    when = done_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    others = f"; {effects} effects already exist for this business action" if effects > 1 else ""
    return f"likely duplicate: {reference or action} was already done{what} by intent {earlier_id}{ref} at {when}{others}"


def intent_release_held(
    *, intent_id: uuid.UUID, actor: str, reason: str, duplicate_risk_accepted: bool = False
) -> Intent:
    """HELD -> READY (with an outbox message), or -> AWAITING_APPROVAL when the intent's own
    policy wants a person; the other intents held for the same business identity then wait
    behind this one (audited ``held_behind_changed``).

    Args:
        duplicate_risk_accepted: an operator releases it while the earlier intent is still open
            (or after it SUCCEEDED); recorded in the audit event.

    An intent held because this deployment cannot run it (``hold_reason``: its action or
    version is not served) is released only once it is served again; ``hold_reason`` is then
    cleared (the audit event keeps it).

    Every release re-derives the request_hash from the stored request first
    (``stored_request_problem``): an intent whose row was changed after submission (held by the
    worker with ``hold_reason`` "request_hash mismatch", or edited while held) is never released.

    Raises:
        IntentMoved: the intent is not HELD any more.
        ResolutionRefused: its stored request no longer hashes to its request_hash; or it is
            held because its action or version is not served, and still is; or (its subclass
            ``AssignmentRefused``) ``actor`` is an operator and another operator is on it.
    """
    with transaction.atomic():
        intent = Intent.objects.select_for_update().get(id=intent_id)
        if intent.status != Intent.Status.HELD:
            raise IntentMoved(intent_id=intent_id, expected="HELD", current=intent.status)
        # Another operator is on it ("I'm on it", issue 16 item 4): refused, nothing changes.
        refuse_if_assigned_elsewhere(intent_id=intent_id, actor=actor)
        mismatch = stored_request_problem(intent)
        if mismatch:
            # Never released to run unchanged: a row edited after submission stays held.
            metrics.REQUEST_MISMATCHES.labels(stage="release").inc()
            raise ResolutionRefused(
                f"it cannot be released: {mismatch}. Reject it; the agent submits it again if it is wanted."
            )
        if intent.hold_reason:
            problem = serving_problem(intent.action, intent.action_version)
            if problem:
                raise ResolutionRefused(
                    f"it cannot run here: {problem}. Deploy an adapter that serves it and release it "
                    "then, or reject it (the agent submits it again under a served version)."
                )
        policy = Policy.from_snapshot(intent.policy)
        data = {"held_behind": str(intent.held_behind_id), "duplicate_risk_accepted": duplicate_risk_accepted}
        if intent.hold_reason:
            data["hold_reason"] = intent.hold_reason
        if policy.needs_approval(intent.arguments):
            transition_or_raise(
                intent_id=intent_id,
                from_status=Intent.Status.HELD,
                to_status=Intent.Status.AWAITING_APPROVAL,
                actor=actor,
                event="released",
                reason=reason,
                data=data,
                updates={
                    "escalated_at": None,
                    "hold_reason": "",
                    "approval_expires_at": Now() + timedelta(seconds=policy.approval_ttl_seconds),
                },
            )
        else:
            transition_or_raise(
                intent_id=intent_id,
                from_status=Intent.Status.HELD,
                to_status=Intent.Status.READY,
                actor=actor,
                event="released",
                reason=reason,
                data=data,
                updates={"escalated_at": None, "hold_reason": ""},
                dispatch=True,
            )
        others = (
            Intent.objects.select_for_update()
            .filter(business_key=intent.business_key, status=Intent.Status.HELD)
            .exclude(id=intent_id)
        )
        for other in others.order_by("created_at"):
            Intent.objects.filter(id=other.id).update(held_behind_id=intent_id, updated_at=Now())
            audit_append(
                intent_id=other.id,
                event="held_behind_changed",
                actor=actor,
                reason=f"an earlier intent for the same business action was released: {intent_id}",
                data={"held_behind": str(intent_id)},
            )
    intent.refresh_from_db()
    return intent


def intent_reject_held(*, intent_id: uuid.UUID, actor: str, reason: str) -> None:
    """HELD -> REJECTED: a person (or the ``after_success = "reject"`` rule) decided that this
    second intent for the same business action must not run.

    Raises:
        IntentMoved: the intent is not HELD any more.
        AssignmentRefused: ``actor`` is an operator and another operator is on it.
    """
    with transaction.atomic():
        refuse_if_assigned_elsewhere(intent_id=intent_id, actor=actor)
        transition_or_raise(
            intent_id=intent_id,
            from_status=Intent.Status.HELD,
            to_status=Intent.Status.REJECTED,
            actor=actor,
            event="rejected",
            reason=reason,
            updates={"escalated_at": None},
        )


def intent_hold_for_a_person(*, intent_id: uuid.UUID, reason: str, data: dict[str, Any]) -> bool:
    """Put a HELD intent in front of an operator as a likely duplicate (its earlier intent
    SUCCEEDED): ``escalated_at`` set once, audit event ``likely_duplicate``. Returns True if
    newly escalated."""
    with transaction.atomic():
        updated = Intent.objects.filter(
            id=intent_id, status=Intent.Status.HELD, escalated_at__isnull=True
        ).update(escalated_at=Now())
        if updated:
            audit_append(
                intent_id=intent_id, event="likely_duplicate", actor="reconciler", reason=reason, data=data
            )
    return bool(updated)


def intent_reject_likely_duplicate(*, intent_id: uuid.UUID, reason: str, data: dict[str, Any]) -> None:
    """HELD -> REJECTED by the ``after_success = "reject"`` rule: its earlier intent SUCCEEDED.
    Audited ``likely_duplicate`` (the reason, as for a person's hold) then ``rejected``, in one
    transaction, so the agent's answer reads the reason the same way in both cases.

    Raises:
        IntentMoved: the intent is not HELD any more.
    """
    with transaction.atomic():
        # The row lock first, so the reason is recorded before the rejection it explains and no
        # release or cancel moves the intent in between.
        current = (
            Intent.objects.select_for_update().filter(id=intent_id).values_list("status", flat=True).first()
        )
        if current != Intent.Status.HELD:
            raise IntentMoved(intent_id=intent_id, expected="HELD", current=str(current))
        audit_append(
            intent_id=intent_id, event="likely_duplicate", actor="reconciler", reason=reason, data=data
        )
        transition_or_raise(
            intent_id=intent_id,
            from_status=Intent.Status.HELD,
            to_status=Intent.Status.REJECTED,
            actor="reconciler",
            event="rejected",
            reason=reason,
            updates={"escalated_at": None},
        )


def intent_hold_unserved(*, intent_id: uuid.UUID, reason: str, actor: str) -> bool:
    """READY -> HELD for a person: this deployment cannot run the intent (``reason``: its action
    is not registered, its adapter cannot be loaded, or its ``action_version`` is no longer
    served). Nothing is sent and no attempt is spent. ``hold_reason`` records why, and
    ``escalated_at`` puts it in the operators' queue at once; ``held_behind`` is left as it is
    (NULL, unless it was held behind an earlier intent before). An operator releases it once
    the action is served again (``intent_release_held``) or rejects it.

    Returns True when it was still READY and is now HELD.
    """
    with transaction.atomic():
        # The race this stops: a worker claiming the intent (READY -> RUNNING) meanwhile; only
        # one of the two compare-and-swaps on READY matches.
        return transition(
            intent_id=intent_id,
            from_status=Intent.Status.READY,
            to_status=Intent.Status.HELD,
            actor=actor,
            event="held_unserved",
            reason=reason,
            data={"hold_reason": reason},
            updates={"hold_reason": reason, "escalated_at": Now(), "not_before": None},
        )
