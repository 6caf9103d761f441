"""Where an archive segment's two files live and how they are written and read
(docs/reference/archive-format.md, "Layout").

A file is written once: to ``<name>.partial``, flushed and fsynced, renamed to its name, and
the directory fsynced, so a file with its final name is always whole. The database row that
makes a segment count (``ArchiveSegment``) is committed only after both of its files are in
place; ``files_set_aside`` moves away what a killed archiver left behind without one.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import zlib
from collections.abc import Callable, Iterable, Iterator
from datetime import date
from pathlib import Path
from typing import Any, BinaryIO

from django.conf import settings

#: Suffix of a file being written; never read as part of the archive.
PARTIAL = ".partial"
DATA_SUFFIX = ".jsonl.gz"
MANIFEST_SUFFIX = ".manifest.json"


class ArchiveFileError(Exception):
    """An archive file cannot be written or read (the message names the file and why)."""


def archive_dir() -> Path:
    """The archive directory (``EFFECT_LEDGER["ARCHIVE_DIR"]``)."""
    return Path(settings.EFFECT_LEDGER["ARCHIVE_DIR"])


def segment_names(period: date, number: int) -> tuple[str, str]:
    """The data file's and the manifest's names, relative to the archive directory:
    ``YYYY-MM/intents-YYYY-MM-DD-NNNNNN.jsonl.gz`` and ``....manifest.json``."""
    base = f"{period:%Y-%m}/intents-{period:%Y-%m-%d}-{number:06d}"
    return base + DATA_SUFFIX, base + MANIFEST_SUFFIX


def _fsync_dir(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class _HashingWriter:
    """A binary sink that counts and hashes what passes through to ``target``."""

    def __init__(self, target: BinaryIO) -> None:
        self.target, self.sha256, self.bytes = target, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        self.bytes += len(data)
        return self.target.write(data)

    def flush(self) -> None:
        self.target.flush()


def _write_once(name: str, what: str, write: Callable[[BinaryIO], object]) -> None:
    """Create the file ``name`` (relative to the archive directory) whole or not at all: ``write``
    fills ``<name>.partial``, which is flushed, fsynced and renamed, and the directory fsynced.

    Raises:
        ArchiveFileError: it exists already (an archive file is never overwritten) or cannot be
            written (the ``.partial`` is removed).
    """
    path = archive_dir() / name
    partial = path.with_name(path.name + PARTIAL)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            raise ArchiveFileError(
                f"archive {what} {name} exists already: an archive file is never overwritten"
            )
        with open(partial, "wb") as raw:
            write(raw)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(partial, path)
        _fsync_dir(path.parent)
    except OSError as exc:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise ArchiveFileError(f"cannot write archive {what} {name}: {exc.strerror or exc}") from exc


def records_write(name: str, lines: Iterable[dict[str, Any]]) -> tuple[str, int]:
    """Write ``lines`` (JSON objects) as the gzip-compressed JSON Lines file ``name`` (relative
    to the archive directory), durably; returns (sha256 hex, bytes) of the compressed file.

    Raises:
        ArchiveFileError: it exists already (an archive file is never overwritten) or cannot be
            written.
    """
    hashing: list[_HashingWriter] = []

    def write(raw: BinaryIO) -> None:
        sink = _HashingWriter(raw)
        hashing.append(sink)
        with gzip.GzipFile(fileobj=sink, mode="wb", mtime=0) as compressed:
            for line in lines:
                compressed.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode())
                compressed.write(b"\n")

    _write_once(name, "file", write)
    return hashing[0].sha256.hexdigest(), hashing[0].bytes


def manifest_write(name: str, manifest: dict[str, Any]) -> None:
    """Write the manifest document ``name`` (JSON, one object), durably, never overwriting.

    Raises:
        ArchiveFileError: it exists already or cannot be written.
    """
    document = json.dumps(manifest, ensure_ascii=False, indent=1) + "\n"
    _write_once(name, "manifest", lambda raw: raw.write(document.encode()))


def records_read_file(name: str) -> Iterator[dict[str, Any]]:
    """The records of the segment file ``name``, one at a time (streamed, never whole).

    Raises:
        ArchiveFileError: it is missing, not gzip, or a line is not a JSON object.
    """
    path = archive_dir() / name
    try:
        with gzip.open(path, "rb") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as exc:
                    raise ArchiveFileError(f"archive file {name} line {number} is not JSON: {exc}") from exc
                if not isinstance(record, dict):
                    raise ArchiveFileError(f"archive file {name} line {number} is not a JSON object")
                yield record
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ArchiveFileError(
            f"cannot read archive file {name}: {getattr(exc, 'strerror', None) or exc}"
        ) from exc


def manifest_read(name: str) -> dict[str, Any]:
    """The manifest document ``name``.

    Raises:
        ArchiveFileError: it is missing or not a JSON object.
    """
    path = archive_dir() / name
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ArchiveFileError(
            f"cannot read archive manifest {name}: {getattr(exc, 'strerror', None) or exc}"
        ) from exc
    if not isinstance(document, dict):
        raise ArchiveFileError(f"archive manifest {name} is not a JSON object")
    return document


def file_sha256(name: str) -> str:
    """sha256 hex of the file ``name`` as it is on disk.

    Raises:
        ArchiveFileError: it cannot be read.
    """
    digest = hashlib.sha256()
    try:
        with open(archive_dir() / name, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise ArchiveFileError(f"cannot read archive file {name}: {exc.strerror}") from exc
    return digest.hexdigest()


#: Where ``files_set_aside`` moves what a killed archiver left behind (never deleted: a database
#: restored to before a segment's commit forgets the segment, and its file may be wanted).
SET_ASIDE_DIR = ".set-aside"


def files_set_aside(committed: set[str]) -> list[str]:
    """Move what a killed archiver left out of the archive, into ``.set-aside/``: ``.partial``
    files, and segment files and manifests that no committed ``ArchiveSegment`` names
    (``committed``: their names). Their intents were never indexed, so their rows are all still
    live and will be written again. Call only while holding the archiver's lease (no other
    archiver is between writing and committing). Returns the names moved."""
    root = archive_dir()
    moved: list[str] = []
    if not root.is_dir():
        return moved
    for path in sorted(root.glob("*/intents-*")):
        name = path.relative_to(root).as_posix()
        if name.endswith((DATA_SUFFIX, MANIFEST_SUFFIX)) and name in committed:
            continue
        target = root / SET_ASIDE_DIR / name
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target.with_name(f"{target.name}.{os.getpid()}.{path.stat().st_mtime_ns}"))
        moved.append(name)
    return moved


def manifest_name(file_name: str) -> str:
    """The manifest beside a segment's data file (``files.segment_names``)."""
    return file_name.removesuffix(DATA_SUFFIX) + MANIFEST_SUFFIX
