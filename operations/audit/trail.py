"""The hash-chained audit trail.

Each intent's events form one chain: event ``n`` stores ``prev_hash`` = the ``hash`` of event
``n - 1`` (64 zeros for the first) and ``hash`` = sha256 over the canonical JSON of its own
content plus ``prev_hash``. A PostgreSQL trigger refuses UPDATE and DELETE on the table
(migration 0002). Chains are per intent rather than global so that transitions of different
intents never wait on one lock: the intent's row lock, taken by the transition's UPDATE in the
same transaction, already serialises appends to its chain, and a unique (intent, seq)
constraint makes a fork impossible.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator
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


@dataclass(frozen=True)
class ChainBreak:
    """An event whose stored hash, link or status does not match (``event_id``), or an intent
    whose row does not match its chain (``event_id`` None)."""

    event_id: int | None
    intent_id: str | None
    problem: str


#: The fields of an exported event (JSON Lines), everything ``event_hash`` covers plus ``id``.
EXPORT_FIELDS = (
    "id",
    "intent_id",
    "seq",
    "event",
    "from_status",
    "to_status",
    "actor",
    "reason",
    "data",
    "created_at",
    "prev_hash",
    "hash",
)


def _chain_breaks(rows: Iterable[dict[str, Any]], *, anchored: bool = False) -> Iterator[ChainBreak]:
    """Check rows (``EXPORT_FIELDS``; ``created_at`` a datetime or its ISO 8601 string) given
    in (intent, seq) order, and yield each break.

    Args:
        anchored: the rows may begin each chain after its first event (an export filtered by
            time); the first row of a chain is then taken as it is and only its own hash and
            the links after it are checked.
    """
    previous: dict[str, Any] | None = None
    status: str | None = None  # where the chain's transitions so far left the intent
    for row in rows:
        same_chain = previous is not None and previous["intent_id"] == row["intent_id"]
        if not same_chain:
            status = None
        if same_chain and previous is not None:
            expected_prev, expected_seq = previous["hash"], previous["seq"] + 1
        elif anchored:
            expected_prev, expected_seq = row["prev_hash"], row["seq"]
        else:
            expected_prev, expected_seq = GENESIS, 1
        intent_id = str(row["intent_id"]) if row["intent_id"] else None
        created_at = row["created_at"]
        recomputed = event_hash(
            intent_id=row["intent_id"],
            seq=row["seq"],
            event=row["event"],
            from_status=row["from_status"],
            to_status=row["to_status"],
            actor=row["actor"],
            reason=row["reason"],
            data=row["data"],
            created_at=created_at if isinstance(created_at, str) else created_at.isoformat(),
            prev_hash=row["prev_hash"],
        )
        if row["seq"] != expected_seq:
            yield ChainBreak(row["id"], intent_id, f"seq {row['seq']} where {expected_seq} was expected")
        elif row["prev_hash"] != expected_prev:
            yield ChainBreak(row["id"], intent_id, "prev_hash does not match the previous event")
        elif recomputed != row["hash"]:
            yield ChainBreak(row["id"], intent_id, "hash does not match the event's content")
        elif row["from_status"] and status is not None and row["from_status"] != status:
            yield ChainBreak(
                row["id"],
                intent_id,
                f"moves from {row['from_status']} but the chain left the intent {status}: its status was "
                "changed without a transition",
            )
        if row["to_status"]:
            status = row["to_status"]
        previous = row


def audit_verify(batch_size: int = 2000) -> Iterator[ChainBreak]:
    """Walk every chain in (intent, seq) order and yield each break found.

    A break is an event whose ``hash`` does not match its content (tampered), whose
    ``prev_hash`` is not its predecessor's hash, or whose ``seq`` skips (an event removed).
    """
    queryset = AuditEvent.objects.order_by("intent_id", "seq").values(*EXPORT_FIELDS)
    yield from _chain_breaks(queryset.iterator(chunk_size=batch_size))
    yield from _rows_off_their_chains()


def _rows_off_their_chains() -> Iterator[ChainBreak]:
    """Intents whose row is not where their chain left them: a status no transition wrote (the
    row was edited), or no chain at all (its events were deleted). Every status change is a
    transition that appends an event with its ``to_status`` (``services.transitions``), so the
    newest event with a ``to_status`` names the status the row must have."""
    intents = Intent._meta.db_table
    events = AuditEvent._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT i.id, i.status, last.to_status
            FROM {intents} AS i
            LEFT JOIN LATERAL (
                SELECT e.to_status FROM {events} AS e
                WHERE e.intent_id = i.id AND e.to_status <> ''
                ORDER BY e.seq DESC LIMIT 1
            ) AS last ON true
            WHERE last.to_status IS DISTINCT FROM i.status
            ORDER BY i.id
            """
        )
        for intent_id, status, chain_status in cursor:
            if chain_status is None:
                problem = f"the intent is {status} but has no audit events: its chain was deleted"
            else:
                problem = (
                    f"the intent is {status} but its audit chain left it {chain_status}: its status was "
                    "changed without a transition"
                )
            yield ChainBreak(None, str(intent_id), problem)


