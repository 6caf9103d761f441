"""Verifying the audit log against a signed checkpoint (``operations.audit.checkpoints``).

A checkpoint's heads say, for every intent, the seq and hash its chain had reached. Chains only
grow, so the live table must still hold, for each head, an event at that seq with that hash;
events written since are fine (the next checkpoint covers them). What does not hold is named:
see ``checkpoint_verify``. The stored series of checkpoints is checked too (signatures, gap-free
numbers, ``prev_hash`` links), and an outside copy (the checkpoint file kept by an auditor) can
be verified against instead: every line of it must be in the database unchanged, and the live
heads are compared with its newest line, which is what defeats someone who deletes checkpoint
rows, or deletes them and lets new ones be signed in their place.

``CheckpointSuccessor`` is the same comparison made before a new checkpoint is signed
(``operations.audit.signing``): cheap, since the new heads are at hand.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain, islice
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.db import connection
from django.db.models import BinaryField, F, Func

from operations.audit.checkpoints import (
    FETCH_ROWS,
    CheckpointError,
    SignedCheckpoint,
    checkpoint_file_read,
    checkpoint_latest,
    checkpoint_statement,
    leaf_input,
    restored_gap,
)
from operations.audit.keys import key_id, signature_valid
from operations.audit.merkle import MerkleRoot
from operations.audit.trail import GENESIS
from operations.idempotency import canonical_json, sha256_hex
from operations.models import AuditCheckpoint, AuditEvent

# For a batch of checkpointed heads: the live event at the head's seq, and the chain's last seq.
COMPARE_SQL = """
SELECT h.intent_id::text, h.seq, e.hash,
       (SELECT max(m.seq) FROM operations_auditevent m WHERE m.intent_id = h.intent_id)
FROM unnest(%s::uuid[], %s::integer[]) AS h(intent_id, seq)
LEFT JOIN operations_auditevent e ON e.intent_id = h.intent_id AND e.seq = h.seq
"""

# The faults verification names.
TRUNCATION = "truncation"
DELETED_CHAIN = "deleted chain"
DELETED_TAIL = "deleted tail"
DELETED_EVENT = "deleted event"
RECOMPUTED_CHAIN = "recomputed chain"
BAD_SIGNATURE = "bad signature"
UNKNOWN_KEY = "unknown key"
ALTERED_CHECKPOINT = "altered checkpoint"
DELETED_CHECKPOINT = "deleted checkpoint"

# File lines compared with the database per query.
FILE_BATCH = 200

# (intent_id, checkpointed seq, checkpointed hash, live hash at that seq, live last seq)
LiveHead = tuple[str, int, str, str | None, int | None]


@dataclass(frozen=True)
class CheckpointFault:
    """One thing verification found: ``kind`` is one of the module's fault names
    (``deleted tail``, ``deleted chain``, ``recomputed chain``, ``truncation``, ...)."""

    kind: str
    problem: str
    intent_id: str | None = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.problem}"


@dataclass
class CheckpointReport:
    """The result of ``checkpoint_verify``: the checkpoint verified against (None when none
    exists), where it came from, the faults (at most ``limit``; ``omitted`` counts the rest),
    the live table's event count (None when not counted), the file lines read (``source``
    "file"), and the stored checkpoints signed over acknowledged faults, as ``(number,
    statement["accepted"])``."""

    checkpoint: SignedCheckpoint | None
    source: str
    live_events: int | None
    faults: list[CheckpointFault] = field(default_factory=list)
    omitted: int = 0
    limit: int = 1000
    file_lines: int = 0
    #: file lines whose checkpoint the database lost in a restore that a recovery re-baselined
    restored_lines: int = 0
    accepted: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing was found."""
        return not self.faults and not self.omitted

    def add(self, fault: CheckpointFault) -> None:
        """Record a fault (counted only, past ``limit``)."""
        if len(self.faults) < self.limit:
            self.faults.append(fault)
        else:
            self.omitted += 1


