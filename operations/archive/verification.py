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
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.db import connection

from operations.archive.files import (
    DATA_SUFFIX,
    MANIFEST_SUFFIX,
    PARTIAL,
    SET_ASIDE_DIR,
    ArchiveFileError,
    archive_dir,
    file_sha256,
    manifest_read,
    records_read_file,
)
from operations.archive.manifests import GENESIS, statement_hash
from operations.audit.chain_checks import _chain_breaks, _is_exported_event
from operations.audit.checkpoints import checkpoint_statement, leaf_input
from operations.audit.keys import key_id, signature_valid
from operations.audit.merkle import MerkleRoot, inclusion_verify
from operations.idempotency import CanonicalizationError, canonical_json
from operations.models import ArchivedIntent, ArchiveSegment, AuditCheckpoint, AuditEvent, Intent

# The findings' names.
MISSING_FILE = "missing archive file"
UNREADABLE_FILE = "unreadable archive file"
ALTERED_FILE = "altered archive file"
BAD_SIGNATURE = "bad signature"
UNKNOWN_KEY = "unknown key"
SWAPPED_MANIFEST = "swapped manifest"
DELETED_SEGMENT = "deleted segment"
BROKEN_CHAIN = "broken archived chain"
ALTERED_HEAD = "altered head"
ALTERED_HEADS = "altered heads"
BAD_PROOF = "bad inclusion proof"
MISSING_INTENT = "missing intent"
UNINDEXED = "unindexed"
STILL_LIVE = "archived yet live"
SUPERSEDED_CHAIN = "superseded chain"

#: Intents named in a finding about a whole file (the rest are counted).
INTENTS_NAMED = 3
#: Intents looked up in the live tables per query.
LIVE_BATCH = 2000
#: Of the given (intent, seq, hash), those the live audit table holds.
HOLDS_HEAD_SQL = """
SELECT h.intent_id::text
FROM unnest(%s::uuid[], %s::integer[], %s::text[]) AS h(intent_id, seq, hash)
WHERE EXISTS (
    SELECT 1 FROM operations_auditevent e WHERE e.intent_id = h.intent_id AND e.seq = h.seq AND e.hash = h.hash
)
"""


@dataclass(frozen=True)
class ArchiveFinding:
    """One thing ``archive_verify`` found: ``kind`` is one of the module's names, ``problem`` a
    sentence naming the file and the intent; ``file`` (relative to the archive directory) and
    ``intent_id`` repeat them for a program."""

    kind: str
    problem: str
    file: str | None = None
    intent_id: str | None = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.problem}"


@dataclass
class ArchiveReport:
    """What ``archive_verify`` read (``segments``, ``intents`` and ``events`` in the files,
    ``proofs`` verified) and found (at most ``limit`` findings; ``omitted`` counts the rest)."""

    segments: int = 0
    intents: int = 0
    events: int = 0
    proofs: int = 0
    findings: list[ArchiveFinding] = field(default_factory=list)
    omitted: int = 0
    limit: int = 1000

    @property
    def ok(self) -> bool:
        """True when nothing was found."""
        return not self.findings and not self.omitted

    def add(self, finding: ArchiveFinding) -> None:
        """Record a finding (counted only, past ``limit``)."""
        if len(self.findings) < self.limit:
            self.findings.append(finding)
        else:
            self.omitted += 1


def manifest_name(file_name: str) -> str:
    """The manifest beside a segment's data file (``files.segment_names``)."""
    return file_name.removesuffix(DATA_SUFFIX) + MANIFEST_SUFFIX


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
    roots = _CheckpointRoots(public_key)
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
    elif not _signed(public_key, segment.signature, statement):
        report.add(
            ArchiveFinding(
                BAD_SIGNATURE,
                f"archive file {name} (segment {segment.number}): the index's statement does not match its "
                "signature (altered in the database)",
                file=name,
            )
        )


def _signed(public_key: Ed25519PublicKey, signature: Any, statement: Any) -> bool:
    """Whether ``signature`` (hex text) is the key's signature of the canonical ``statement``."""
    try:
        message = canonical_json(statement)
    except (CanonicalizationError, TypeError):  # not canonical JSON: nothing was signed
        return False
    return isinstance(signature, str) and signature_valid(public_key, signature, message)