def export_line(event: AuditEvent) -> str:
    """One event as a JSON Lines record (``EXPORT_FIELDS``, values exactly as hashed; no
    trailing newline): what ``verify_export`` re-checks, away from the database."""
    record = {name: getattr(event, name) for name in EXPORT_FIELDS}
    record["intent_id"] = str(event.intent_id) if event.intent_id else None
    record["created_at"] = event.created_at.isoformat()
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def _is_exported_event(record: Any) -> bool:
    """Whether ``record`` has every field of ``EXPORT_FIELDS`` with the type ``export_line`` writes."""
    if not isinstance(record, dict) or not set(EXPORT_FIELDS) <= record.keys():
        return False
    texts = ("event", "from_status", "to_status", "actor", "reason", "created_at", "prev_hash", "hash")
    return (
        all(isinstance(record[name], str) for name in texts)
        and isinstance(record["seq"], int)
        and isinstance(record["intent_id"], str | None)
    )


@dataclass(frozen=True)
class ExportReport:
    """What ``verify_export`` found: ``events`` and ``chains`` read, ``partial`` chains that
    start after their first event (an export filtered by time, or its first events removed),
    and the ``breaks``."""

    events: int
    chains: int
    partial: int
    breaks: list[ChainBreak]


def verify_export(lines: Iterable[str], *, complete: bool = False) -> ExportReport:
    """Re-check an audit export (``export_line`` records, in any order) without the database:
    every event's hash against its content, and the links between the events of each chain
    that the export holds. An export filtered by time may start a chain after its first event
    (that event's ``prev_hash`` is taken as given, and the chain is counted ``partial``) unless
    ``complete``, which makes such a start a break; one filtered by actor or event kind leaves
    gaps, which are reported as breaks. Events removed from the end of a chain, or whole chains,
    cannot be seen in an export alone (``verify_audit`` against a signed checkpoint can). Holds
    the whole export in memory.

    Raises:
        ValueError: a line is not a JSON object with every field of ``EXPORT_FIELDS``, or the
            export holds no event at all.
    """
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        record = json.loads(line)
        if not _is_exported_event(record):
            raise ValueError(f"line {number} is not an exported audit event")
        rows.append(record)
    if not rows:
        raise ValueError("it holds no audit event")
    rows.sort(key=lambda row: (row["intent_id"] or "", row["seq"]))
    firsts = {row["intent_id"]: row["seq"] for row in reversed(rows)}
    return ExportReport(
        events=len(rows),
        chains=len(firsts),
        partial=sum(1 for seq in firsts.values() if seq != 1),
        breaks=list(_chain_breaks(rows, anchored=not complete)),
    )