def checkpoint_verify(
    *, public_key: Ed25519PublicKey, checkpoint_file: Path | None = None, limit: int = 1000
) -> CheckpointReport:
    """Verify the live audit table against a checkpoint, and the stored series of checkpoints.

    Args:
        public_key: the key checkpoints must be signed with (``audit_keys.public_key_load``).
        checkpoint_file: an outside copy of the checkpoint file; None verifies against the
            newest stored checkpoint. With a file, every line is checked (its own signature,
            then the database's checkpoint of that number: present, identical) and the live
            heads are compared with the file's newest checkpoint (``_compare_file``).
        limit: faults listed at most (the rest are counted in ``omitted``).

    Findings, by name: ``bad signature`` / ``unknown key`` / ``altered checkpoint`` (a
    checkpoint, stored or in the file, cannot be trusted; the message says which copy; its
    heads are then not compared), ``deleted checkpoint`` (a gap or broken link in the stored
    series, or a file's checkpoint missing from the database), and against the heads:
    ``deleted chain`` (no event left for an intent), ``deleted tail`` (the chain ends before
    the checkpointed seq), ``deleted event`` (the checkpointed event is gone but later ones
    exist), ``recomputed chain`` (the event at the checkpointed seq has another hash),
    ``truncation`` (every checkpointed chain is gone; it replaces the per-chain ``deleted
    chain`` findings).

    Raises:
        CheckpointError: ``checkpoint_file`` cannot be read, or a line of it is malformed
            (``checkpoints.checkpoint_file_read``).
    """
    report = CheckpointReport(
        checkpoint=None, source="database", live_events=AuditEvent.objects.count(), limit=limit
    )
    _verify_series(report, public_key)
    checkpoint: SignedCheckpoint | None
    if checkpoint_file is None:
        checkpoint = checkpoint_latest()
        trusted = checkpoint is not None and _checkpoint_trusted(report, checkpoint, public_key)
    else:
        report.source = "file"
        checkpoint, trusted = _compare_file(report, checkpoint_file, public_key)
    report.checkpoint = checkpoint
    if checkpoint is not None and trusted:
        _compare_heads(report, checkpoint)
    return report


def _verify_series(report: CheckpointReport, public_key: Ed25519PublicKey) -> None:
    """Every stored checkpoint: signed by ``public_key``, numbered 1, 2, 3... and linked."""
    expected_id, expected_number, expected_prev = key_id(public_key), 1, GENESIS
    for row in AuditCheckpoint.objects.defer("heads").order_by("number").iterator(chunk_size=500):
        statement = checkpoint_statement(row)  # heads deferred: never read here
        message = canonical_json(statement)
        gap = restored_gap(row.accepted)
        if row.number != expected_number and gap == (expected_number - 1, row.number - 1):
            # A recovery's re-baseline after the database went back in time: the missing
            # numbers are in the checkpoint file, and the link is to the file's checkpoint
            # (checked with --checkpoint-file).
            pass
        elif row.number != expected_number:
            report.add(
                CheckpointFault(
                    DELETED_CHECKPOINT,
                    f"checkpoint #{row.number} follows #{expected_number - 1}: "
                    f"{row.number - expected_number} checkpoint(s) are missing",
                )
            )
        elif row.prev_hash != expected_prev:
            report.add(
                CheckpointFault(
                    ALTERED_CHECKPOINT, f"checkpoint #{row.number} does not link to the checkpoint before it"
                )
            )
        if row.key_id != expected_id:
            report.add(CheckpointFault(UNKNOWN_KEY, f"checkpoint #{row.number} names key {row.key_id[:16]}…"))
        elif not signature_valid(public_key, row.signature, message):
            report.add(
                CheckpointFault(
                    BAD_SIGNATURE, f"checkpoint #{row.number} as stored does not match its signature"
                )
            )
        if row.accepted is not None:
            report.accepted.append((row.number, row.accepted))
        expected_number, expected_prev = row.number + 1, sha256_hex(message)


