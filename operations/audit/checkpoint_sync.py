"""Every host's checkpoint file holds the whole series (issue 35, C27).

With two or more hosts, each writes its own ``AUDIT_CHECKPOINT_FILE``, and a checkpoint is
signed by whichever worker the beat's task reached: on main the series was split between the
hosts' files (each verified alone, neither held the series). So a host never appends just its
own checkpoint: under an exclusive ``flock`` on the file (one writer per host at a time), it
appends, in order, every stored checkpoint newer than the file's newest line
(``checkpoint_file_sync``). Signing calls it after each commit, and so does the beat's
checkpoint task when nothing changed, so a host that signs nothing still catches up.

The file stays one hash-linked series: the first checkpoint appended must follow the file's
newest (``number + 1`` and ``prev_hash`` = its statement hash). That also holds after a
recovery (``recover`` signs the database's next checkpoint after the file's, which the
database lost). A file whose newest checkpoint the database's next one does not follow — the
database signed on from another state (a fork), or this host's file lacks checkpoints that only
another host's file holds (they were lost by a restore) — is not written: the error says so,
and ``verify_audit`` / the restore check name the fork.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path
from typing import BinaryIO

from operations.audit.checkpoint_file import (
    checkpoint_file_newest,
    checkpoint_file_path,
    checkpoint_file_read,
)
from operations.audit.checkpoints import CheckpointError, SignedCheckpoint
from operations.models import AuditCheckpoint

logger = logging.getLogger("operations.audit.checkpoints")

#: Stored checkpoints read per query while catching up.
SYNC_BATCH = 100


class CheckpointFileForkError(CheckpointError):
    """The database's next checkpoint does not follow the file's newest (see the module)."""


def _newest_whole(path: Path) -> SignedCheckpoint | None:
    """The file's newest readable checkpoint: its last line, or, when that line was cut short
    (a crash mid-write), the last line that parses (the whole file is read then; rare)."""
    try:
        return checkpoint_file_newest(path)
    except CheckpointError:
        newest = None
        try:
            with path.open("rb") as handle:
                for raw in handle:
                    try:
                        newest = SignedCheckpoint.from_line(raw.decode("utf-8"))
                    except (UnicodeDecodeError, CheckpointError):
                        continue
        except OSError as exc:
            raise CheckpointError(f"cannot read the checkpoint file {path}: {exc.strerror}") from exc
        return newest


def checkpoint_file_sync(path: Path | None = None) -> list[int]:
    """Append to the checkpoint file every stored checkpoint newer than its newest line, in
    order, each line flushed and fsynced; returns the numbers appended (none when the file is
    as new as the database, or newer: a database gone back in time, the restore check's case).

    Args:
        path: the file (default ``AUDIT_CHECKPOINT_FILE``); created with its folder if missing.

    Raises:
        CheckpointFileForkError: the database's next checkpoint does not follow the file's newest.
        CheckpointError: the file cannot be read or written.
    """
    path = path or checkpoint_file_path()
    appended: list[int] = []
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a+b") as handle:
            # One writer per host at a time: two workers of one host both catching up would
            # otherwise append the same checkpoints twice. Released when the file is closed.
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            newest = _newest_whole(path)
            after = newest.number if newest else 0
            link = newest.statement_hash() if newest else None
            while True:
                rows = list(AuditCheckpoint.objects.filter(number__gt=after).order_by("number")[:SYNC_BATCH])
                if not rows:
                    break
                for row in rows:
                    checkpoint = SignedCheckpoint.from_row(row)
                    if link is not None and (
                        row.number != after + 1 or checkpoint.statement["prev_hash"] != link
                    ):
                        raise CheckpointFileForkError(
                            f"the checkpoint file {path} ends with checkpoint #{after}, which the database's "
                            f"checkpoint #{row.number} does not follow: the database signed on from another "
                            "state, or this file lacks checkpoints only another host's file holds; copy the "
                            "complete file from the host that ran recover, or run manage.py verify_audit"
                        )
                    handle.seek(0, os.SEEK_END)
                    torn = handle.tell() > 0 and _last_byte(handle) != b"\n"
                    # A line cut short stays a line of its own: this one starts on the next line.
                    handle.write(
                        ("\n" if torn else "").encode() + checkpoint.to_line().encode("utf-8") + b"\n"
                    )
                    handle.flush()
                    os.fsync(handle.fileno())
                    appended.append(row.number)
                    after, link = row.number, checkpoint.statement_hash()
    except OSError as exc:
        raise CheckpointError(f"cannot write the checkpoint file {path}: {exc.strerror}") from exc
    return appended


def _last_byte(handle: BinaryIO) -> bytes:
    handle.seek(-1, os.SEEK_END)
    return handle.read(1)


def checkpoint_file_series(path: Path) -> list[int]:
    """The checkpoint numbers of ``path`` in file order (every line read and checked; for
    tests and drills that ask whether a host's file holds the whole series).

    Raises:
        CheckpointError: as ``checkpoint_file.checkpoint_file_read``.
    """
    return [checkpoint.number for _, checkpoint in checkpoint_file_read(path)]
