"""Verifying one archive segment (``_SegmentCheck``): its files against its index row and its
signed statement, its records' chains, heads and inclusion proofs, and its intents' live rows
(the checks ``operations.archive.verification`` lists)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.db import connection

from operations.archive.files import (
    ArchiveFileError,
    archive_dir,
    file_sha256,
    manifest_name,
    manifest_read,
    records_read_file,
)
from operations.archive.proofs import CheckpointRoots, proof_problem, record_request_problem, statement_signed
from operations.archive.verification_findings import (
    ALTERED_FILE,
    ALTERED_HEAD,
    ALTERED_HEADS,
    ALTERED_RECORD,
    BAD_PROOF,
    BAD_SIGNATURE,
    BROKEN_CHAIN,
    HOLDS_HEAD_SQL,
    INTENTS_NAMED,
    LIVE_BATCH,
    MISSING_FILE,
    MISSING_INTENT,
    STILL_LIVE,
    SUPERSEDED_CHAIN,
    SWAPPED_MANIFEST,
    UNINDEXED,
    UNREADABLE_FILE,
    ArchiveFinding,
    ArchiveReport,
)
from operations.audit.chain_checks import _chain_breaks, _is_exported_event
from operations.audit.checkpoints import leaf_input
from operations.audit.keys import key_id
from operations.audit.merkle import MerkleRoot
from operations.models import ArchivedIntent, ArchiveSegment, AuditEvent, Intent


class _SegmentCheck:
    """One segment: its files against its index row and signed statement (see the module
    docstring). ``run`` adds the findings to the report."""

    def __init__(
        self,
        report: ArchiveReport,
        segment: ArchiveSegment,
        public_key: Ed25519PublicKey,
        roots: CheckpointRoots,
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
        elif not statement_signed(self.public_key, signature, signed):
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
        problem = record_request_problem(intent, events)
        if problem:
            self.add(ALTERED_RECORD, f"{where}: {problem}", intent_id)
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
        """One inclusion proof (``proofs.proof_problem``), counted when it holds."""
        problem = proof_problem(intent_id, proof, hashes, self.roots)
        if problem:
            self.add(BAD_PROOF, f"{where}: {problem}", intent_id)
        else:
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
