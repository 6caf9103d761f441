"""Verifying the audit log against a signed checkpoint (``operations.audit.checkpoints``).

A checkpoint's heads say, for every intent, the seq and hash its chain had reached. Chains only
grow, so the live table must still hold, for each head, an event at that seq with that hash;
events written since are fine (the next checkpoint covers them). What does not hold is named:
see ``checkpoint_verify``. The stored series of checkpoints is checked too (signatures, gap-free
numbers, ``prev_hash`` links), and an outside copy (the checkpoint file kept by an auditor) can
be verified against instead: every line of it must be in the database unchanged, and the live
heads are compared with its newest line, which is what defeats someone who deletes checkpoint
rows, or deletes them and lets new ones be signed in their place.

The heads themselves are compared in ``operations.audit.checkpoint_heads``, whose
``CheckpointSuccessor`` is the same comparison made before a new checkpoint is signed
(``operations.audit.signing``): cheap, since the new heads are at hand. The faults' names and
the report are ``operations.audit.checkpoint_faults``.
"""

from __future__ import annotations

import hashlib
from itertools import islice
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.db.models import BinaryField, F, Func

from operations.audit.checkpoint_faults import (
    ALTERED_CHECKPOINT,
    BAD_SIGNATURE,
    DELETED_CHECKPOINT,
    UNKNOWN_KEY,
    CheckpointFault,
    CheckpointReport,
)
from operations.audit.checkpoint_file import checkpoint_file_read
from operations.audit.checkpoint_heads import checkpoint_trusted, compare_heads, heads_match_root
from operations.audit.checkpoints import (
    SignedCheckpoint,
    checkpoint_latest,
    checkpoint_statement,
    restored_gap,
)
from operations.audit.keys import key_id, signature_valid
from operations.audit.trail import GENESIS
from operations.idempotency import canonical_json, sha256_hex
from operations.models import AuditCheckpoint, AuditEvent

# File lines compared with the database per query.
FILE_BATCH = 200


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
    ``deleted chain`` (no event left for an intent, and the archive index does not hold it as
    archived: an archived chain is counted in ``report.archived`` instead, see
    ``checkpoint_heads.report_heads``), ``deleted tail`` (the chain ends before
    the checkpointed seq), ``deleted event`` (the checkpointed event is gone but later ones
    exist), ``recomputed chain`` (the event at the checkpointed seq has another hash),
    ``truncation`` (every checkpointed chain is gone; it replaces the per-chain ``deleted
    chain`` findings).

    Raises:
        CheckpointError: ``checkpoint_file`` cannot be read, or a line of it is malformed
            (``checkpoint_file.checkpoint_file_read``).
    """
    report = CheckpointReport(
        checkpoint=None, source="database", live_events=AuditEvent.objects.count(), limit=limit
    )
    _verify_series(report, public_key)
    checkpoint: SignedCheckpoint | None
    if checkpoint_file is None:
        checkpoint = checkpoint_latest()
        trusted = checkpoint is not None and checkpoint_trusted(report, checkpoint, public_key)
    else:
        report.source = "file"
        checkpoint, trusted = _compare_file(report, checkpoint_file, public_key)
    report.checkpoint = checkpoint
    if checkpoint is not None and trusted:
        compare_heads(report, checkpoint)
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
        newest_trusted = checkpoint_trusted(report, newest, public_key)
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
        if heads_match_root(checkpoint):
            problem = f"the database's checkpoint #{number} holds other heads than its signed root"
        else:
            problem = (
                f"the file's checkpoint #{number} (line {line}) holds heads that do not match its signed root"
            )
        report.add(CheckpointFault(ALTERED_CHECKPOINT, problem))
