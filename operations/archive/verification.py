"""Verifying the archive (issue 36, case C30): every segment file and manifest against the signed
statement, the archive index in the database, and the signed checkpoints that covered the
archived chains, with the public key alone (``archive_verify``).

What is checked, per ``ArchiveSegment`` row (in ``number`` order) and per file in the archive
directory (docs/reference/archive-format.md is the contract):

- the segment's data file and manifest exist (``missing archive file``);
- the index's statement is signed by the key (``bad signature``, ``unknown key``) and the series
  is gap-free and linked by ``prev_hash`` (``deleted segment``);
- the manifest holds the index's statement and signature, naming this file and this number
  (``swapped manifest``: another segment's manifest, or one re-signed with another key);
- the file's sha256 and size are the statement's (``altered archive file``);
- every record's audit chain re-verifies from seq 1 and leaves the intent in the status the
  record holds (``broken archived chain``, the ``chain_checks`` rules), its head is the manifest's and the index's (``altered head``), and
  the heads' Merkle tree hash is the signed ``root`` (``altered heads``);
- each inclusion proof verifies against the root of the signed checkpoint it names, and the
  archived chain holds the proof's leaf event (``bad inclusion proof``);
- every intent the index says is in the segment is in the file, and the file holds no intent the
  index does not place there or, for one written again after it changed, in a later segment
  (``missing intent``, ``unindexed``); an ``archived`` intent has no
  live rows left, a ``superseded`` one's live chain holds the archived head (``archived yet
  live``, ``superseded chain``).

Each finding names the file and, where there is one, the intent. Files are streamed (a record at
a time); a segment's index rows and manifest are held while it is checked.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from operations.archive.files import (
    DATA_SUFFIX,
    MANIFEST_SUFFIX,
    PARTIAL,
    SET_ASIDE_DIR,
    archive_dir,
    manifest_name,
)
from operations.archive.manifests import GENESIS, statement_hash
from operations.archive.proofs import CheckpointRoots, statement_signed
from operations.archive.segment_check import _SegmentCheck
from operations.archive.verification_findings import (
    BAD_SIGNATURE,
    DELETED_SEGMENT,
    MISSING_INTENT,
    UNINDEXED,
    UNKNOWN_KEY,
    ArchiveFinding,
    ArchiveReport,
)
from operations.audit.keys import key_id
from operations.models import ArchivedIntent, ArchiveSegment


def archive_exists() -> bool:
    """Whether there is an archive to verify: a segment in the index, or a segment file or
    manifest in the archive directory."""
    return ArchiveSegment.objects.exists() or any(_files_on_disk())


def archive_verify(
    public_key: Ed25519PublicKey,
    *,
    expected_events: Iterable[tuple[str, int, str]] = (),
    limit: int = 1000,
) -> ArchiveReport:
    """Verify every archive segment, its files and its index rows (see the module docstring).

    Args:
        public_key: the audit key the manifests and checkpoints must be signed with
            (``operations.audit.keys.public_key_load``).
        expected_events: ``(intent_id, seq, hash)`` events the archived chains must hold: the
            checkpointed heads of chains archived after they grew past them
            (``CheckpointReport.archived_later``); one not in its chain's file is a finding.
        limit: findings listed at most (the rest are counted in ``omitted``).

    Returns:
        The report; reads the database and the files, changes nothing.
    """
    report = ArchiveReport(limit=limit)
    expected: dict[str, list[tuple[int, str]]] = {}
    for intent_id, seq, head_hash in expected_events:
        expected.setdefault(intent_id, []).append((seq, head_hash))
    roots = CheckpointRoots(public_key)
    indexed: set[str] = set()
    expected_number, previous = 1, None
    for segment in ArchiveSegment.objects.order_by("number").iterator(chunk_size=100):
        report.segments += 1
        indexed |= {segment.file_name, manifest_name(segment.file_name)}
        _series_check(report, segment, expected_number, previous, public_key)
        _SegmentCheck(report, segment, public_key, roots, expected).run()
        expected_number, previous = segment.number + 1, segment
    for intent_id in expected.keys() - _intents_in_index(expected.keys()):
        report.add(
            ArchiveFinding(
                MISSING_INTENT,
                f"intent {intent_id} is archived by a checkpoint's account but the archive index does not hold it",
                intent_id=intent_id,
            )
        )
    for name in _files_on_disk():
        if name not in indexed:
            report.add(
                ArchiveFinding(
                    UNINDEXED,
                    f"archive file {name} is in the archive directory but no segment of the index names it "
                    "(an archiver writing it now, or one killed before its commit leaves such a file: the next "
                    "archive run sets it aside)",
                    file=name,
                )
            )
    return report


def _files_on_disk() -> Iterator[str]:
    """Segment data files and manifests under the archive directory (relative names), not
    ``.partial`` ones nor what was set aside."""
    root = archive_dir()
    if not root.is_dir():
        return
    for path in sorted(root.glob("*/intents-*")):
        name = path.relative_to(root).as_posix()
        if name.startswith(SET_ASIDE_DIR) or name.endswith(PARTIAL):
            continue
        if name.endswith((DATA_SUFFIX, MANIFEST_SUFFIX)):
            yield name


def _intents_in_index(intent_ids: Iterable[str]) -> set[str]:
    return {
        str(intent_id)
        for intent_id in ArchivedIntent.objects.filter(intent_id__in=list(intent_ids)).values_list(
            "intent_id", flat=True
        )
    }


def _series_check(
    report: ArchiveReport,
    segment: ArchiveSegment,
    expected_number: int,
    previous: ArchiveSegment | None,
    public_key: Ed25519PublicKey,
) -> None:
    """The index's statement of ``segment``: signed by the key, numbered after ``previous``
    without a gap, linked to its statement."""
    name, statement = segment.file_name, segment.manifest
    if segment.number != expected_number:
        missing = (
            f"segment {expected_number}"
            if segment.number == expected_number + 1
            else f"segments {expected_number}-{segment.number - 1}"
        )
        report.add(
            ArchiveFinding(
                DELETED_SEGMENT,
                f"{missing} missing from the archive index before segment {segment.number} ({name})",
                file=name,
            )
        )
    elif not isinstance(statement, dict) or statement.get("prev_hash") != (
        statement_hash(previous.manifest) if previous is not None else GENESIS
    ):
        report.add(
            ArchiveFinding(
                DELETED_SEGMENT,
                f"archive file {name} (segment {segment.number}): its statement does not link to segment "
                f"{segment.number - 1}'s: the series was altered",
                file=name,
            )
        )
    if not isinstance(statement, dict) or statement.get("key_id") != key_id(public_key):
        report.add(
            ArchiveFinding(
                UNKNOWN_KEY,
                f"archive file {name} (segment {segment.number}): the index's statement was not signed by this key",
                file=name,
            )
        )
    elif not statement_signed(public_key, segment.signature, statement):
        report.add(
            ArchiveFinding(
                BAD_SIGNATURE,
                f"archive file {name} (segment {segment.number}): the index's statement does not match its "
                "signature (altered in the database)",
                file=name,
            )
        )
