"""Submitting and cancelling intents."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.db.models.functions import Now

from operations import metrics
from operations.adapters.base import Preview
from operations.adapters.errors import ArgumentsInvalid
from operations.adapters.registry import ActionUnavailable, UnknownAction, get_adapter
from operations.audit.request_integrity import submission_seal
from operations.audit.trail import GENESIS, ChainHead, audit_event
from operations.exceptions import (
    CancelRefused,
    CancelTooLate,
    ClientKeyInvalid,
    IdempotencyKeyReused,
    IntentMoved,
    ValidationFailed,
)
from operations.idempotency import (
    FINGERPRINT_VERSION,
    CanonicalizationError,
    derive_provider_key,
    is_valid_client_key,
    request_hash,
    storage_problems,
)
from operations.models import AuditEvent, Intent
from operations.policies.approval_validity import user_principal
from operations.policies.rules import Policy, policy_for
from operations.services.business import (
    EarlierIntent,
    business_key,
    earlier_intent_for,
    likely_duplicate_reason,
    lock_identity,
)
from operations.services.notifications import submission_notification_statement
from operations.services.refusals import refusals_audited
from operations.services.transitions import outbox_handoff, transition
from operations.statements import insert_statement, run_together
from operations.workers.outbox import handoff_after_commit

REFERENCE_MAX_LENGTH = Intent._meta.get_field("reference").max_length or 200


@dataclass(frozen=True)
class SubmitResult:
    """What ``intent_submit`` did: ``created`` is False for a replay of an earlier submission."""

    intent: Intent
    created: bool


def _same_request(existing: Intent, *, digest: str, reference: str, arguments: Any) -> bool:
    """Whether a replayed request is the one ``existing`` recorded: same request_hash under the
    current fingerprint; for an intent hashed before reference took part (fingerprint version
    1), the same hash under version 1 and the same reference, compared directly."""
    if existing.fingerprint_version == FINGERPRINT_VERSION:
        return existing.request_hash == digest
    try:
        earlier = request_hash(
            tenant=existing.tenant,
            action=existing.action,
            action_version=existing.action_version,
            arguments=arguments,
            reference=reference,
            fingerprint_version=existing.fingerprint_version,
        )
    except ValueError:  # CanonicalizationError cannot happen (already hashed); unknown version
        return False
    return existing.request_hash == earlier and existing.reference == reference


def _replay_or_refuse(existing: Intent, *, digest: str, reference: str, arguments: Any) -> SubmitResult:
    if not _same_request(existing, digest=digest, reference=reference, arguments=arguments):
        raise IdempotencyKeyReused(
            "this Idempotency-Key was already used for a different request (tenant, action, version, "
            "arguments or reference differ); use a new key for a new request (the first intent is unchanged)",
            intent_id=str(existing.id),
        )
    metrics.IDEMPOTENCY_HITS.labels(layer="api").inc()
    return SubmitResult(intent=existing, created=False)


def _check_storable(**values: Any) -> None:
    """Refuse what cannot be stored; the arguments must also come back from ``jsonb`` with the
    same canonical form (``storage_problems(hashed=True)``: numbers within ±(2^53−1))."""
    problems = [
        p
        for name, value in values.items()
        for p in storage_problems(value, field=name, hashed=name == "arguments")
    ]
    if problems:
        detail = "; ".join(f"{p['field']}: {p['message']}" for p in problems)
        raise ValidationFailed(f"the request cannot be stored: {detail}", errors=problems)


def _business_reference(reference: str, arguments: Any) -> str:
    """The reference stored on the intent: the request's, else the one in its arguments (so an
    intent whose reference travels only in its arguments can still be searched).

    Raises:
        ValidationFailed: ``arguments["reference"]`` is longer than the stored reference can be.
    """
    in_arguments = arguments.get("reference") if isinstance(arguments, dict) else None
    if not isinstance(in_arguments, str) or not in_arguments:
        return reference
    if len(in_arguments) > REFERENCE_MAX_LENGTH:
        raise ValidationFailed(
            f"arguments.reference is longer than {REFERENCE_MAX_LENGTH} characters",
            errors=[
                {"field": "arguments.reference", "message": f"at most {REFERENCE_MAX_LENGTH} characters"}
            ],
        )
    return reference or in_arguments


def _validate(action: str, action_version: int, arguments: Any) -> None:
    try:
        adapter = get_adapter(action)
    except UnknownAction as exc:
        raise ValidationFailed(str(exc), known_actions=exc.known) from exc
    except ActionUnavailable as exc:
        raise ValidationFailed(str(exc)) from exc
    # The versions served come from the adapter (issue 21, item 7), not from a constant.
    served = adapter.versions_for(action)
    if action_version not in served:
        raise ValidationFailed(
            f"{action} has no version {action_version}; supported: {list(served)}",
            errors=[{"field": "action_version", "message": "unsupported version"}],
        )
    if not isinstance(arguments, dict):
        raise ValidationFailed(
            "arguments must be a JSON object", errors=[{"field": "arguments", "message": "not an object"}]
        )
    try:
        adapter.validate(action, arguments, version=action_version)
    except ArgumentsInvalid as exc:
        raise ValidationFailed(
            f"arguments do not match the {action} schema: {exc}", errors=exc.errors
        ) from exc


def _check_requester(principal: str, requested_by: User | None) -> None:
    """A user principal comes with the user it names now, so the id stored is the asker's."""
    if requested_by is not None and principal != user_principal(requested_by):
        raise ValueError(
            f"principal {principal!r} is not user {requested_by.pk} ({requested_by.get_username()})"
        )
    if requested_by is None and principal.startswith("user:"):
        raise ValueError(f"principal {principal!r} names a console user: pass requested_by")


