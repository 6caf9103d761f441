"""A signed checkpoint's heads compared: with its own signed root (``checkpoint_trusted``:
whether it can be trusted at all), with the live audit table (``compare_heads``: chains only grow,
so each checkpointed head must still be there), and with the heads about to be signed next
(``CheckpointSuccessor``, before ``operations.audit.signing`` signs a new checkpoint). What a
comparison finds is named in ``operations.audit.checkpoint_faults``.

Chains leave the live table on purpose when they are archived (issue 36): a checkpointed chain
with no live event is then looked up in the archive index (``ArchivedIntent``), the same rule in
all three comparisons, so neither ``verify_audit``, nor the signer, nor a recovery's re-baseline
takes an archived chain for a deleted one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.db import connection

from operations.audit.checkpoint_faults import (
    ALTERED_CHECKPOINT,
    BAD_SIGNATURE,
    DELETED_CHAIN,
    DELETED_EVENT,
    DELETED_TAIL,
    RECOMPUTED_CHAIN,
    TRUNCATION,
    UNKNOWN_KEY,
    CheckpointFault,
    CheckpointReport,
)
from operations.audit.checkpoints import FETCH_ROWS, CheckpointError, SignedCheckpoint, leaf_input
from operations.audit.keys import key_id, signature_valid
from operations.audit.merkle import MerkleRoot
from operations.models import ArchivedIntent

# For a batch of checkpointed heads: the live event at the head's seq, and the chain's last seq.
COMPARE_SQL = """
SELECT h.intent_id::text, h.seq, e.hash,
       (SELECT max(m.seq) FROM operations_auditevent m WHERE m.intent_id = h.intent_id)
