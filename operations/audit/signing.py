"""Signing a new audit checkpoint (``operations.audit.checkpoints`` is the format), after checking
that the log still holds what the previous checkpoint saw.

A checkpoint signed over a log someone altered past the triggers would make the alteration
invisible: ``verify_audit`` compares the live table with the newest checkpoint only. So before
signing, the heads about to be signed are compared with the previous checkpoint's, and the
previous checkpoint's signature and root are checked (``checkpoint_heads.
CheckpointSuccessor``); on any fault nothing is signed and ``CheckpointRefusedError`` names the
faults (issue 11, review item 1). The one way past is an operator's explicit re-baseline,
``accept_faults_reason``: the faults and the reason then go into the signed statement
(``accepted``), where every later ``verify_audit`` shows them.

Lives apart from ``operations.audit.checkpoints`` because it needs the verification, which needs the
format: format <- verification <- signing.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import connection, transaction

from operations.audit.checkpoint_faults import CheckpointFault
from operations.audit.checkpoint_file import checkpoint_file_path
from operations.audit.checkpoint_heads import CheckpointSuccessor
from operations.audit.checkpoint_sync import checkpoint_file_sync
from operations.audit.checkpoints import CheckpointError, SignedCheckpoint, checkpoint_statement, heads_read
from operations.audit.keys import AuditKeyError, key_id, signing_key_load, signing_key_path
from operations.audit.trail import GENESIS
from operations.idempotency import canonical_json
from operations.models import ArchiveSegment, AuditCheckpoint
from operations.restore.check import restore_detection

logger = logging.getLogger("operations.audit.checkpoints")

# pg_advisory_xact_lock key serialising checkpoint writers (never the event writers).
ADVISORY_LOCK_ID = 0x61756469_74636B70  # "auditckp"
# Faults listed in a refusal, or in a signed ``accepted`` (the rest are counted).
FAULTS_LISTED = 1000
# Faults named in a refusal's message (one log line); the command prints every listed fault.
FAULTS_IN_MESSAGE = 20


class CheckpointRefusedError(CheckpointError):
    """The log no longer holds what the previous checkpoint saw, or that checkpoint is not
    intact: nothing was signed. ``faults`` are the findings (text, at most ``FAULTS_LISTED``),
    ``omitted`` counts the rest, ``previous`` is the previous checkpoint's number."""

    def __init__(self, *, previous: int, faults: list[str], omitted: int) -> None:
        self.previous, self.faults, self.omitted = previous, faults, omitted
        shown = faults[:FAULTS_IN_MESSAGE]
        more = (
            f"; and {len(faults) + omitted - len(shown)} more" if len(faults) + omitted > len(shown) else ""
        )
        super().__init__(
            f"audit checkpoint refused: the audit log no longer holds what checkpoint #{previous} saw, or "
            f"that checkpoint was altered; {len(faults) + omitted} fault(s): " + "; ".join(shown) + more
        )


class CheckpointUnpublishedError(CheckpointError):
    """The checkpoint is stored and signed, but the checkpoint file could not be written."""


class DatabaseBehindError(CheckpointError):
    """The database is behind the checkpoint file (``operations.restore.check``): signing on
    from its older state would fork the series (``manage.py recover`` re-baselines instead); or
    the file is another ledger's, which this database must not write into."""