def intent_submit(
    *,
    tenant: str,
    principal: str,
    client_key: str | None,
    action: str,
    arguments: Any,
    action_version: int = 1,
    reference: str = "",
    metadata: dict[str, Any] | None = None,
    compensates: Intent | None = None,
    requested_by: User | None = None,
) -> SubmitResult:
    """Validate and record a new intent, or replay the one already recorded under the key.

    Behaviour follows draft-ietf-httpapi-idempotency-key-header: the client key is scoped by
    (tenant, principal); the same key with the same request_hash (tenant, action, version,
    arguments and reference; metadata is not compared) returns the stored intent
    (``created=False``); the same key with another request_hash is refused. A refused request
    stores nothing, so the caller may correct it and reuse the key. Two concurrent identical
    submissions create one intent: the loser of the unique-index race re-reads and replays.

    Args:
        tenant, principal: from the authenticated caller, never from the body.
        client_key: the ``Idempotency-Key`` header value.
        action, action_version, arguments: what to do; money in integer minor units.
        reference: the caller's business reference (also used to list effects at providers
            that cannot deduplicate).
        metadata: stored for the caller, never hashed.
        compensates: the intent this one undoes (compensation intents only).
        requested_by: the console user behind a ``user:<username>`` principal (required then,
            and must be that user); stored by id for four eyes, which never compares names.

    Raises:
        ClientKeyInvalid: missing key or not 1-255 printable ASCII.
        ValidationFailed: unknown action or version, arguments failing the schema, or
            arguments that would not come back from the database with the same canonical form
            (a number beyond ±(2^53−1), ``operations.idempotency.number_problem``).
        IdempotencyKeyReused: the key was used for a different request.
    """
    _check_requester(principal, requested_by)
    if compensates is None:  # a compensation's reference names the intent it undoes
        reference = _business_reference(reference, arguments)
    if not is_valid_client_key(client_key):
        raise ClientKeyInvalid("send an Idempotency-Key header of 1-255 printable ASCII characters")
    assert client_key is not None
    _check_storable(arguments=arguments, metadata=metadata or {}, reference=reference)
    _validate(action, action_version, arguments)
    try:
        digest = request_hash(
            tenant=tenant,
            action=action,
            action_version=action_version,
            arguments=arguments,
            reference=reference,
            fingerprint_version=FINGERPRINT_VERSION,
        )
    except CanonicalizationError as exc:
        raise ValidationFailed(f"arguments cannot be canonicalised: {exc}") from exc
    replay = partial(_replay_or_refuse, digest=digest, reference=reference, arguments=arguments)

    def existing() -> Intent | None:
        return Intent.objects.filter(tenant=tenant, principal=principal, client_key=client_key).first()

    policy = policy_for(action)
    try:
        key = (
            ""
            if compensates is not None
            else _business_identity(tenant, action, reference, arguments, policy)
        )
    except ValidationFailed:
        # A replay is answered as it was the first time even if the policy changed since.
        earlier_submission = existing()
        if earlier_submission is None:
            raise
        return replay(earlier_submission)
    gated = policy.needs_approval(arguments)
    intent_id = uuid.uuid4()
    intent = Intent(
        id=intent_id,
        tenant=tenant,
        principal=principal,
        client_key=client_key,
        action=action,
        action_version=action_version,
        arguments=arguments,
        request_hash=digest,
        fingerprint_version=FINGERPRINT_VERSION,
        idempotency_key=derive_provider_key(
            tenant=tenant,
            principal=principal,
            client_key=client_key,
            action=action,
            action_version=action_version,
        ),
        reference=reference,
        metadata=metadata or {},
        compensates=compensates,
        requested_by=requested_by,
        business_key=key,
        policy=policy.to_snapshot(),
        risk_rank=policy.risk_rank,
        status=Intent.Status.AWAITING_APPROVAL if gated else Intent.Status.READY,
        approval_expires_at=Now() + timedelta(seconds=policy.approval_ttl_seconds) if gated else None,
    )
    try:
        with transaction.atomic():
            _insert(intent, key=key, gated=gated, policy=policy)
    except IntegrityError:
        # The key was used before (a replay), or a concurrent submission with the same client
        # key committed first (the unique index made us wait for it): answer as for that one.
        earlier_submission = existing()
        if earlier_submission is None:
            raise
        return replay(earlier_submission)
    return SubmitResult(intent=intent, created=True)