def _compare_file(
    report: CheckpointReport, path: Path, public_key: Ed25519PublicKey
) -> tuple[SignedCheckpoint | None, bool]:
    """Every line of an outside copy against the database; returns the file's newest
    checkpoint (highest number, the last such line) and whether it can be trusted.

    Each line's own signature is checked first, so the copy at fault is the one named: a line
    that fails it was altered in the file. A line that holds is the truth the database must
    match: the database's checkpoint of that number must exist (else ``deleted checkpoint``)
    and be identical (else ``altered checkpoint``: edited in place when its own signature
    fails, which the series check also reports, or replaced by another signed checkpoint of
    the same number when it holds, which is what deleting checkpoint rows and letting the
    next ones be signed leaves). The heads, which the signature covers only through the root,
    are compared by digest; when they differ, the copy whose heads miss the signed root is
    named. Memory: one batch of ``FILE_BATCH`` lines, and the newest line.
    """
    newest: SignedCheckpoint | None = None
    newest_trusted = False
    only_in_file = _restored_gaps()
    lines = checkpoint_file_read(path)
    while batch := list(islice(lines, FILE_BATCH)):
        report.file_lines += len(batch)
        rows = {
            row.number: row
            for row in AuditCheckpoint.objects.defer("heads")
            .annotate(heads_sha256=Func(F("heads"), function="sha256", output_field=BinaryField()))
            .filter(number__in={checkpoint.number for _, checkpoint in batch})
        }
        for line, checkpoint in batch:
            trusted = _file_line_signed(report, line, checkpoint, public_key)
            row = rows.get(checkpoint.number)
            if trusted and row is None and any(low < checkpoint.number <= high for low, high in only_in_file):
                report.restored_lines += 1  # lost by a restore, re-baselined by a recovery
            elif trusted:
                _compare_with_stored(report, line, checkpoint, row, public_key)
            if newest is None or checkpoint.number >= newest.number:
                newest, newest_trusted = checkpoint, trusted
    if newest is not None and newest_trusted:
        newest_trusted = _checkpoint_trusted(report, newest, public_key)
    elif newest is not None:
        report.add(
            CheckpointFault(
                BAD_SIGNATURE,
                f"the file's checkpoint #{newest.number} cannot be trusted: its heads were not compared",
            )
        )
    return newest, newest_trusted


def _restored_gaps() -> list[tuple[int, int]]:
    """The checkpoint numbers recoveries recorded as lost by the database, as ``(database
    newest, file newest)`` ranges (``checkpoints.restored_gap``)."""
    rows = AuditCheckpoint.objects.filter(accepted__has_key="restored").values_list("accepted", flat=True)
    return [gap for gap in map(restored_gap, rows) if gap is not None]


def _file_line_signed(
    report: CheckpointReport, line: int, checkpoint: SignedCheckpoint, public_key: Ed25519PublicKey
) -> bool:
    """Whether a file line's statement is signed by ``public_key``; a fault naming the file
    when not."""
    where = f"the file's checkpoint #{checkpoint.number} (line {line})"
    if checkpoint.statement["key_id"] != key_id(public_key):
        report.add(CheckpointFault(UNKNOWN_KEY, f"{where} was not signed by this key"))
        return False
    if not signature_valid(public_key, checkpoint.signature, checkpoint.statement_bytes()):
        report.add(
            CheckpointFault(
                BAD_SIGNATURE, f"{where} does not match its signature: the file's copy was altered"
            )
        )
        return False
    return True


def _compare_with_stored(
    report: CheckpointReport,
    line: int,
    checkpoint: SignedCheckpoint,
    row: AuditCheckpoint | None,
    public_key: Ed25519PublicKey,
) -> None:
    """A correctly signed file line must be in the database, unchanged (see ``_compare_file``)."""
    number = checkpoint.number
    if row is None:
        latest = AuditCheckpoint.objects.order_by("-number").values_list("number", flat=True).first()
        report.add(
            CheckpointFault(
                DELETED_CHECKPOINT,
                f"the file's checkpoint #{number} is not in the database "
                f"(its newest is {f'#{latest}' if latest else 'none'})",
            )
        )
        return
    stored = checkpoint_statement(row)
    if (stored, row.signature) != (checkpoint.statement, checkpoint.signature):
        if signature_valid(public_key, row.signature, canonical_json(stored)):
            problem = (
                f"the database's checkpoint #{number} is another signed checkpoint than the file's "
                f"(line {line}): the database's series was replaced from #{number} on"
            )
        else:
            problem = (
                f"the database's checkpoint #{number} was altered: it differs from the file's signed copy"
            )
        report.add(CheckpointFault(ALTERED_CHECKPOINT, problem))
        return
    if bytes(row.heads_sha256) != hashlib.sha256(checkpoint.heads).digest():  # type: ignore[attr-defined]
        if _heads_match_root(checkpoint):
            problem = f"the database's checkpoint #{number} holds other heads than its signed root"
        else:
            problem = (
                f"the file's checkpoint #{number} (line {line}) holds heads that do not match its signed root"
            )
        report.add(CheckpointFault(ALTERED_CHECKPOINT, problem))


