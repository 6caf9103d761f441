"""The checkpoint file (``AUDIT_CHECKPOINT_FILE``): the append-only copy of the signed
checkpoints meant to be shipped away from the database (``operations.audit.checkpoints``;
docs/explanation/audit-threat-model.md).

Read whole and checked line by line (``checkpoint_file_read``: an auditor's copy may hold
anything), or only at its ends without reading the rest: the newest line with its heads
(``checkpoint_file_newest``, what ``recover`` re-baselines on) and the first and newest
statements (``checkpoint_file_ends``, what the restore check compares).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from operations.audit.checkpoints import CheckpointError, SignedCheckpoint, statement_problem


def checkpoint_file_path() -> Path:
    """The append-only checkpoint file (``AUDIT_CHECKPOINT_FILE``)."""
    return Path(settings.EFFECT_LEDGER["AUDIT_CHECKPOINT_FILE"])


def checkpoint_file_read(path: Path) -> Iterator[tuple[int, SignedCheckpoint]]:
    """Every checkpoint in ``path`` (an auditor's copy of the file), as ``(line number,
    checkpoint)``, one line in memory at a time; blank lines are skipped.

    Raises:
        CheckpointError: the file cannot be opened or read, a line is not UTF-8 or not a
            checkpoint line (the message names the line and says "unreadable checkpoint file"),
            or the file holds no checkpoint.
    """
    found = False
    try:
        with path.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    line = raw.decode("utf-8")
                    if not line.strip():
                        continue
                    checkpoint = SignedCheckpoint.from_line(line)
                except (UnicodeDecodeError, CheckpointError) as exc:
                    reason = "not UTF-8" if isinstance(exc, UnicodeDecodeError) else str(exc)
                    raise CheckpointError(
                        f"unreadable checkpoint file {path}, line {number}: {reason}"
                    ) from exc
                found = True
                yield number, checkpoint
    except OSError as exc:
        raise CheckpointError(f"cannot read the checkpoint file {path}: {exc.strerror}") from exc
    if not found:
        raise CheckpointError(f"the checkpoint file {path} holds no checkpoint")


def checkpoint_from_file(path: Path) -> SignedCheckpoint:
    """The checkpoint on the last non-blank line of ``path`` (every line is read and checked).

    Raises:
        CheckpointError: as ``checkpoint_file_read``.
    """
    last: SignedCheckpoint | None = None
    for _, checkpoint in checkpoint_file_read(path):
        last = checkpoint
    assert last is not None  # checkpoint_file_read raises on a file without a checkpoint
    return last


def checkpoint_file_newest(path: Path) -> SignedCheckpoint | None:
    """The checkpoint on the last non-blank line of ``path``, heads included, read from the end
    (the file's other lines are not read; ``recover`` re-baselines on it). None when the file
    does not exist or is empty.

    Raises:
        CheckpointError: the file cannot be read, or its last line is not a checkpoint line.
    """
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            end = handle.tell()
            tail = b""
            while end > 0 and not tail.strip(b"\r\n \t"):
                step = min(end, 1 << 16)
                end -= step
                handle.seek(end)
                tail = handle.read(step) + tail
            stripped = tail.rstrip()
            while end > 0 and b"\n" not in stripped:
                step = min(end, 1 << 20)
                end -= step
                handle.seek(end)
                stripped = handle.read(step) + stripped
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(f"cannot read the checkpoint file {path}: {exc.strerror}") from exc
    last = stripped.rsplit(b"\n", 1)[-1]
    if not last.strip():
        return None
    try:
        return SignedCheckpoint.from_line(last.decode("utf-8"))
    except (UnicodeDecodeError, CheckpointError) as exc:
        raise CheckpointError(f"unreadable checkpoint file {path}, last line: {exc}") from exc


@dataclass(frozen=True)
class FileEnds:
    """The first and the newest checkpoint of a checkpoint file, without their heads: what the
    restore check needs (``operations.restore.check``), read in a few kilobytes whatever the
    file's size. ``newest_signature`` is the newest line's signature (hex)."""

    first: dict[str, Any]
    newest: dict[str, Any]
    newest_signature: str


_STATEMENT_PREFIX = '{"checkpoint":'
_SIGNATURE_SUFFIX = re.compile(r',"signature":"([0-9a-f]{1,256})"\}\s*$')


#: The longest statement read by the restore check (a re-baseline lists up to 1000 faults).
STATEMENT_MAX_BYTES = 16 * 1024 * 1024


def _statement_at(handle: Any, offset: int) -> dict[str, Any]:
    """The statement of the line starting at ``offset`` (``to_line`` writes it first), read in
    growing pieces until it parses (64 KiB first; at most ``STATEMENT_MAX_BYTES``)."""
    size = 64 * 1024
    while True:
        handle.seek(offset)
        raw = handle.read(size)
        line = raw.split(b"\n", 1)[0]
        head = line.decode("utf-8", errors="replace")
        if not head.startswith(_STATEMENT_PREFIX):
            raise CheckpointError("a line does not start with the checkpoint statement")
        try:
            statement, _ = json.JSONDecoder().raw_decode(head, len(_STATEMENT_PREFIX))
            break
        except ValueError as exc:
            whole_line = len(line) < len(raw) or len(raw) < size
            if whole_line or size >= STATEMENT_MAX_BYTES:
                raise CheckpointError(f"a line's statement is not JSON: {exc}") from exc
            size *= 4
    problem = statement_problem(statement)
    if problem:
        raise CheckpointError(problem)
    return statement  # type: ignore[no-any-return]


def checkpoint_file_ends(path: Path) -> FileEnds | None:
    """The first and newest statements of ``path`` and the newest signature, reading only the
    start of the first line and both ends of the last (lines are written by ``to_line``:
    statement first, signature last). None when the file does not exist or holds no line.

    Raises:
        CheckpointError: the file cannot be read, or an end of it is not a checkpoint line.
    """
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            end = size
            # skip trailing blank space
            while end > 0:
                handle.seek(max(0, end - 4096))
                chunk = handle.read(end - max(0, end - 4096))
                stripped = chunk.rstrip()
                if stripped:
                    end = max(0, end - 4096) + len(stripped)
                    break
                end = max(0, end - 4096)
            if end == 0:
                return None
            handle.seek(max(0, end - 512))
            tail = handle.read(end - max(0, end - 512)).decode("utf-8", errors="replace")
            signature = _SIGNATURE_SUFFIX.search(tail)
            if signature is None:
                raise CheckpointError("the last line does not end with a signature")
            start = end
            while start > 0:
                step = min(start, 1 << 20)
                handle.seek(start - step)
                block = handle.read(step)
                newline = block.rfind(b"\n")
                if newline >= 0:
                    start = start - step + newline + 1
                    break
                start -= step
            first = _statement_at(handle, 0)
            newest = _statement_at(handle, start)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(f"cannot read the checkpoint file {path}: {exc.strerror}") from exc
    except CheckpointError as exc:
        raise CheckpointError(f"unreadable checkpoint file {path}: {exc}") from exc
    return FileEnds(first=first, newest=newest, newest_signature=signature.group(1))