def _business_identity(tenant: str, action: str, reference: str, arguments: Any, policy: Policy) -> str:
    """The intent's business identity (``business_key``, "" for none).

    Raises:
        ValidationFailed: the action's policy requires an identity and the request names none.
    """
    key = business_key(tenant=tenant, action=action, reference=reference, arguments=arguments, policy=policy)
    if policy.reference_required and not key:
        what = ", ".join(policy.business_identity_fields) or "reference"
        raise ValidationFailed(
            f"{action} must name the business object it acts on ({what}): one business action runs at a "
            "time, and without it a retry under a new Idempotency-Key could not be recognised",
            errors=[{"field": what, "message": "required by the action's policy"}],
        )
    return key


def _insert(intent: Intent, *, key: str, gated: bool, policy: Policy) -> None:
    """Write a new intent with its first audit event(s) and, when it may run now, its outbox
    message, handed to the broker after commit. Call inside a transaction. Three statements
    with a business identity, two without (DESIGN.md step 1; issue 13)::

        SELECT statement_timestamp() [FROM pg_advisory_xact_lock(<identity>)]
        SELECT ... FROM operations_intent WHERE business_key = <identity> AND ...  -- with an identity only:
            the earliest open intent, else one that SUCCEEDED within the reuse window (its first
            outcome), else the earliest held one (``business.earlier_intent_for``)
        WITH s0 AS (INSERT INTO operations_intent ... RETURNING approval_expires_at),
             s1 AS (INSERT INTO operations_outboxmessage ...)           -- when it may run now
             s2 AS (INSERT INTO operations_auditevent ...)              -- two or three events for
                                                                        -- a likely duplicate
             s3 AS (INSERT INTO operations_notification ...)            -- when it awaits approval
        SELECT ...

    The intent's unique (tenant, principal, client_key) makes a reused key fail the last
    statement (``IntegrityError``) with nothing written.

    Behind an open intent it is inserted HELD, waiting for that one to end. Behind one that
    SUCCEEDED within ``policy.reuse_window_for(arguments)`` it is a likely duplicate, decided at
    once by ``policy.after_success`` (``operations.services.business``): HELD and escalated to
    a person (event ``likely_duplicate``), or REJECTED (``likely_duplicate`` then ``rejected``).
    """
    now = lock_identity(key)
    window = policy.reuse_window_for(intent.arguments)
    earlier = earlier_intent_for(key, reuse_window_seconds=window) if key else None
    duplicate = held = ""
    if earlier is not None:
        # A second intent for the same business action: it waits for the first one, or, when
        # that one already made its effect, it is a likely duplicate.
        intent.status, intent.held_behind_id, intent.approval_expires_at = (
            Intent.Status.HELD,
            earlier.id,
            None,
        )
        if earlier.effect_at is not None:
            duplicate = likely_duplicate_reason(
                earlier_id=earlier.id,
                action=intent.action,
                reference=earlier.reference,
                arguments=earlier.arguments,
                provider_reference=earlier.provider_reference,
                done_at=earlier.effect_at,
                effects=earlier.effects,
            )
        held = f"held: {duplicate or f'intent {earlier.id} for the same business action is {earlier.status}'}"
    submitted = audit_event(
        head=ChainHead(seq=0, hash=GENESIS, now=now),
        intent_id=intent.id,
        event="submitted",
        actor=intent.principal,
        to_status=intent.status,
        reason=held,
        data={
            "request_hash": intent.request_hash,
            "fingerprint_version": FINGERPRINT_VERSION,
            "client_key": intent.client_key,
            "needs_approval": gated,
            **submission_seal(policy=intent.policy, idempotency_key=intent.idempotency_key),
            **({"held_behind": str(earlier.id)} if earlier else {}),
        },
    )
    events = [submitted]
    if earlier is not None and duplicate:
        events += _likely_duplicate_events(intent, submitted, earlier, duplicate, policy, window)
    statements = [insert_statement(intent, returning="approval_expires_at")]
    handoff = None
    if earlier is None and not gated:
        # Due now: the outbox INSERT reads the intent's not_before in this statement's snapshot,
        # which cannot see the intent inserted beside it (a submission has none anyway).
        assert intent.not_before is None, "a submission with not_before needs its outbox row after the intent"
        handoff, enqueue = outbox_handoff(intent_id=intent.id)
        statements.append(enqueue)
    statements.extend(insert_statement(event) for event in events)
    if intent.status == Intent.Status.AWAITING_APPROVAL:  # its approvers are told (the outbox row)
        statements.append(submission_notification_statement(intent))
    expires_at, *countdown = run_together(*statements)
    intent.approval_expires_at = expires_at  # set by the database clock
    intent._state.adding, intent._state.db = False, "default"  # saved, as save() would mark it
    if handoff is not None:
        handoff_after_commit(handoff, countdown[0])