def _heads_match_root(checkpoint: SignedCheckpoint) -> bool:
    """Whether the checkpoint's heads are readable, in order, and hash to its signed root,
    chains and events."""
    try:
        heads = checkpoint.head_rows()
    except CheckpointError:
        return False
    tree = MerkleRoot()
    for intent_id, seq, head_hash in heads:
        tree.add(leaf_input(intent_id, seq, head_hash).encode("ascii"))
    ordered = all(left[0] < right[0] for left, right in zip(heads, heads[1:], strict=False))
    statement = checkpoint.statement
    return ordered and (tree.hexdigest(), tree.size, sum(h[1] for h in heads)) == (
        statement.get("root"),
        statement.get("chains"),
        statement.get("events"),
    )


def _checkpoint_trusted(
    report: CheckpointReport, checkpoint: SignedCheckpoint, public_key: Ed25519PublicKey
) -> bool:
    """Key, signature and heads of the checkpoint verified against (stored, or a file line
    whose signature was checked already); a fault when not. A stored checkpoint's bad
    signature is reported by the series check, so only the consequence is added here."""
    number = checkpoint.number
    untrusted = "its heads were not compared"
    if checkpoint.statement.get("key_id") != key_id(public_key):
        report.add(
            CheckpointFault(UNKNOWN_KEY, f"checkpoint #{number} was not signed by this key; {untrusted}")
        )
        return False
    if not signature_valid(public_key, checkpoint.signature, checkpoint.statement_bytes()):
        report.add(CheckpointFault(BAD_SIGNATURE, f"checkpoint #{number} cannot be trusted: {untrusted}"))
        return False
    if not _heads_match_root(checkpoint):
        report.add(
            CheckpointFault(
                ALTERED_CHECKPOINT, f"checkpoint #{number}'s heads do not match its signed root; {untrusted}"
            )
        )
        return False
    return True


def _live_heads(heads: list[tuple[str, int, str]]) -> Iterator[LiveHead]:
    """``(intent_id, checkpointed seq, checkpointed hash, live hash at that seq, live last seq)``,
    looked up in batches of ``FETCH_ROWS``."""
    for start in range(0, len(heads), FETCH_ROWS):
        batch = heads[start : start + FETCH_ROWS]
        expected = {intent_id: head_hash for intent_id, _, head_hash in batch}
        with connection.cursor() as cursor:
            cursor.execute(COMPARE_SQL, [[h[0] for h in batch], [h[1] for h in batch]])
            for intent_id, seq, live_hash, live_seq in cursor.fetchall():
                yield intent_id, seq, expected[intent_id], live_hash, live_seq


def _compare_heads(report: CheckpointReport, checkpoint: SignedCheckpoint) -> None:
    """Each checkpointed head against the live table (chains may have grown since)."""
    heads = checkpoint.head_rows()
    _report_heads(report, checkpoint, _live_heads(heads), len(heads))


def _report_heads(
    report: CheckpointReport, checkpoint: SignedCheckpoint, live: Iterable[LiveHead], total: int
) -> None:
    """Name what the live table lost of ``checkpoint``'s heads: ``live`` holds (at least) every
    head that is not intact, ``total`` is the checkpoint's number of heads."""
    number = checkpoint.number
    deleted_chains: list[CheckpointFault] = []
    for intent_id, seq, head_hash, live_hash, live_seq in live:
        if live_seq is None:
            deleted_chains.append(
                CheckpointFault(
                    DELETED_CHAIN,
                    f"intent {intent_id} has no events but checkpoint #{number} saw seq {seq}",
                    intent_id,
                )
            )
        elif live_hash is None and live_seq < seq:
            report.add(
                CheckpointFault(
                    DELETED_TAIL,
                    f"intent {intent_id} has seq {live_seq} but checkpoint #{number} saw seq {seq}",
                    intent_id,
                )
            )
        elif live_hash is None:
            report.add(
                CheckpointFault(
                    DELETED_EVENT,
                    f"intent {intent_id} lacks seq {seq}, which checkpoint #{number} saw",
                    intent_id,
                )
            )
        elif live_hash != head_hash:
            report.add(
                CheckpointFault(
                    RECOMPUTED_CHAIN,
                    f"intent {intent_id}'s event seq {seq} hashes to {live_hash[:12]}…, "
                    f"checkpoint #{number} saw {head_hash[:12]}…",
                    intent_id,
                )
            )
    if total and len(deleted_chains) == total:
        live_events = "" if report.live_events is None else f"holds {report.live_events} events; "
        report.faults.insert(
            0,
            CheckpointFault(
                TRUNCATION,
                f"the audit log {live_events}none of the {total} chains "
                f"({checkpoint.statement.get('events')} events) checkpoint #{number} saw remains",
            ),
        )
        return
    for fault in deleted_chains:
        report.add(fault)


