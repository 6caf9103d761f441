"""Has the ledger's database gone back in time? The check made on every worker's start, every
``RESTORE_CHECK_PERIOD_SECONDS`` by the beat, and before any audit checkpoint is signed
(issue 22, "Survive a failover or a restore").

The database cannot tell by itself: a restored backup, or a replica promoted after it lagged,
is a consistent database that simply forgot its last minutes. What it cannot forget is what was
written outside it: every signed audit checkpoint is appended to ``AUDIT_CHECKPOINT_FILE``
(``operations.audit.signing.checkpoint_publish``), so the file's newest checkpoint is a
high-water mark. With several hosts each has its own file, and each file catches up with every
stored checkpoint before it takes a new one (``operations.audit.checkpoint_sync``, issue 35): a
host's file that lags the database (another host signed the newest) is ``level`` here, and
after its next catch-up holds the whole series again. A database whose newest stored checkpoint is older than the file's — or that
holds another checkpoint of the same number — is behind.

What this cannot see: a rollback to a point after the newest checkpoint (by default written
every ``AUDIT_CHECKPOINT_PERIOD_SECONDS`` = 300 s while anything changed), and a rollback to
before the first checkpoint (a database without checkpoints looks like a new one). A missing
or unreadable file makes the check ``blind``, and a file of another ledger ``foreign``: both
are logged on every check, shown on the dashboard, and the beat signs no checkpoint into a
foreign file. ``manage.py recover
--since`` is the operator's tool for that case (docs/explanation/failover.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from operations.audit.checkpoint_file import FileEnds, checkpoint_file_ends, checkpoint_file_path
from operations.audit.checkpoints import CheckpointError, checkpoint_statement
from operations.audit.keys import AuditKeyError, key_id, public_key_load, signature_valid
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


@dataclass(frozen=True)
class Detection:
    """What the restore check can say now.

    Attributes:
        state: ``level`` (the database has the file's newest checkpoint, or is ahead; or there
            is nothing to compare yet), ``behind`` (see ``Behind``), ``blind`` (the check cannot
            run: the file is missing while the database has checkpoints, or its ends are
            unreadable or not signed by our key), or ``foreign`` (the file's first checkpoint is
            not this database's: another ledger's file, or a database created afresh).
        reason: one sentence for operators ('' when level).
        behind: set when ``state`` is ``behind``.
    """

    state: str
    reason: str = ""
    behind: Behind | None = None


def restore_detection() -> Detection:
    """Compare the database's audit checkpoints with the checkpoint file's ends (a few
    kilobytes read, whatever the file's size: ``checkpoint_file.checkpoint_file_ends``).

    The file is this ledger's when the database holds the file's first checkpoint, unchanged
    (a file started afresh after it was lost begins at a later number, which works too). It
    is then behind when it lacks the file's newest checkpoint (its own newest is older) or holds
    another checkpoint of that number. A database that lacks even the file's first checkpoint
    is behind when the file was signed with the key of the database's newest checkpoint.

    A database without any checkpoint is behind when the file's newest line is signed by this
    ledger's key (restored to before its first checkpoint, or created afresh beside an old file:
    fail closed, a recovery continues the file's series), else ``level``.
    """
    path = checkpoint_file_path()
    stored_count = AuditCheckpoint.objects.count()
    try:
        ends = checkpoint_file_ends(path)
    except CheckpointError as exc:
        return Detection("blind", f"the restore check cannot read the checkpoint file: {exc}")
    if ends is None:
        if stored_count:
            return Detection(
                "blind",
                f"the checkpoint file {path} is missing or empty but the database holds {stored_count} "
                "checkpoint(s): a restore or failover cannot be detected until the next checkpoint starts a "
                "new file; put the file back, and run manage.py recover --since after any restore",
            )
        return Detection("level")
    first_number, number = int(ends.first["number"]), int(ends.newest["number"])
    if not stored_count:
        return _without_checkpoints(path, ends, number)
    stored = {
        row.number: row
        for row in AuditCheckpoint.objects.defer("heads").filter(number__in={first_number, number})
    }
    newest_row = AuditCheckpoint.objects.defer("heads").order_by("-number").first()
    assert newest_row is not None  # stored_count > 0
    first = stored.get(first_number)
    public_key = _public_key()
    if (
        first is not None
        and public_key is not None
        and not signature_valid(public_key, first.signature, canonical_json(checkpoint_statement(first)))
    ):
        return Detection(
            "blind",
            f"this database's checkpoint #{first_number} does not match its signature (altered): "
            "manage.py verify_audit names it",
        )
    if first is not None and checkpoint_statement(first) != ends.first:
        return Detection(
            "foreign",
            f"the checkpoint file {path} begins with another checkpoint #{first_number} than this database's: "
            "it is another ledger's file (or the database was created afresh); configure a file of this "
            "ledger's own",
        )
    if first is None and ends.first.get("key_id") != newest_row.key_id:
        return Detection(
            "foreign",
            f"the checkpoint file {path} was signed with another key than this database's checkpoints",
        )
    if public_key is not None and not signature_valid(
        public_key, ends.newest_signature, canonical_json(ends.newest)
    ):
        return Detection(
            "blind", f"the newest line of {path} (checkpoint #{number}) does not match its signature"
        )
    same = stored.get(number)
    if same is not None and same.signature == ends.newest_signature:
        return Detection("level")
    if same is None and newest_row.number > number:
        return Detection("level")  # the database is ahead (a file write failed); verify_audit names it
    if same is None:
        reason = (
            f"the database's newest audit checkpoint is #{newest_row.number} but the checkpoint file {path} "
            f"holds #{number} (signed {ends.newest['created_at']}): the database went back in time "
            "(restored from a backup, or a replica that lagged was promoted)"
        )
    else:
        reason = (
            f"the database holds another checkpoint #{number} than the checkpoint file {path}: it went "
            "back in time and signed on from an older state"
        )
    behind = Behind(
        file_number=number,
        file_created_at=str(ends.newest["created_at"]),
        database_newest=newest_row.number,
        reason=reason,
    )
    return Detection("behind", reason, behind)


def _without_checkpoints(path: Any, ends: FileEnds, number: int) -> Detection:
    """A database without any checkpoint next to a file: a new database beside an old file, or
    one restored to before its first checkpoint. Behind (fail closed; a recovery continues the
    file's series) when the file's newest line is signed by this ledger's key; foreign when by
    another key; level when there is no key yet."""
    public_key = _public_key()
    if public_key is None:
        return Detection("level")  # no key yet (the first checkpoint creates it)
    if ends.newest.get("key_id") != key_id(public_key):
        return Detection(
            "foreign", f"the checkpoint file {path} was signed with another key than this ledger's"
        )
    if not signature_valid(public_key, ends.newest_signature, canonical_json(ends.newest)):
        return Detection(
            "blind", f"the newest line of {path} (checkpoint #{number}) does not match its signature"
        )
    reason = (
        f"the database holds no audit checkpoint but the checkpoint file {path} holds #{number} (signed "
        f"{ends.newest['created_at']}) with this ledger's key: the database went back to before its first "
        "checkpoint, or was created afresh beside an old file"
    )
    behind = Behind(
        file_number=number, file_created_at=str(ends.newest["created_at"]), database_newest=0, reason=reason
    )
    return Detection("behind", reason, behind)


def _public_key() -> Any:
    try:
        return public_key_load()
    except AuditKeyError:
        return None  # no key here: the shape was checked, the signature cannot be


def database_behind() -> Behind | None:
    """``restore_detection`` for the callers that act only on ``behind``; a blind or foreign
    check is logged (error, warning) every time it runs, so it is never silent."""
    detection = restore_detection()
    if detection.state == "blind":
        logger.error("restore check blind: %s", detection.reason)
    elif detection.state == "foreign":
        logger.warning("restore check skipped: %s", detection.reason)
    return detection.behind