#: The actor of the events the reuse-window rule writes at submission: the policy decided, not
#: a person, a worker or the reconciler.
POLICY_ACTOR = "policy"


def _likely_duplicate_events(
    intent: Intent, submitted: AuditEvent, earlier: EarlierIntent, reason: str, policy: Policy, window: int
) -> list[AuditEvent]:
    """The events after ``submitted`` of an intent that is a likely duplicate of ``earlier``
    (which SUCCEEDED within the reuse window), and its row set to match: ``likely_duplicate``
    (HELD, escalated to a person at once, as ``reconciliation.held.decide_one`` does for one held
    behind an open intent) and, under ``after_success = "reject"``, ``rejected`` (REJECTED)."""
    data = {
        "earlier": str(earlier.id),
        "earlier_status": earlier.status,
        "reuse_window_seconds": window,
    }
    head = ChainHead(seq=submitted.seq, hash=submitted.hash, now=submitted.created_at)
    flagged = audit_event(
        head=head, intent_id=intent.id, event="likely_duplicate", actor=POLICY_ACTOR, reason=reason, data=data
    )
    if policy.after_success != "reject":
        intent.escalated_at = submitted.created_at  # in front of a person now
        return [flagged]
    intent.status = Intent.Status.REJECTED
    rejected = audit_event(
        head=ChainHead(seq=flagged.seq, hash=flagged.hash, now=submitted.created_at),
        intent_id=intent.id,
        event="rejected",
        actor=POLICY_ACTOR,
        from_status=Intent.Status.HELD,
        to_status=Intent.Status.REJECTED,
        reason=reason,
    )
    return [flagged, rejected]


