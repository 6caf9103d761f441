"""Has the ledger's database gone back in time? The check made on every worker's start, every
``RESTORE_CHECK_PERIOD_SECONDS`` by the beat, and before any audit checkpoint is signed
(issue 22, "Survive a failover or a restore").

The database cannot tell by itself: a restored backup, or a replica promoted after it lagged,
is a consistent database that simply forgot its last minutes. What it cannot forget is what was
written outside it: every signed audit checkpoint is appended to ``AUDIT_CHECKPOINT_FILE``
(``operations.checkpoint_signing.checkpoint_publish``), so the file's newest checkpoint is a
high-water mark. A database whose newest stored checkpoint is older than the file's — or that
holds another checkpoint of the same number — is behind.

What this cannot see: a rollback to a point after the newest checkpoint (by default written
every ``AUDIT_CHECKPOINT_PERIOD_SECONDS`` = 300 s while anything changed). ``manage.py recover
--since`` is the operator's tool for that case (README, "Failover and restore").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from operations.audit_keys import AuditKeyError, public_key_load, signature_valid
from operations.checkpoints import (
    CheckpointError,
    SignedCheckpoint,
    checkpoint_file_newest,
    checkpoint_file_path,
)
from operations.models import AuditCheckpoint

logger = logging.getLogger("operations.restore")


@dataclass(frozen=True)
class Behind:
    """The database is behind the checkpoint file.

    Attributes:
        file_checkpoint: the file's newest checkpoint (signature checked when a key is at hand).
        database_newest: the number of the newest checkpoint the database holds (0: none).
        reason: one sentence for operators, the log and the pause.
    """

    file_checkpoint: SignedCheckpoint
    database_newest: int
    reason: str


def database_behind() -> Behind | None:
    """Compare the database's newest audit checkpoint with the checkpoint file's newest line.

    Returns:
        ``Behind`` when the database lacks the file's newest checkpoint (its own newest is
        older) or holds another checkpoint of that number; None when it is level or ahead,
        when there is no file yet, or when the file's newest line cannot be trusted (a bad
        signature or an unreadable line is logged as an error: the file, not the database,
        is then in question, and ``verify_audit`` names it).
    """
    path = checkpoint_file_path()
    try:
        newest = checkpoint_file_newest(path)
    except CheckpointError as exc:
        logger.error("restore check skipped: %s", exc)
        return None
    if newest is None:
        return None
    try:
        public_key = public_key_load()
    except AuditKeyError:
        public_key = None  # no key here: the line's shape was checked, its signature cannot be
    if public_key is not None and not signature_valid(public_key, newest.signature, newest.statement_bytes()):
        logger.error(
            "restore check skipped: the newest line of %s does not match its signature (checkpoint #%d)",
            path,
            newest.number,
        )
        return None
    stored = (
        AuditCheckpoint.objects.filter(number__gte=newest.number)
        .order_by("number")
        .values_list("number", "signature")
        .first()
    )
    database_newest = (
        AuditCheckpoint.objects.order_by("-number").values_list("number", flat=True).first() or 0
    )
    if stored is None:
        return Behind(
            file_checkpoint=newest,
            database_newest=database_newest,
            reason=(
                f"the database's newest audit checkpoint is #{database_newest} but the checkpoint file "
                f"{path} holds #{newest.number} (signed {newest.statement['created_at']}): the database "
                "went back in time (restored from a backup, or a replica that lagged was promoted)"
            ),
        )
    number, signature = stored
    if number == newest.number and signature != newest.signature:
        return Behind(
            file_checkpoint=newest,
            database_newest=database_newest,
            reason=(
                f"the database holds another checkpoint #{number} than the checkpoint file {path}: it went "
                "back in time and signed on from an older state"
            ),
        )
    return None
