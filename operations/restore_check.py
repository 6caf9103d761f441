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
every ``AUDIT_CHECKPOINT_PERIOD_SECONDS`` = 300 s while anything changed), and a rollback to
before the first checkpoint (a database without checkpoints looks like a new one). ``manage.py recover
--since`` is the operator's tool for that case (README, "Failover and restore").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from operations.audit_keys import AuditKeyError, public_key_load, signature_valid
from operations.checkpoints import (
    CheckpointError,
    checkpoint_file_ends,
    checkpoint_file_path,
    checkpoint_statement,
)
from operations.idempotency import canonical_json
from operations.models import AuditCheckpoint

logger = logging.getLogger("operations.restore")


@dataclass(frozen=True)
class Behind:
    """The database is behind the checkpoint file.

    Attributes:
        file_number: the number of the file's newest checkpoint.
        file_created_at: when it was signed (ISO 8601 text, as signed).
        database_newest: the number of the newest checkpoint the database holds (0: none).
        reason: one sentence for operators, the log and the pause.
    """

    file_number: int
    file_created_at: str
    database_newest: int
    reason: str


def database_behind() -> Behind | None:
    """Compare the database's audit checkpoints with the checkpoint file's ends (a few
    kilobytes read, whatever the file's size: ``checkpoints.checkpoint_file_ends``).

    Behind when the file's first checkpoint is the database's #1 (the same ledger's file) and
    the database lacks the file's newest checkpoint (its own newest is older) or holds another
    checkpoint of that number.

    Returns:
        ``Behind``, or None: level or ahead; no file yet; a file of another ledger (its first
        checkpoint is not the database's #1: a database created afresh, a test database; logged
        as a warning); a database without any checkpoint (it cannot be told from a new one;
        README: what this cannot see); or a file whose newest line cannot be trusted (a bad
        signature or an unreadable end: logged as an error, ``verify_audit`` names it).
    """
    path = checkpoint_file_path()
    try:
        ends = checkpoint_file_ends(path)
    except CheckpointError as exc:
        logger.error("restore check skipped: %s", exc)
        return None
    if ends is None:
        return None
    stored = {
        row.number: row
        for row in AuditCheckpoint.objects.defer("heads").filter(number__in={1, int(ends.newest["number"])})
    }
    first = stored.get(1)
    if first is None or checkpoint_statement(first) != ends.first:
        if AuditCheckpoint.objects.exists():
            logger.warning(
                "restore check skipped: %s begins with another checkpoint #1 than this database's "
                "(a file of another ledger, or the database was created afresh)",
                path,
            )
        return None
    try:
        public_key = public_key_load()
    except AuditKeyError:
        public_key = None  # no key here: the shape was checked, the signature cannot be
    number = int(ends.newest["number"])
    if public_key is not None and not signature_valid(
        public_key, ends.newest_signature, canonical_json(ends.newest)
    ):
        logger.error(
            "restore check skipped: the newest line of %s (checkpoint #%d) does not match its signature",
            path,
            number,
        )
        return None
    database_newest = (
        AuditCheckpoint.objects.order_by("-number").values_list("number", flat=True).first() or 0
    )
    same = stored.get(number)
    if same is not None and same.signature == ends.newest_signature:
        return None
    if same is None and database_newest > number:
        return None  # the database is ahead (a file write failed); verify_audit names the gap
    if same is None:
        reason = (
            f"the database's newest audit checkpoint is #{database_newest} but the checkpoint file {path} "
            f"holds #{number} (signed {ends.newest['created_at']}): the database went back in time "
            "(restored from a backup, or a replica that lagged was promoted)"
        )
    else:
        reason = (
            f"the database holds another checkpoint #{number} than the checkpoint file {path}: it went "
            "back in time and signed on from an older state"
        )
    return Behind(
        file_number=number,
        file_created_at=str(ends.newest["created_at"]),
        database_newest=database_newest,
        reason=reason,
    )
