"""The hash-chained audit trail.

Each intent's events form one chain: event ``n`` stores ``prev_hash`` = the ``hash`` of event
``n - 1`` (64 zeros for the first) and ``hash`` = sha256 over the canonical JSON of its own
content plus ``prev_hash``. A PostgreSQL trigger refuses UPDATE and DELETE on the table
(migration 0002). Chains are per intent rather than global so that transitions of different
intents never wait on one lock: the intent's row lock, taken by the transition's UPDATE in the
same transaction, already serialises appends to its chain, and a unique (intent, seq)
constraint makes a fork impossible.

This module writes the chains; ``operations.audit.chain_checks`` checks them (in the database
and in an export).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from operations.idempotency import canonical_json, sha256_hex
from operations.models import AuditEvent, Intent
from operations.statements import Statement, insert_statement

GENESIS = "0" * 64

#: The event of a refused decision (``operations.services.refusals``): it records who tried
#: what and why it was refused, and moves nothing.
REFUSAL_EVENT = "decision_refused"
#: An operator said "I'm on it", or took an item over from another (operations.services.assignment).
#: Not a change of the intent: pages are not made out of date by them (``last_audit_seq``).
ASSIGNED_EVENT = "assigned"
ASSIGNMENT_TAKEN_OVER_EVENT = "assignment_taken_over"
#: Events that never make a page out of date: refusals and assignments.
NOT_A_CHANGE_EVENTS = (REFUSAL_EVENT, ASSIGNED_EVENT, ASSIGNMENT_TAKEN_OVER_EVENT)


def event_hash(
    *,
    intent_id: uuid.UUID | str | None,
    seq: int,
    event: str,
    from_status: str,
    to_status: str,
    actor: str,
    reason: str,
    data: dict[str, Any],
    created_at: str,
    prev_hash: str,
) -> str:
    """Return the sha256 hex that chains one event (all arguments are part of it)."""
    document = {
        "intent_id": str(intent_id) if intent_id else None,
        "seq": seq,
        "event": event,
        "from_status": from_status,
        "to_status": to_status,
        "actor": actor,
        "reason": reason,
        "data": data,
        "created_at": created_at,
        "prev_hash": prev_hash,
    }
    return sha256_hex(canonical_json(document))


@dataclass(frozen=True)
class ChainHead:
    """Where an intent's chain ends: its last ``seq`` (0 when empty), that event's ``hash``
    (``GENESIS`` when empty) and the database's ``statement_timestamp()`` read with them, which
    becomes the next event's ``created_at``."""

    seq: int
    hash: str
    now: datetime


def chain_head_returning(table: str = Intent._meta.db_table) -> str:
    """SQL for a ``RETURNING`` (or select list) of an ``UPDATE`` on the intent table: three
    columns, ``statement_timestamp()``, the chain's last seq and its hash (NULLs when empty;
    named ``chain_now``, ``chain_seq``, ``chain_hash``),
    read in the same statement that locked the row (``head_from_row`` reads them back)."""
    last = (
        f"(SELECT {{column}} FROM {AuditEvent._meta.db_table} "
        f"WHERE intent_id = {table}.id ORDER BY seq DESC LIMIT 1)"
    )
    return (
        f"statement_timestamp() AS chain_now, {last.format(column='seq')} AS chain_seq, "
        f"{last.format(column='hash')} AS chain_hash"
    )


def head_from_row(now: datetime, seq: int | None, digest: str | None) -> ChainHead:
    """The ``ChainHead`` of the three columns ``chain_head_returning`` returns."""
    return ChainHead(seq=seq or 0, hash=digest or GENESIS, now=now)


def _chain_head(intent_id: uuid.UUID, *, first: bool) -> ChainHead:
    """The chain's head and the database's ``statement_timestamp()``, in one round trip.

    Event times come from the database clock, like leases and expiries: a worker whose own
    clock runs fast must not stamp events in the future, out of order with everyone else's
    (issue 11). ``first``: the intent was inserted in this transaction, so its chain is empty
    and only the time is read.
    """
    with connection.cursor() as cursor:
        if first:
            cursor.execute("SELECT statement_timestamp()")
            (now,) = cursor.fetchone()
            return ChainHead(seq=0, hash=GENESIS, now=now)
        cursor.execute(
            f"""
            SELECT statement_timestamp(), last.seq, last.hash
            FROM (SELECT 1) AS one
            LEFT JOIN LATERAL (
                SELECT seq, hash FROM {AuditEvent._meta.db_table}
                WHERE intent_id = %s ORDER BY seq DESC LIMIT 1
            ) AS last ON true
            """,
            [intent_id],
        )
        now, seq, digest = cursor.fetchone()
    return head_from_row(now, seq, digest)