FROM unnest(%s::uuid[], %s::integer[]) AS h(intent_id, seq)
LEFT JOIN operations_auditevent e ON e.intent_id = h.intent_id AND e.seq = h.seq
"""

# (intent_id, checkpointed seq, checkpointed hash, live hash at that seq, live last seq)
LiveHead = tuple[str, int, str, str | None, int | None]


def heads_match_root(checkpoint: SignedCheckpoint) -> bool:
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


def checkpoint_trusted(
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
    if not heads_match_root(checkpoint):
        report.add(
            CheckpointFault(
                ALTERED_CHECKPOINT, f"checkpoint #{number}'s heads do not match its signed root; {untrusted}"
            )
        )
        return False
    return True


def live_heads(heads: list[tuple[str, int, str]]) -> Iterator[LiveHead]:
    """``(intent_id, checkpointed seq, checkpointed hash, live hash at that seq, live last seq)``,
    looked up in batches of ``FETCH_ROWS``."""
    for start in range(0, len(heads), FETCH_ROWS):
        batch = heads[start : start + FETCH_ROWS]
        expected = {intent_id: head_hash for intent_id, _, head_hash in batch}
        with connection.cursor() as cursor:
            cursor.execute(COMPARE_SQL, [[h[0] for h in batch], [h[1] for h in batch]])
            for intent_id, seq, live_hash, live_seq in cursor.fetchall():
                yield intent_id, seq, expected[intent_id], live_hash, live_seq


def compare_heads(report: CheckpointReport, checkpoint: SignedCheckpoint) -> None:
    """Each checkpointed head against the live table (chains may have grown since)."""
    heads = checkpoint.head_rows()
    report_heads(report, checkpoint, live_heads(heads), len(heads))


def report_heads(
    report: CheckpointReport, checkpoint: SignedCheckpoint, live: Iterable[LiveHead], total: int
) -> None:
    """Name what the live table lost of ``checkpoint``'s heads: ``live`` holds (at least) every
    head that is not intact, ``total`` is the checkpoint's number of heads.

    A chain with no live event left is not lost when the archive index holds it as
    ``archived`` at the checkpointed head or past it (issue 36; ``_archived_or_deleted``): the
    archiver deletes a chain only in the transaction that marks it so, after the signed archive
    file holding it was written, and ``operations.archive.verification`` proves that file.
    """
    number = checkpoint.number
    deleted_chains: list[CheckpointFault] = []
    missing: list[tuple[str, int, str]] = []  # no live event: archived, or deleted
    for intent_id, seq, head_hash, live_hash, live_seq in live:
        if live_seq is None:
            missing.append((intent_id, seq, head_hash))
            if len(missing) >= FETCH_ROWS:
                deleted_chains += _archived_or_deleted(report, number, missing)
                missing = []
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
    deleted_chains += _archived_or_deleted(report, number, missing)
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


def _archived_or_deleted(
    report: CheckpointReport, number: int, missing: list[tuple[str, int, str]]
) -> list[CheckpointFault]:
    """The checkpointed heads ``(intent_id, seq, hash)`` of chains with no live event, looked up
    in the archive index (one query): each ``archived`` there at the same seq and hash, or at a
    later seq, is counted in ``report.archived`` (the later ones also listed in
    ``report.archived_later``, for the archive check to find the checkpointed event in the
    file). One archived at an earlier seq or another hash is a fault added to ``report``
    (``deleted tail`` / ``recomputed chain``, naming the file); the rest are returned as
    ``deleted chain`` faults (the caller decides whether they add up to a truncation)."""
    if not missing:
        return []
    index = {
        str(intent_id): (state, head_seq, head_hash, file_name)
        for intent_id, state, head_seq, head_hash, file_name in ArchivedIntent.objects.filter(
            intent_id__in=[intent_id for intent_id, _, _ in missing]
        ).values_list("intent_id", "state", "head_seq", "head_hash", "segment__file_name")
    }
    deleted: list[CheckpointFault] = []
    for intent_id, seq, head_hash in missing:
        state, archived_seq, archived_hash, file_name = index.get(intent_id, (None, 0, "", ""))
        if state != ArchivedIntent.State.ARCHIVED:
            unarchived = (
                f" (the archive index holds it as {state} in {file_name}: written, never deleted as archived)"
                if state
                else ""
            )
            deleted.append(
                CheckpointFault(
                    DELETED_CHAIN,
                    f"intent {intent_id} has no events but checkpoint #{number} saw seq {seq}{unarchived}",
                    intent_id,
                )
            )
        elif archived_seq > seq:
            report.archived += 1
            report.archived_later.append((intent_id, seq, head_hash))
        elif archived_seq == seq and archived_hash == head_hash:
            report.archived += 1
        elif archived_seq == seq:
            report.add(
                CheckpointFault(
                    RECOMPUTED_CHAIN,
                    f"intent {intent_id} was archived in {file_name} with seq {seq} hashing to "
                    f"{archived_hash[:12]}…, checkpoint #{number} saw {head_hash[:12]}…",
                    intent_id,
                )
            )
        else:
            report.add(
                CheckpointFault(
                    DELETED_TAIL,
                    f"intent {intent_id} was archived in {file_name} at seq {archived_seq} but checkpoint "
                    f"#{number} saw seq {seq}",
                    intent_id,
                )
            )
    return deleted


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
        trusted = self._previous_signed(public_key) and checkpoint_trusted(self.report, previous, public_key)
        self._heads = previous.head_rows() if trusted else []
        self._trusted = trusted
        self._next = 0
        self._changed: list[LiveHead] = []
        self._grown: list[tuple[str, int, str]] = []

    def _previous_signed(self, public_key: Ed25519PublicKey) -> bool:
        """The stored previous checkpoint's own signature (``checkpoint_trusted`` words it as
        a consequence only, since the series check usually reports the cause)."""
        number = self.previous.number
        if self.previous.statement["key_id"] != key_id(public_key):
            return True  # ``checkpoint_trusted`` names the unknown key
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
            report_heads(
                self.report, self.previous, chain(self._changed, live_heads(self._grown)), len(self._heads)
            )
        return self.report