def audit_checkpoint_create(
    *,
    only_if_changed: bool = False,
    accept_faults_reason: str | None = None,
    restored_after: SignedCheckpoint | None = None,
) -> AuditCheckpoint | None:
    """Check the log against the previous checkpoint, then record, sign, store and publish a
    checkpoint of every chain's head.

    Call outside any transaction: the row is committed before the checkpoint is written out
    (logged, and appended to ``AUDIT_CHECKPOINT_FILE``), so the file never holds a checkpoint
    the database lost by a rollback. Checkpoint writers are serialised by a transaction-level
    advisory lock; event writers are never blocked (the heads are one plain read). The
    checkpoint's ``created_at`` is the database's ``statement_timestamp()``, like the events'
    (``operations.audit.trail._chain_head``): a host whose clock is off does not date it.

    Args:
        only_if_changed: return None without a new checkpoint when the heads equal the latest
            checkpoint's (the beat's way of not storing one every period while idle).
        accept_faults_reason: sign even though the check against the previous checkpoint
            found faults (a deliberate re-baseline, ``audit_checkpoint --accept-faults``); the
            faults and this reason (non-blank) are recorded in the signed statement as
            ``accepted``. Without faults the checkpoint is an ordinary one.
        restored_after: the checkpoint file's newest checkpoint, which the database lost (a
            restore or a failover; only ``recover`` passes it, with a reason). The new
            checkpoint follows it — number, ``prev_hash`` and the heads compared with its
            heads — so the file's series goes on unbroken, and ``accepted.restored`` records
            which numbers exist only in the file (``checkpoints.restored_gap``).

    Returns:
        The stored row, or None (``only_if_changed`` and nothing changed).

    Raises:
        operations.audit.keys.AuditKeyError: no usable signing key (nothing is stored).
        CheckpointRefusedError: the log or the previous checkpoint was altered (nothing is
            stored; see the module docstring).
        DatabaseBehindError: the database is behind the checkpoint file and no
            ``restored_after`` was given (nothing is stored).
        CheckpointUnpublishedError: stored, but the checkpoint file could not be written.
        ValueError: ``accept_faults_reason`` is blank or holds characters that are not printable.
    """
    if restored_after is not None and accept_faults_reason is None:
        raise ValueError("a re-baseline after a restore needs a reason")
    if accept_faults_reason is not None and not accept_faults_reason.strip():
        raise ValueError("a re-baseline needs a reason")
    if accept_faults_reason is not None and not accept_faults_reason.isprintable():
        # it is printed by every later verify_audit: a control character could hide the lines
        raise ValueError("a re-baseline reason must be printable text (no control characters or line breaks)")
    # A key is created (where configured) only for the first checkpoint: a key file missing
    # once checkpoints exist was lost or removed, and a fresh key would sign on as if nothing
    # happened.
    if restored_after is None:
        detection = restore_detection()
        if detection.state == "behind":
            raise DatabaseBehindError(f"audit checkpoint refused: {detection.reason}; run manage.py recover")
        if detection.state == "foreign":
            raise DatabaseBehindError(f"audit checkpoint refused: {detection.reason}")
    private_key, signer_id = current_signing_key()
    try:
        row = _sign_locked(only_if_changed, accept_faults_reason, restored_after, private_key, signer_id)
    except _Unchanged:
        # Nothing to sign, but this host's file may lack checkpoints another host signed.
        checkpoint_file_catch_up()
        return None
    checkpoint_publish(SignedCheckpoint.from_row(row))
    return row


def current_signing_key() -> tuple[Any, str]:
    """The audit signing key that may sign the next checkpoint or archive manifest, and its key
    id. It is created (where configured) only while nothing was signed yet: a key file missing
    once checkpoints or archive segments exist was lost or removed, and a fresh key would sign on
    as if nothing happened; and it must be the key that signed the newest checkpoint and the
    newest archive segment.

    Raises:
        operations.audit.keys.AuditKeyError: no usable key, or another key than the one that
            signed so far (nothing is signed).
    """
    newest_checkpoint = AuditCheckpoint.objects.order_by("-number").values_list("key_id", flat=True).first()
    newest_segment = ArchiveSegment.objects.order_by("-number").values_list("manifest", flat=True).first()
    signed_so_far = {
        "checkpoint": newest_checkpoint,
        "archive segment": newest_segment.get("key_id") if isinstance(newest_segment, dict) else None,
    }
    first = newest_checkpoint is None and newest_segment is None
    private_key = signing_key_load(create=None if first else False)
    signer_id = key_id(private_key.public_key())
    for what, newest_key in signed_so_far.items():
        if newest_key is not None and newest_key != signer_id:
            raise AuditKeyError(
                f"the signing key at {signing_key_path()} (key id {signer_id[:16]}) is not the key that signed the "
                f"newest {what} (key id {str(newest_key)[:16]}): the key file was replaced or the wrong one is "
                "configured. Restore the original key; nothing was signed (key rotation is not supported yet)"
            )
    return private_key, signer_id


class _Unchanged(Exception):
    """The heads equal the latest checkpoint's (``only_if_changed``)."""