class CheckpointSuccessor:
    """The check made before a new checkpoint is signed: the heads about to be signed must
    extend the previous checkpoint's (the same rules as ``checkpoint_verify``), and the
    previous checkpoint must be intact and signed by the signing key, so that a log altered
    past the triggers is never signed over (issue 11, review item 1).

    Cheap: the new heads stream past ``see`` in leaf order and are merge-joined in memory with
    the previous checkpoint's; a chain whose head is unchanged needs nothing more, one that
    shrank, vanished or changed its hash at the same seq is a fault at once, and only the
    chains that grew need a lookup (of the hash at the old seq), batched in ``finish``.

    Usage: ``successor = CheckpointSuccessor(previous, public_key)``, pass ``successor.see``
    as ``heads_read``'s ``observe``, then ``report = successor.finish()``.
    """

    def __init__(
        self, previous: SignedCheckpoint, public_key: Ed25519PublicKey, *, limit: int = 1000
    ) -> None:
        self.previous = previous
        self.report = CheckpointReport(checkpoint=previous, source="database", live_events=None, limit=limit)
        trusted = self._previous_signed(public_key) and _checkpoint_trusted(self.report, previous, public_key)
        self._heads = previous.head_rows() if trusted else []
        self._trusted = trusted
        self._next = 0
        self._changed: list[LiveHead] = []
        self._grown: list[tuple[str, int, str]] = []

    def _previous_signed(self, public_key: Ed25519PublicKey) -> bool:
        """The stored previous checkpoint's own signature (``_checkpoint_trusted`` words it as
        a consequence only, since the series check usually reports the cause)."""
        number = self.previous.number
        if self.previous.statement["key_id"] != key_id(public_key):
            return True  # ``_checkpoint_trusted`` names the unknown key
        if signature_valid(public_key, self.previous.signature, self.previous.statement_bytes()):
            return True
        self.report.add(
            CheckpointFault(BAD_SIGNATURE, f"checkpoint #{number} as stored does not match its signature")
        )
        self.report.add(CheckpointFault(BAD_SIGNATURE, f"checkpoint #{number} cannot be trusted"))
        return False

    def see(self, intent_id: str, seq: int, head_hash: str) -> None:
        """One head about to be signed (called in ascending ``intent_id`` order)."""
        heads = self._heads
        while self._next < len(heads) and heads[self._next][0] < intent_id:
            old_intent, old_seq, old_hash = heads[self._next]
            self._changed.append((old_intent, old_seq, old_hash, None, None))  # the chain is gone
            self._next += 1
        if self._next < len(heads) and heads[self._next][0] == intent_id:
            _, old_seq, old_hash = heads[self._next]
            self._next += 1
            if seq > old_seq:
                self._grown.append((intent_id, old_seq, old_hash))
            elif seq == old_seq and head_hash != old_hash:
                self._changed.append((intent_id, old_seq, old_hash, head_hash, seq))
            elif seq < old_seq:
                self._changed.append((intent_id, old_seq, old_hash, None, seq))

    def finish(self) -> CheckpointReport:
        """The faults found (``report.ok`` when the new heads may be signed)."""
        if self._trusted:
            for old_intent, old_seq, old_hash in self._heads[self._next :]:
                self._changed.append((old_intent, old_seq, old_hash, None, None))
            self._next = len(self._heads)
            _report_heads(
                self.report, self.previous, chain(self._changed, _live_heads(self._grown)), len(self._heads)
            )
        return self.report
