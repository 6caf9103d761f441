"""Verifying the audit log against a signed checkpoint (``operations.checkpoints``).

A checkpoint's heads say, for every intent, the seq and hash its chain had reached. Chains only
grow, so the live table must still hold, for each head, an event at that seq with that hash;
events written since are fine (the next checkpoint covers them). What does not hold is named:
see ``checkpoint_verify``. The stored series of checkpoints is checked too (signatures, gap-free
numbers, ``prev_hash`` links), and an outside copy (the last line of the checkpoint file kept
by an auditor) can be verified against instead of the newest stored checkpoint, which is what
defeats someone who deletes checkpoint rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.db import connection

from operations.audit import GENESIS
from operations.audit_keys import key_id, signature_valid
from operations.checkpoints import (
    FETCH_ROWS,
    CheckpointError,
    SignedCheckpoint,
    checkpoint_latest,
    checkpoint_statement,
    leaf_input,
)
from operations.idempotency import canonical_json, sha256_hex
from operations.merkle import MerkleRoot
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
    and the live table's event count."""

    checkpoint: SignedCheckpoint | None
    source: str
    live_events: int
    faults: list[CheckpointFault] = field(default_factory=list)
    omitted: int = 0
    limit: int = 1000

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
    *, public_key: Ed25519PublicKey, checkpoint: SignedCheckpoint | None = None, limit: int = 1000
) -> CheckpointReport:
    """Verify the live audit table against a checkpoint, and the stored series of checkpoints.

    Args:
        public_key: the key checkpoints must be signed with (``audit_keys.public_key_load``).
        checkpoint: an outside copy (``checkpoint_from_file``); None uses the newest stored one.
        limit: faults listed at most (the rest are counted in ``omitted``).

    Findings, by name: ``bad signature`` / ``unknown key`` / ``altered checkpoint`` (the
    checkpoint itself cannot be trusted; its heads are then not compared), ``deleted
    checkpoint`` (a gap or broken link in the stored series, or the outside copy's checkpoint
    missing from the database), and against the heads: ``deleted chain`` (no event left for an
    intent), ``deleted tail`` (the chain ends before the checkpointed seq), ``deleted event``
    (the checkpointed event is gone but later ones exist), ``recomputed chain`` (the event at
    the checkpointed seq has another hash), ``truncation`` (every checkpointed chain is gone;
    it replaces the per-chain ``deleted chain`` findings).
    """
    report = CheckpointReport(
        checkpoint=None, source="database", live_events=AuditEvent.objects.count(), limit=limit
    )
    _verify_series(report, public_key)
    if checkpoint is None:
        checkpoint = checkpoint_latest()
    else:
        report.source = "file"
        _compare_with_stored(report, checkpoint)
    report.checkpoint = checkpoint
    if checkpoint is not None and _checkpoint_trusted(report, checkpoint, public_key):
        _compare_heads(report, checkpoint)
    return report


def _verify_series(report: CheckpointReport, public_key: Ed25519PublicKey) -> None:
    """Every stored checkpoint: signed by ``public_key``, numbered 1, 2, 3... and linked."""
    expected_id, expected_number, expected_prev = key_id(public_key), 1, GENESIS
    for row in AuditCheckpoint.objects.defer("heads").order_by("number").iterator(chunk_size=500):
        statement = checkpoint_statement(row)  # heads deferred: never read here
        message = canonical_json(statement)
        if row.number != expected_number:
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
        expected_number, expected_prev = row.number + 1, sha256_hex(message)