class _CheckpointRoots:
    """The stored checkpoints a proof names: ``(root bytes, chains)`` when the row exists and is
    signed by the key, else the reason it cannot be used (looked up once per number)."""

    def __init__(self, public_key: Ed25519PublicKey) -> None:
        self.public_key = public_key
        self._known: dict[int, tuple[bytes, int] | str] = {}

    def get(self, number: int) -> tuple[bytes, int] | str:
        if number not in self._known:
            row = AuditCheckpoint.objects.defer("heads").filter(number=number).first()
            if row is None:
                self._known[number] = f"checkpoint #{number} is not in the database"
            elif not _signed(self.public_key, row.signature, checkpoint_statement(row)):
                self._known[number] = f"checkpoint #{number} is not signed by this key"
            else:
                self._known[number] = (bytes.fromhex(row.root), row.chains)
        return self._known[number]


class _SegmentCheck:
    """One segment: its files against its index row and signed statement (see the module
    docstring). ``run`` adds the findings to the report."""

    def __init__(
        self,
        report: ArchiveReport,
        segment: ArchiveSegment,
        public_key: Ed25519PublicKey,
        roots: _CheckpointRoots,
        expected: dict[str, list[tuple[int, str]]],
    ) -> None:
        self.report, self.segment, self.public_key = report, segment, public_key
        self.roots, self.expected = roots, expected
        self.name = segment.file_name
        # Records of the file the index places in no segment or another one: intent -> head.
        self.elsewhere: dict[str, tuple[int, str]] = {}
        self.where = f"archive file {self.name} (segment {segment.number})"
        # This segment's index rows: intent -> (state, head_seq, head_hash).
        self.index = {
            str(intent_id): (state, head_seq, head_hash)
            for intent_id, state, head_seq, head_hash in ArchivedIntent.objects.filter(
                segment=segment
            ).values_list("intent_id", "state", "head_seq", "head_hash")
        }

    def add(self, kind: str, problem: str, intent_id: str | None = None) -> None:
        self.report.add(ArchiveFinding(kind, problem, file=self.name, intent_id=intent_id))

    def run(self) -> None:
        statement: dict[str, Any] = self.segment.manifest if isinstance(self.segment.manifest, dict) else {}
        manifest = self._manifest(statement)
        present = (archive_dir() / self.name).is_file()
        if not present:
            self.add(
                MISSING_FILE,
                f"archive file {self.name} is missing (segment {self.segment.number}, "
                f"{self.segment.intents} intents: {self._some_intents(self.index)})",
            )
        else:
            self._file_digest(statement)
            seen = self._records(statement, manifest)
            for intent_id in self.index.keys() - seen:
                self.add(
                    MISSING_INTENT,
                    f"intent {intent_id} is in {self.where} by the archive index, but not in the file",
                    intent_id,
                )
        self._live_rows()

    def _some_intents(self, intents: Iterable[str]) -> str:
        ids = sorted(intents)
        named = ", ".join(ids[:INTENTS_NAMED])
        more = len(ids) - INTENTS_NAMED
        return f"{named} and {more} more" if more > 0 else (named or "none indexed")

    def _manifest(self, statement: dict[str, Any]) -> dict[str, Any] | None:
        """The manifest file, checked against the index's statement and signature. Returned
        (for its ``heads`` and ``proofs``) only when it is this file's own, signed manifest:
        another segment's, or one signed with another key, says nothing about this file, which
        is still checked against the index's signed statement. None: missing, malformed or not
        this file's."""
        name = manifest_name(self.name)
        if not (archive_dir() / name).is_file():
            self.add(
                MISSING_FILE,
                f"archive manifest {name} is missing (segment {self.segment.number}, {self.segment.intents} "
                f"intents: {self._some_intents(self.index)})",
            )
            return None
        try:
            manifest = manifest_read(name)
        except ArchiveFileError as exc:
            self.add(UNREADABLE_FILE, f"{exc} (segment {self.segment.number})")
            return None
        signed, signature = manifest.get("statement"), manifest.get("signature")
        if not isinstance(signed, dict):
            self.add(
                UNREADABLE_FILE, f"archive manifest {name} (segment {self.segment.number}) holds no statement"
            )
            return None
        found = len(self.report.findings) + self.report.omitted
        if signed.get("key_id") != key_id(self.public_key):
            self.add(
                SWAPPED_MANIFEST,
                f"archive manifest {name} (segment {self.segment.number}) was signed by another key "
                f"(key id {str(signed.get('key_id'))[:16]}…): not the manifest written for this file",
            )
        elif not _signed(self.public_key, signature, signed):
            self.add(
                BAD_SIGNATURE,
                f"archive manifest {name} (segment {self.segment.number}) does not match its signature: "
                "its statement was altered",
            )
        elif (signed.get("number"), signed.get("file")) != (self.segment.number, self.name):
            self.add(
                SWAPPED_MANIFEST,
                f"archive manifest {name} is segment {signed.get('number')}'s (it names {signed.get('file')}), "
                f"not the manifest of {self.name} (segment {self.segment.number}): swapped",
            )
        elif (signed, signature) != (statement, self.segment.signature):
            self.add(
                SWAPPED_MANIFEST,
                f"archive manifest {name} (segment {self.segment.number}) holds another signed statement than "
                "the one recorded when the file was written: replaced",
            )
        if len(self.report.findings) + self.report.omitted > found:
            return None
        heads, proofs = manifest.get("heads"), manifest.get("proofs")
        if not isinstance(heads, list) or not isinstance(proofs, list):
            self.add(
                UNREADABLE_FILE,
                f"archive manifest {name} (segment {self.segment.number}) lacks its heads or proofs",
            )
            return None
        return manifest

    def _file_digest(self, statement: dict[str, Any]) -> None:
        """The data file's sha256 and size against the index's (signed) statement."""
        path = archive_dir() / self.name
        try:
            digest, size = file_sha256(self.name), path.stat().st_size
        except (ArchiveFileError, OSError) as exc:
            self.add(UNREADABLE_FILE, f"{self.where} cannot be read: {exc}")
            return
        if digest != statement.get("file_sha256") or digest != self.segment.file_sha256:
            self.add(
                ALTERED_FILE,
                f"{self.where} has sha256 {digest[:16]}…, its signed manifest says "
                f"{str(statement.get('file_sha256'))[:16]}…: the file was changed after it was written",
            )
        elif size != statement.get("bytes"):
            self.add(
                ALTERED_FILE,
                f"{self.where} holds {size} bytes, its signed manifest says {statement.get('bytes')}",
            )

    def _records(self, statement: dict[str, Any], manifest: dict[str, Any] | None) -> set[str]:
        """Stream the file's records: each chain, head and proof; then the heads' root and the
        counts. Returns the intents read."""
        heads: list[Any] = manifest["heads"] if manifest is not None else []
        proofs: dict[str, list[Any]] = {}
        for proof in manifest["proofs"] if manifest is not None else []:
            intent_id = proof.get("intent_id") if isinstance(proof, dict) else None
            proofs.setdefault(str(intent_id), []).append(proof)
        tree, seen, events, position = MerkleRoot(), set[str](), 0, 0
        try:
            for record in records_read_file(self.name):
                intent_id, head = self._record(record, position, heads, proofs)
                position += 1
                if intent_id is None:
                    continue
                if intent_id in seen:
                    self.add(MISSING_INTENT, f"intent {intent_id} is in {self.where} twice", intent_id)
                seen.add(intent_id)
                events += len(record.get("audit_events") or [])
                if head is not None:
                    tree.add(leaf_input(intent_id, *head).encode())
        except ArchiveFileError as exc:
            self.add(
                UNREADABLE_FILE,
                f"{exc} (segment {self.segment.number}): the records after it were not checked",
            )
            return seen | self.index.keys()  # not named missing: the file is already named
        self.report.intents += position
        self.report.events += events
        if tree.hexdigest() != statement.get("root"):
            self.add(
                ALTERED_HEADS,
                f"the heads of the chains in {self.where} hash to {tree.hexdigest()[:16]}…, its signed root is "
                f"{str(statement.get('root'))[:16]}…",
            )
        if manifest is not None and len(heads) != position:
            self.add(
                ALTERED_HEADS,
                f"the manifest of {self.where} lists {len(heads)} heads, the file holds {position} records",
            )
        if (position, events) != (statement.get("intents"), statement.get("events")):
            self.add(
                ALTERED_FILE,
                f"{self.where} holds {position} intents and {events} events, its signed manifest says "
                f"{statement.get('intents')} and {statement.get('events')}",
            )
        self._indexed_elsewhere()
        for intent_id in proofs.keys() - seen:
            self.add(
                BAD_PROOF,
                f"the manifest of {self.where} holds a proof for intent {intent_id}, which the file does not hold",
                intent_id,
            )
        return seen

    def _record(
        self, record: dict[str, Any], position: int, heads: list[Any], proofs: dict[str, list[Any]]
    ) -> tuple[str | None, tuple[int, str] | None]:
        """One record: its chain, head (against the manifest and the index), proofs and the
        expected events. Returns the intent id and the chain's head."""
        intent = record.get("intent")
        if not isinstance(intent, dict) or not intent.get("id"):
            self.add(UNREADABLE_FILE, f"{self.where}: record {position + 1} names no intent")
            return None, None
        intent_id = str(intent["id"])
        where = f"{self.where}, intent {intent_id}"
        events = record.get("audit_events")
        if not isinstance(events, list) or not events or not all(_is_exported_event(e) for e in events):
            self.add(BROKEN_CHAIN, f"{where}: its audit events are missing or malformed", intent_id)
            return intent_id, None
        for event in events:
            if event["intent_id"] != intent_id:
                self.add(
                    BROKEN_CHAIN,
                    f"{where}: event id {event['id']} belongs to intent {event['intent_id']}",
                    intent_id,
                )
        for broken in _chain_breaks(events):
            self.add(BROKEN_CHAIN, f"{where}: event id {broken.event_id}: {broken.problem}", intent_id)
        moved = [event["to_status"] for event in events if event["to_status"]]
        if moved and intent.get("status") != moved[-1]:
            self.add(
                BROKEN_CHAIN,
                f"{where}: the intent is {intent.get('status')} but its audit chain left it {moved[-1]}",
                intent_id,
            )
        head = (events[-1]["seq"], events[-1]["hash"])
        listed = heads[position] if position < len(heads) else None
        if heads and listed != [intent_id, *head]:
            lists = (
                f"seq {listed[1]} ({str(listed[2])[:12]}…)"
                if isinstance(listed, list) and len(listed) == 3 and listed[0] == intent_id
                else f"another head there: {str(listed)[:120]}"
            )
            self.add(
                ALTERED_HEAD,
                f"{where}: the chain ends at seq {head[0]} ({head[1][:12]}…), the manifest lists {lists}",
                intent_id,
            )
        indexed = self.index.get(intent_id)
        if indexed is None:
            self.elsewhere[intent_id] = head
        elif indexed[1:] != head:
            self.add(
                ALTERED_HEAD,
                f"{where}: the chain ends at seq {head[0]} ({head[1][:12]}…), the archive index says seq "
                f"{indexed[1]} ({indexed[2][:12]}…)",
                intent_id,
            )
        hashes = {event["seq"]: event["hash"] for event in events}
        for proof in proofs.get(intent_id, []):
            self._proof(where, intent_id, proof, hashes)
        for seq, event_hash in self.expected.pop(intent_id, []):
            if hashes.get(seq) != event_hash:
                self.add(
                    BROKEN_CHAIN,
                    f"{where}: the chain lacks seq {seq} ({event_hash[:12]}…), the head a signed checkpoint saw",
                    intent_id,
                )
        return intent_id, head

    def _indexed_elsewhere(self) -> None:
        """Records whose intent the index places in another segment: an intent that changed
        after it was written (``superseded``) and was written again later; its record here is an
        earlier state of its chain, so the later segment's head must be at or past it. A record
        the index does not hold at all is ``unindexed``."""
        intents = list(self.elsewhere)
        for start in range(0, len(intents), LIVE_BATCH):
            batch = intents[start : start + LIVE_BATCH]
            later = {
                str(intent_id): (number, file_name, head_seq)
                for intent_id, number, file_name, head_seq in ArchivedIntent.objects.filter(
                    intent_id__in=batch
                ).values_list("intent_id", "segment__number", "segment__file_name", "head_seq")
            }
            for intent_id in batch:
                where = f"{self.where}, intent {intent_id}"
                seq = self.elsewhere[intent_id][0]
                if intent_id not in later:
                    self.add(UNINDEXED, f"{where}: the archive index does not hold this intent", intent_id)
                elif later[intent_id][0] <= self.segment.number or later[intent_id][2] < seq:
                    number, file_name, head_seq = later[intent_id]
                    self.add(
                        UNINDEXED,
                        f"{where}: the archive index places this intent in {file_name} (segment {number}, "
                        f"head seq {head_seq}), not after this file's seq {seq}",
                        intent_id,
                    )

    def _proof(self, where: str, intent_id: str, proof: dict[str, Any], hashes: dict[int, str]) -> None:
        """One inclusion proof: the checkpoint's leaf is in the archived chain, and the path
        leads from it to that signed checkpoint's root (RFC 9162 §2.1.3.2)."""
        leaf, number = proof.get("leaf"), proof.get("checkpoint")
        index, size, path = proof.get("leaf_index"), proof.get("tree_size"), proof.get("path")
        if not (
            isinstance(leaf, list)
            and len(leaf) == 3
            and leaf[0] == intent_id
            and isinstance(leaf[1], int)
            and isinstance(leaf[2], str)
            and isinstance(number, int)
            and isinstance(index, int)
            and isinstance(size, int)
            and isinstance(path, list)
            and all(isinstance(step, str) for step in path)
        ):
            self.add(BAD_PROOF, f"{where}: its inclusion proof is malformed", intent_id)
            return
        if hashes.get(leaf[1]) != leaf[2]:
            self.add(
                BAD_PROOF,
                f"{where}: the chain lacks seq {leaf[1]} ({leaf[2][:12]}…), which checkpoint #{number} signed",
                intent_id,
            )
            return
        checkpoint = self.roots.get(number)
        if isinstance(checkpoint, str):
            self.add(BAD_PROOF, f"{where}: its inclusion proof cannot be checked: {checkpoint}", intent_id)
            return
        root, chains = checkpoint
        try:
            siblings = [bytes.fromhex(step) for step in path]
        except ValueError:
            siblings = []
        if size != chains or not inclusion_verify(
            leaf_input(intent_id, leaf[1], leaf[2]).encode(), index, size, siblings, root
        ):
            self.add(
                BAD_PROOF,
                f"{where}: its inclusion proof does not lead to checkpoint #{number}'s signed root",
                intent_id,
            )
            return
        self.report.proofs += 1

    def _live_rows(self) -> None:
        """``archived`` intents with rows left in the live tables; ``superseded`` ones whose live
        chain does not hold the archived head."""
        archived = [i for i, (state, _, _) in self.index.items() if state == ArchivedIntent.State.ARCHIVED]
        for start in range(0, len(archived), LIVE_BATCH):
            batch = archived[start : start + LIVE_BATCH]
            live = {str(i) for i in Intent.objects.filter(id__in=batch).values_list("id", flat=True)}
            live |= {
                str(i)
                for i in AuditEvent.objects.filter(intent_id__in=batch)
                .values_list("intent_id", flat=True)
                .distinct()
            }
            for intent_id in sorted(live):
                self.add(
                    STILL_LIVE,
                    f"intent {intent_id} is archived in {self.where} but still has live rows",
                    intent_id,
                )
        superseded = {
            i: (seq, head_hash)
            for i, (state, seq, head_hash) in self.index.items()
            if state == ArchivedIntent.State.SUPERSEDED
        }
        with connection.cursor() as cursor:
            cursor.execute(
                HOLDS_HEAD_SQL,
                [
                    list(superseded),
                    [seq for seq, _ in superseded.values()],
                    [h for _, h in superseded.values()],
                ],
            )
            holding = {intent_id for (intent_id,) in cursor.fetchall()}
        for intent_id in sorted(superseded.keys() - holding):
            self.add(
                SUPERSEDED_CHAIN,
                f"intent {intent_id} is superseded in {self.where}, but its live chain does not hold the archived "
                f"head (seq {superseded[intent_id][0]})",
                intent_id,
            )