@refusals_audited("cancel")
def intent_cancel(*, intent_id: uuid.UUID, actor: str, reason: str = "") -> Intent:
    """Cancel an intent that was never sent (AWAITING_APPROVAL, READY or HELD, no attempt yet).

    An intent back in READY (a same-key retry, a wait for "request in progress"), HELD or
    AWAITING_APPROVAL after an attempt was sent may hold an effect at the provider: CANCELLED
    would tell its agent "no effect" and free its business identity for a second charge (issue
    38; the same hole as an ``absent`` decided too early). Such a cancel is refused; the intent
    ends by the provider's answer, a lookup or an operator.

    Raises:
        IntentMoved: the intent is RUNNING or beyond (cancel is honoured only before RUNNING);
            ``current`` names its state.
        CancelTooLate: it was sent already (``attempt_count`` > 0); nothing changed.
        CancelRefused: an agent asked to cancel a compensation intent (only people may: an
            agent's cancel would leave the original's effect un-undone with nobody told).
    """
    if actor.startswith("agent:") and Intent.objects.filter(id=intent_id, compensates__isnull=False).exists():
        raise CancelRefused(
            "this is a compensation intent opened to undo another intent's effect; only an operator can cancel it"
        )
    cancellable = (Intent.Status.AWAITING_APPROVAL, Intent.Status.READY, Intent.Status.HELD)
    for from_status in cancellable:
        if transition(
            intent_id=intent_id,
            from_status=from_status,
            to_status=Intent.Status.CANCELLED,
            actor=actor,
            event="cancelled",
            reason=reason,
            # The race this stops: a worker's claim (READY -> RUNNING, attempt_count + 1) meanwhile.
            where=Q(attempt_count=0),
        ):
            return Intent.objects.get(id=intent_id)
    current, attempts = Intent.objects.filter(id=intent_id).values_list("status", "attempt_count").get()
    if current == Intent.Status.CANCELLED:
        return Intent.objects.get(id=intent_id)
    if current in cancellable and attempts > 0:
        raise CancelTooLate(
            f"intent {intent_id} was sent to the provider already ({attempts} attempt(s)): its effect may exist, "
            "so it can no longer be cancelled; it ends by the provider's answer, a lookup or an operator"
        )
    raise IntentMoved(intent_id=intent_id, expected="AWAITING_APPROVAL, READY or HELD", current=current)


@dataclass(frozen=True)
class PreviewResult:
    """The dry run of a would-be intent: the adapter's preview plus what the policy decides."""

    action: str
    request_hash: str
    needs_approval: bool
    preview: Preview
    policy: Policy


def intent_preview(
    *,
    tenant: str,
    action: str,
    arguments: Any,
    action_version: int = 1,
    reference: str = "",
    policy: Policy | None = None,
) -> PreviewResult:
    """Validate and describe an intent without persisting anything or calling the provider.

    Args:
        reference: the request's business reference (part of the request_hash); the one in the
            arguments is used when it is blank, as at submission.
        policy: the policy to judge by: a submitted intent's snapshot
            (``Policy.from_snapshot(intent.policy)``); by default the policy in force for
            ``action`` now, which is what a new submission would get.

    Raises:
        ValidationFailed: unknown action or version, or arguments failing the schema.
    """
    _check_storable(arguments=arguments)
    _validate(action, action_version, arguments)
    try:
        digest = request_hash(
            tenant=tenant,
            action=action,
            action_version=action_version,
            arguments=arguments,
            reference=_business_reference(reference, arguments),
            fingerprint_version=FINGERPRINT_VERSION,
        )
    except CanonicalizationError as exc:
        raise ValidationFailed(f"arguments cannot be canonicalised: {exc}") from exc
    if policy is None:
        policy = policy_for(action)
    preview = get_adapter(action).preview(action, arguments)
    gated = policy.needs_approval(arguments)
    checks = [
        {"check": "schema", "ok": True, "detail": f"arguments match {action} v{action_version}"},
        {
            "check": "approval",
            "ok": True,
            "detail": f"needs {policy.approvals_required} approver(s) from '{policy.approver_group}'"
            if gated
            else "executes automatically under the policy",
        },
        *preview.checks,
    ]
    preview = Preview(**{**preview.__dict__, "checks": checks})
    return PreviewResult(
        action=action, request_hash=digest, needs_approval=gated, preview=preview, policy=policy
    )