def _compare_with_stored(report: CheckpointReport, checkpoint: SignedCheckpoint) -> None:
    """An outside copy must also be in the database, unchanged."""
    row = AuditCheckpoint.objects.filter(number=checkpoint.number).first()
    if row is None:
        latest = AuditCheckpoint.objects.order_by("-number").values_list("number", flat=True).first()
        report.add(
            CheckpointFault(
                DELETED_CHECKPOINT,
                f"the file's checkpoint #{checkpoint.number} is not in the database "
                f"(its newest is {f'#{latest}' if latest else 'none'})",
            )
        )
        return
    stored = SignedCheckpoint.from_row(row)
    if (stored.statement, stored.signature, stored.heads) != (
        checkpoint.statement,
        checkpoint.signature,
        checkpoint.heads,
    ):
        report.add(
            CheckpointFault(
                ALTERED_CHECKPOINT,
                f"checkpoint #{checkpoint.number} in the database differs from the file's copy",
            )
        )


def _checkpoint_trusted(
    report: CheckpointReport, checkpoint: SignedCheckpoint, public_key: Ed25519PublicKey
) -> bool:
    """Signature, key and heads of the checkpoint verified against; a fault when not."""
    number = checkpoint.number
    untrusted = "its heads were not compared"
    if checkpoint.statement.get("key_id") != key_id(public_key):
        report.add(
            CheckpointFault(UNKNOWN_KEY, f"checkpoint #{number} was not signed by this key; {untrusted}")
        )
        return False
    if not signature_valid(public_key, checkpoint.signature, checkpoint.statement_bytes()):
        if report.source == "file":  # a stored one was reported by the series check already
            report.add(
                CheckpointFault(
                    BAD_SIGNATURE, f"the file's checkpoint #{number} does not match its signature"
                )
            )
        report.add(CheckpointFault(BAD_SIGNATURE, f"checkpoint #{number} cannot be trusted: {untrusted}"))
        return False
    try:
        heads = checkpoint.head_rows()
    except CheckpointError as exc:
        report.add(CheckpointFault(ALTERED_CHECKPOINT, f"{exc}; {untrusted}"))
        return False
    tree = MerkleRoot()
    for intent_id, seq, head_hash in heads:
        tree.add(leaf_input(intent_id, seq, head_hash).encode("ascii"))
    ordered = all(left[0] < right[0] for left, right in zip(heads, heads[1:], strict=False))
    statement = checkpoint.statement
    if not ordered or (tree.hexdigest(), tree.size, sum(h[1] for h in heads)) != (
        statement.get("root"),
        statement.get("chains"),
        statement.get("events"),
    ):
        report.add(
            CheckpointFault(
                ALTERED_CHECKPOINT, f"checkpoint #{number}'s heads do not match its signed root; {untrusted}"
            )
        )
        return False
    return True


def _live_heads(heads: list[tuple[str, int, str]]) -> Iterator[tuple[str, int, str, str | None, int | None]]:
    """``(intent_id, checkpointed seq, checkpointed hash, live hash at that seq, live last seq)``."""
    for start in range(0, len(heads), FETCH_ROWS):
        batch = heads[start : start + FETCH_ROWS]
        expected = {intent_id: head_hash for intent_id, _, head_hash in batch}
        with connection.cursor() as cursor:
            cursor.execute(COMPARE_SQL, [[h[0] for h in batch], [h[1] for h in batch]])
            for intent_id, seq, live_hash, live_seq in cursor.fetchall():
                yield intent_id, seq, expected[intent_id], live_hash, live_seq


def _compare_heads(report: CheckpointReport, checkpoint: SignedCheckpoint) -> None:
    """Each checkpointed head against the live table (chains may have grown since)."""
    number = checkpoint.number
    heads = checkpoint.head_rows()
    deleted_chains: list[CheckpointFault] = []
    for intent_id, seq, head_hash, live_hash, live_seq in _live_heads(heads):
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
    if heads and len(deleted_chains) == len(heads):
        report.faults.insert(
            0,
            CheckpointFault(
                TRUNCATION,
                f"the audit log holds {report.live_events} events; none of the {len(heads)} chains "
                f"({checkpoint.statement.get('events')} events) checkpoint #{number} saw remains",
            ),
        )
        return
    for fault in deleted_chains:
        report.add(fault)