def _sign_locked(
    only_if_changed: bool,
    accept_faults_reason: str | None,
    restored_after: SignedCheckpoint | None,
    private_key: Any,
    signer_id: str,
) -> AuditCheckpoint:
    """Number, sign and store the next checkpoint in one transaction under the checkpoint
    writers' transaction-level advisory lock, so two writers never take the same number or
    sign on from the same previous one (the unique ``number`` is the last guard)."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s), statement_timestamp()", [ADVISORY_LOCK_ID])
            (_, now) = cursor.fetchone()
        stored = AuditCheckpoint.objects.order_by("-number").first()
        previous = restored_after or (SignedCheckpoint.from_row(stored) if stored else None)
        successor = (
            CheckpointSuccessor(previous, private_key.public_key(), limit=FAULTS_LISTED) if previous else None
        )
        tree, events, heads = heads_read(observe=successor.see if successor else None)
        root = tree.hexdigest()
        if (
            only_if_changed
            and restored_after is None
            and previous is not None
            and (previous.statement["root"], previous.statement["chains"]) == (root, tree.size)
        ):
            raise _Unchanged  # leaves the (read-only) transaction; caught below
        accepted = _accepted_faults(successor, accept_faults_reason) if successor else None
        if restored_after is not None:
            accepted = {
                **(accepted or {"faults": [], "omitted": 0, "reason": accept_faults_reason}),
                "restored": {
                    "database_newest": stored.number if stored else 0,
                    "file_newest": restored_after.number,
                },
            }
        row = AuditCheckpoint(
            number=previous.number + 1 if previous else 1,
            created_at=now,
            chains=tree.size,
            events=events,
            root=root,
            prev_hash=previous.statement_hash() if previous else GENESIS,
            key_id=signer_id,
            heads=heads,
            accepted=accepted,
        )
        row.signature = private_key.sign(canonical_json(checkpoint_statement(row))).hex()
        row.save(force_insert=True)
    return row


def checkpoint_file_catch_up() -> None:
    """Bring this host's checkpoint file up to the stored series (``checkpoint_file_sync``),
    its failure logged, never raised (the next period tries again)."""
    try:
        appended = checkpoint_file_sync()
    except CheckpointError as exc:
        logger.error("the checkpoint file was not brought up to date: %s", exc)
        return
    if appended:
        logger.info("checkpoint file caught up", extra={"appended": appended})


def _accepted_faults(successor: CheckpointSuccessor, reason: str | None) -> dict[str, Any] | None:
    """The ``accepted`` record of a re-baseline (None when the check found nothing).

    Raises:
        CheckpointRefusedError: faults, and no ``reason`` to accept them with.
    """
    report = successor.finish()
    if report.ok:
        return None
    faults: list[CheckpointFault] = report.faults
    if reason is None:
        raise CheckpointRefusedError(
            previous=successor.previous.number, faults=[str(f) for f in faults], omitted=report.omitted
        )
    logger.warning(
        "audit checkpoint signed over %d acknowledged fault(s) of checkpoint #%d: %s",
        len(faults) + report.omitted,
        successor.previous.number,
        reason,
    )
    return {"faults": [str(f) for f in faults], "omitted": report.omitted, "reason": reason}


def checkpoint_publish(checkpoint: SignedCheckpoint) -> None:
    """Write ``checkpoint`` outward: one JSON log line (logger ``operations.audit.checkpoints``, the
    statement and signature, without the heads) and one line appended to
    ``AUDIT_CHECKPOINT_FILE`` (with the heads), flushed and fsynced — after every stored
    checkpoint the file lacked, so each host's file holds the whole series
    (``operations.audit.checkpoint_sync``; issue 35).

    Raises:
        CheckpointError: the file cannot be written (the error is logged too).
    """
    logger.info(
        "audit checkpoint signed",
        extra={"audit_checkpoint": checkpoint.statement, "signature": checkpoint.signature},
    )
    path = checkpoint_file_path()
    try:
        checkpoint_file_sync(path)
    except CheckpointError as exc:
        message = f"audit checkpoint #{checkpoint.number} is stored but was not written to {path}: {exc}"
        logger.error(message)
        raise CheckpointUnpublishedError(message) from exc
