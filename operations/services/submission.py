"""Submitting intents: a new intent recorded with its first audit events (HELD behind an earlier
one for the same business action, or a likely duplicate), or the replay of the one already
recorded under the caller's key.

What a request must pass first is in ``operations.services.request_checks``; the dry run
(``intent_preview``) is in ``operations.services.preview``, the cancel (``intent_cancel``) in
``operations.services.cancellation``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from operations import metrics
from operations.archive.selectors import archived_for_key
from operations.audit.request_integrity import submission_seal
from operations.audit.trail import GENESIS, ChainHead, audit_event
from operations.exceptions import (
    ClientKeyInvalid,
    IdempotencyKeyReused,
    ValidationFailed,
)
from operations.idempotency import (
    FINGERPRINT_VERSION,
    CanonicalizationError,
    derive_provider_key,
    is_valid_client_key,
    request_hash,
)
from operations.models import ArchivedIntent, AuditEvent, Intent
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
from operations.services.request_checks import business_reference, check_storable, validate_request
from operations.services.transitions import outbox_handoff
from operations.statements import insert_statement, run_together
from operations.workers.outbox import handoff_after_commit


@dataclass(frozen=True)
class SubmitResult:
    """What ``intent_submit`` did: ``created`` is False for a replay of an earlier submission."""

    intent: Intent
    created: bool
    #: Set when the key's intent was archived (``operations.archive``): ``intent`` is then an
    #: unsaved stand-in and the answer is ``archived.answer``, as the API gave it then.
    archived: ArchivedIntent | None = None


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
        reference = business_reference(reference, arguments)
    if not is_valid_client_key(client_key):
        raise ClientKeyInvalid("send an Idempotency-Key header of 1-255 printable ASCII characters")
    assert client_key is not None
    check_storable(arguments=arguments, metadata=metadata or {}, reference=reference)
    validate_request(action, action_version, arguments)
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

    def earlier_or_archived() -> SubmitResult | None:
        """The replay (or refusal) of the key's intent, live or archived; None: neither."""
        earlier_submission = existing()
        if earlier_submission is not None:
            return replay(earlier_submission)
        archived = archived_for_key(tenant=tenant, principal=principal, client_key=client_key)
        return _replay_archived(archived, replay) if archived is not None else None

    policy = policy_for(action)
    try:
        key = (
            ""
            if compensates is not None
            else _business_identity(tenant, action, reference, arguments, policy)
        )
    except ValidationFailed:
        # A replay is answered as it was the first time even if the policy changed since.
        earlier = earlier_or_archived()
        if earlier is None:
            raise
        return earlier
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
        # key committed first (the unique index made us wait for it), or the key's intent was
        # archived (the trigger of migration 0035 refuses a new one): answer as for that one.
        earlier = earlier_or_archived()
        if earlier is None:
            raise
        return earlier
    return SubmitResult(intent=intent, created=True)


def _replay_archived(archived: ArchivedIntent, replay: Callable[[Intent], SubmitResult]) -> SubmitResult:
    """Replay (or refuse, when the request differs) the archived intent of a key: the same
    comparison as for a live one (``_same_request``), on the fields it keeps."""
    answer = archived.answer or {}
    stand_in = Intent(
        id=archived.intent_id,
        tenant=archived.tenant,
        principal=archived.principal,
        client_key=archived.client_key,
        action=archived.action,
        action_version=answer.get("action_version", 1),
        request_hash=archived.request_hash,
        fingerprint_version=archived.fingerprint_version,
        reference=archived.reference,
        status=archived.status,
    )
    result = replay(stand_in)
    return SubmitResult(intent=result.intent, created=False, archived=archived)


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
