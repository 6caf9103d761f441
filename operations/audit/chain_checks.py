"""Checking the hash chains (``operations.audit.trail``): every chain in the database
(``audit_verify``), and an export of them away from the database (``export_line`` writes its
JSON Lines records, ``verify_export`` re-checks them).

A break is an event whose hash does not match its content, whose ``prev_hash`` is not its
predecessor's hash, whose ``seq`` skips, or whose ``from_status`` is not where the chain left the
intent; or an intent whose row is not where its chain left it. What the chains alone cannot show
(a deleted tail, a deleted or recomputed chain) is the signed checkpoints' job
(``operations.audit.verification``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.db import connection

from operations.audit.trail import GENESIS, event_hash
from operations.models import AuditEvent, Intent


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