def audit_event(
    *,
    head: ChainHead,
    intent_id: uuid.UUID | None,
    event: str,
    actor: str,
    from_status: str = "",
    to_status: str = "",
    reason: str = "",
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """The next event of the chain that ends at ``head`` (unsaved), hashed: ``seq`` is
    ``head.seq + 1``, ``prev_hash`` is ``head.hash``, ``created_at`` is ``head.now``."""
    data = data or {}
    seq = head.seq + 1
    digest = event_hash(
        intent_id=intent_id,
        seq=seq,
        event=event,
        from_status=from_status,
        to_status=to_status,
        actor=actor,
        reason=reason,
        data=data,
        created_at=head.now.isoformat(),
        prev_hash=head.hash,
    )
    return AuditEvent(
        intent_id=intent_id,
        seq=seq,
        event=event,
        from_status=from_status,
        to_status=to_status,
        actor=actor,
        reason=reason,
        data=data,
        created_at=head.now,
        prev_hash=head.hash,
        hash=digest,
    )


def audit_insert_statement(event: AuditEvent) -> Statement:
    """The INSERT of ``event`` for ``operations.statements.run_together``, returning its id, or
    nothing when its ``seq`` is already taken (``audit_chain_seq_unique``); then call
    ``audit_appended``.

    Why a ``seq`` can be taken: the chain's head comes back from the compare-and-swap ``UPDATE``
    that locked the intent (``chain_head_returning``). When that UPDATE waited for the row lock
    of a transaction that appended an event without changing the status (a refused decision, an
    approval, a lookup) and committed, PostgreSQL re-checks the UPDATE's WHERE on the newest row
    (READ COMMITTED, "UPDATE ... re-evaluates its WHERE"), but the head's subquery still reads the
    snapshot taken before the wait, so it misses that event.
    """
    return insert_statement(
        event, returning="id", on_conflict="ON CONSTRAINT audit_chain_seq_unique DO NOTHING"
    )


def audit_appended(event: AuditEvent, inserted_id: int | None) -> AuditEvent:
    """``event`` as stored by ``audit_insert_statement``; when its ``seq`` was taken, the same
    event appended again on the chain's head read now (one more statement, only in that race:
    the caller holds the intent's row lock, so the head cannot move again)."""
    if inserted_id is not None:
        event.id = inserted_id
        event._state.adding, event._state.db = False, "default"
        return event
    assert event.intent_id is not None  # chained events belong to an intent
    return audit_append(
        intent_id=event.intent_id,
        event=event.event,
        actor=event.actor,
        from_status=event.from_status,
        to_status=event.to_status,
        reason=event.reason,
        data=event.data,
    )


def audit_append(
    *,
    intent_id: uuid.UUID,
    event: str,
    actor: str,
    from_status: str = "",
    to_status: str = "",
    reason: str = "",
    data: dict[str, Any] | None = None,
    first: bool = False,
) -> AuditEvent:
    """Append one event to the intent's chain. Call inside the transition's transaction,
    after the UPDATE that locked the intent row (or the INSERT that created it). Its
    ``created_at`` is the database's ``statement_timestamp()`` (see ``_chain_head``).

    Args:
        first: the caller inserted the intent in this transaction (skips reading the chain).
            Callers that already hold the head (``chain_head_returning``) build the event with
            ``audit_event`` and insert it with the step's other writes instead.

    Raises:
        django.db.IntegrityError: a concurrent writer appended the same ``seq`` (cannot happen
            while the caller holds the intent's row lock).
    """
    row = audit_event(
        head=_chain_head(intent_id, first=first),
        intent_id=intent_id,
        event=event,
        actor=actor,
        from_status=from_status,
        to_status=to_status,
        reason=reason,
        data=data,
    )
    row.save(force_insert=True)
    return row


#: The advisory lock (``pg_advisory_xact_lock``) that serialises appends to the chain of events
#: without an intent: its rows have no (intent, seq) uniqueness to stop a fork (NULLs differ).
UNATTACHED_CHAIN_LOCK = 0x4C45_4447_4E4F_4E45 >> 1  # "LEDGNONE", as a positive bigint


def audit_append_unattached(
    *, event: str, actor: str, reason: str = "", data: dict[str, Any] | None = None
) -> AuditEvent:
    """Append an event that concerns no intent (a refused submission or preview: there is no
    intent to chain it to) to the one chain of such events, whose ``intent_id`` is NULL. It is
    hash-chained like an intent's and ``audit_verify`` walks it; signed checkpoints cover
    intents' chains only. Opens its own transaction and takes ``UNATTACHED_CHAIN_LOCK`` for
    one read and one INSERT, so concurrent appends queue instead of forking the chain.
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [UNATTACHED_CHAIN_LOCK])
        cursor.execute(
            f"""
            SELECT statement_timestamp(), last.seq, last.hash
            FROM (SELECT 1) AS one
            LEFT JOIN LATERAL (
                SELECT seq, hash FROM {AuditEvent._meta.db_table}
                WHERE intent_id IS NULL ORDER BY seq DESC LIMIT 1
            ) AS last ON true
            """
        )
        now, seq, digest = cursor.fetchone()
        row = audit_event(
            head=head_from_row(now, seq, digest),
            intent_id=None,
            event=event,
            actor=actor,
            reason=reason,
            data=data,
        )
        row.save(force_insert=True)
    return row
