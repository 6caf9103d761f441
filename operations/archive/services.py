"""Archiving settled intents (issue 36; DESIGN.md, "Retention"): ``archive_run``.

One run, under the ``archive`` lease (one archiver at a time, on any host):

1. **Set aside** what a killed run left without a committed segment (``files.files_set_aside``).
2. **Finish** every segment still ``written``: delete its intents' live rows (step 4).
3. **Write** the next segment: the oldest UTC day of submission with eligible intents
   (``ELIGIBLE``), at most ``ARCHIVE_SEGMENT_INTENTS`` of them, read in one REPEATABLE READ
   snapshot; the file, then its signed manifest, each written whole and fsynced; then, in one
   transaction, the ``ArchiveSegment`` row and one ``ArchivedIntent`` per intent (``pending``,
   with the digest of its rows). Until that commit nothing in the database points at the files.
4. **Delete** in transactions of ``ARCHIVE_DELETE_BATCH`` intents: lock them (``FOR UPDATE``,
   skipping any a transition holds), re-check that they are still eligible and that their rows
   still hash to the digest written (``records.ROWS_DIGEST_SQL``), then delete every row about
   them and mark them ``archived`` in the same transaction; one that changed is ``superseded``
   and kept. A kill at any point loses nothing: before the segment's commit its intents are
   all live and unindexed; after it, each batch is deleted and marked together or not at all.
5. Repeat 3-4 until nothing is due. A thread renews the lease all along; when a renewal finds it
   lost (taken over after it lapsed), the run stops at its next step.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from operations.archive import files
from operations.archive.eligibility import CUTOFF, ELIGIBLE, SETTLED_AND_FREE, due_params
from operations.archive.lease import ArchiveLeaseKeeper, archive_lease_try_acquire
from operations.archive.manifests import GENESIS, manifest_build, statement_hash
from operations.archive.records import (
    INTENT_TABLES,
    NESTED_TABLES,
    STATEMENT_LINES,
    answer_record,
    head_of,
    records_read,
    rows_digests,
)
from operations.audit.checkpoints import checkpoint_latest
from operations.audit.signing import current_signing_key
from operations.models import (
    SETTLED_STATUS_VALUES,
    ArchivedIntent,
    ArchiveSegment,
    AuditEvent,
    Intent,
    IntentWaiter,
)
from operations.services.leases import lease_release

#: Intents read from the database per statement group while a segment is written.
READ_CHUNK = 500


class ArchiveBusyError(Exception):
    """Another archiver holds the lease (a run is going on elsewhere)."""


@dataclass
class ArchiveReport:
    """What a run did: segments written, intents archived (deleted live) and superseded (kept:
    they changed after they were written), bytes written, files set aside from a killed run."""

    segments: int = 0
    intents_archived: int = 0
    superseded: int = 0
    bytes_written: int = 0
    set_aside: list[str] = field(default_factory=list)


def _due(before: datetime) -> tuple[date, list[uuid.UUID]] | None:
    """The next segment's day and intents: the oldest UTC day of *submission* that has eligible
    intents due, and up to ``ARCHIVE_SEGMENT_INTENTS`` of them. One statement, walking the
    intents from the oldest on the ``intent_created`` index (an intent settles after it was
    submitted: every one due was submitted before the cutoff), so each segment costs a range of
    that index (the oldest due one, then its day), never a scan and sort of the table."""
    params = {**due_params(before), "limit": int(settings.EFFECT_LEDGER["ARCHIVE_SEGMENT_INTENTS"])}
    due = f"i.updated_at < {CUTOFF} AND {ELIGIBLE}"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT (i.created_at AT TIME ZONE 'UTC')::date FROM {Intent._meta.db_table} i "
            f"WHERE i.created_at < %(before)s AND {due} ORDER BY i.created_at, i.id DESC LIMIT 1",
            params,
        )
        first = cursor.fetchone()
        if first is None:
            return None
        (day,) = first
        cursor.execute(
            f"SELECT i.id FROM {Intent._meta.db_table} i "
            "WHERE i.created_at >= %(day)s::timestamp AT TIME ZONE 'UTC' "
            "AND i.created_at < LEAST(%(before)s, (%(day)s::date + 1)::timestamp AT TIME ZONE 'UTC') "
            f"AND {due} ORDER BY i.created_at, i.id DESC LIMIT %(limit)s",
            {**params, "day": day},
        )
        return day, [intent_id for (intent_id,) in cursor.fetchall()]


class _Segment:
    """The index rows of a segment being written, collected while its records stream out."""

    def __init__(self, key_retention_days: float) -> None:
        self.heads: list[tuple[str, int, str]] = []
        self.rows: list[ArchivedIntent] = []
        self.events = 0
        self.key_retention = timedelta(days=key_retention_days)

    def records(self, ids: list[uuid.UUID]) -> Iterator[dict[str, Any]]:
        for start in range(0, len(ids), READ_CHUNK):
            chunk = ids[start : start + READ_CHUNK]
            digests = rows_digests(chunk)
            for record in records_read(chunk):
                self._index(record, digests[record["intent"]["id"]])
                yield record

    def _index(self, record: dict[str, Any], digest: str) -> None:
        intent = record["intent"]
        seq, head = head_of(record)
        self.heads.append((intent["id"], seq, head))
        self.events += len(record["audit_events"])
        settled_at = datetime.fromisoformat(intent["updated_at"])
        self.rows.append(
            ArchivedIntent(
                intent_id=uuid.UUID(intent["id"]),
                tenant=intent["tenant"],
                principal=intent["principal"],
                client_key=intent["client_key"],
                idempotency_key=intent["idempotency_key"],
                reference=intent["reference"],
                action=intent["action"],
                status=intent["status"],
                request_hash=intent["request_hash"],
                fingerprint_version=intent["fingerprint_version"],
                head_seq=seq,
                head_hash=head,
                rows_digest=digest,
                answer=answer_record(record),
                created_at=datetime.fromisoformat(intent["created_at"]),
                settled_at=settled_at,
                key_expires_at=settled_at + self.key_retention,
            )
        )


def _write_segment(day: date, ids: list[uuid.UUID]) -> ArchiveSegment | None:
    """Step 3 of the module docstring: the files of the next segment, then its rows; None when
    none of ``ids`` is eligible any more in the snapshot it is written from."""
    private_key, _ = current_signing_key()
    previous = ArchiveSegment.objects.order_by("-number").first()
    number = previous.number + 1 if previous else 1
    data_name, manifest_name = files.segment_names(day, number)
    segment = _Segment(float(settings.EFFECT_LEDGER["KEY_RETENTION_DAYS"]))
    outermost = not connection.in_atomic_block  # else the caller's transaction decides the snapshot
    with transaction.atomic():
        with connection.cursor() as cursor:
            if outermost:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            cursor.execute("SELECT statement_timestamp()")
            (now,) = cursor.fetchone()
            # In this snapshot, what is still eligible (one may have changed since it was chosen).
            cursor.execute(
                f"SELECT i.id FROM {Intent._meta.db_table} i WHERE i.id = ANY(%(ids)s) AND {ELIGIBLE} "
                "ORDER BY i.created_at, i.id DESC",
                {**due_params(now), "ids": ids},
            )
            ids = [intent_id for (intent_id,) in cursor.fetchall()]
        if not ids:
            return None
        sha256, size = files.records_write(data_name, segment.records(ids))
        checkpoint = checkpoint_latest()
    manifest = manifest_build(
        number=number,
        prev_hash=statement_hash(previous.manifest) if previous else GENESIS,
        period=day,
        file=data_name,
        file_sha256=sha256,
        size=size,
        heads=segment.heads,
        events=segment.events,
        created_at=now,
        private_key=private_key,
        checkpoint=checkpoint,
    )
    files.manifest_write(manifest_name, manifest)
    with transaction.atomic():
        row = ArchiveSegment.objects.create(
            number=number,
            period=day,
            file_name=data_name,
            intents=len(segment.rows),
            events=segment.events,
            bytes=size,
            file_sha256=sha256,
            root=manifest["statement"]["root"],
            manifest=manifest["statement"],
            signature=manifest["signature"],
        )
        for archived in segment.rows:
            archived.segment = row
        # A superseded intent written again moves to this segment (its earlier record stays in
        # its earlier file as a state the chain went on from).
        ArchivedIntent.objects.filter(
            intent_id__in=[archived.intent_id for archived in segment.rows]
        ).delete()
        ArchivedIntent.objects.bulk_create(segment.rows, batch_size=1000)
    return row


#: The statements that delete every row about the intents ``%(ids)s``, in an order no foreign
#: key refuses; statement lines stay with their statement run, their link cleared.
_DELETES = (
    f"DELETE FROM {IntentWaiter._meta.db_table} WHERE intent_id = ANY(%(ids)s)",
    *(
        f"DELETE FROM {table} t USING {parent} p WHERE p.id = t.{via} AND p.intent_id = ANY(%(ids)s)"
        for table, via, parent in NESTED_TABLES
    ),
    *(
        f"UPDATE {table} SET intent_id = NULL WHERE intent_id = ANY(%(ids)s)"
        if table == STATEMENT_LINES
        else f"DELETE FROM {table} WHERE intent_id = ANY(%(ids)s)"
        for table in INTENT_TABLES
    ),
    # The audit table refuses DELETE unless this transaction says it archives (migration 0035).
    "SET LOCAL effect_ledger.archiving = 'on'",
    f"DELETE FROM {AuditEvent._meta.db_table} WHERE intent_id = ANY(%(ids)s)",
    f"DELETE FROM {Intent._meta.db_table} WHERE id = ANY(%(ids)s)",
)


def _delete_batch(segment: ArchiveSegment, batch: int) -> tuple[int, int]:
    """Step 4 for up to ``batch`` of the segment's pending intents, in one transaction. Returns
    (archived, superseded)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"SELECT a.intent_id, a.rows_digest FROM {ArchivedIntent._meta.db_table} a "
            f"JOIN {Intent._meta.db_table} i ON i.id = a.intent_id "
            "WHERE a.segment_id = %(segment)s AND a.state = 'pending' "
            "ORDER BY a.intent_id LIMIT %(batch)s FOR UPDATE OF i SKIP LOCKED",
            {"segment": segment.pk, "batch": batch},
        )
        written = {str(intent_id): digest for intent_id, digest in cursor.fetchall()}
        if not written:
            return 0, 0
        ids = [uuid.UUID(intent_id) for intent_id in written]
        cursor.execute(
            f"SELECT i.id FROM {Intent._meta.db_table} i WHERE i.id = ANY(%(ids)s) AND {SETTLED_AND_FREE}",
            {"settled": SETTLED_STATUS_VALUES, "ids": ids},
        )
        free = {str(intent_id) for (intent_id,) in cursor.fetchall()}
        digests = rows_digests(ids)
        unchanged = [uuid.UUID(i) for i, digest in written.items() if i in free and digests.get(i) == digest]
        changed = [
            uuid.UUID(i) for i, digest in written.items() if not (i in free and digests.get(i) == digest)
        ]
        if unchanged:
            for statement in _DELETES:
                cursor.execute(statement, {"ids": unchanged})
            ArchivedIntent.objects.filter(intent_id__in=unchanged).update(state=ArchivedIntent.State.ARCHIVED)
        if changed:
            ArchivedIntent.objects.filter(intent_id__in=changed).update(state=ArchivedIntent.State.SUPERSEDED)
    return len(unchanged), len(changed)


#: Times a segment's deletion waits for intents a transition holds before leaving them for the
#: next run, and seconds between tries.
LOCKED_TRIES, LOCKED_WAIT_SECONDS = 5, 0.5


def _finish_segment(
    segment: ArchiveSegment,
    report: ArchiveReport,
    check_lease: Callable[[], None],
    progress: Callable[[str], None],
) -> None:
    """Step 4 of the module docstring for every pending intent of ``segment``; marks it
    ``complete`` when none is left (a run leaves it ``written`` when some stay locked)."""
    batch = int(settings.EFFECT_LEDGER["ARCHIVE_DELETE_BATCH"])
    tries = 0
    while True:
        archived, superseded = _delete_batch(segment, batch)
        report.intents_archived += archived
        report.superseded += superseded
        check_lease()
        if archived or superseded:
            pending = segment.archived_intents.filter(state=ArchivedIntent.State.PENDING).count()
            progress(
                f"segment {segment.number} ({segment.file_name}): {archived} archived"
                + (f", {superseded} changed since written and kept" if superseded else "")
                + f", {pending} to go"
            )
            tries = 0
            continue
        if not segment.archived_intents.filter(state=ArchivedIntent.State.PENDING).exists():
            ArchiveSegment.objects.filter(pk=segment.pk).update(state=ArchiveSegment.State.COMPLETE)
            return
        tries += 1
        if tries >= LOCKED_TRIES:
            progress(f"segment {segment.number}: intents locked by a transition are left for the next run")
            return
        time.sleep(LOCKED_WAIT_SECONDS)


def archive_run(
    *,
    before: datetime,
    progress: Callable[[str], None] | None = None,
    max_segments: int | None = None,
) -> ArchiveReport:
    """Archive every settled intent that settled before ``before`` and is past its tenant's
    retention (the module docstring's steps), one segment per UTC day of submission (or part
    of one). ``before`` is a timezone-aware time; retention still applies (a later ``before``
    archives nothing younger than ``INTENT_RETENTION_DAYS``). ``progress`` receives one line
    per step; ``max_segments`` stops after writing that many (``None``: until nothing is due).

    Raises:
        ArchiveBusyError: another archiver holds the lease.
        ArchiveLeaseLostError: the lease was lost mid-run (what was committed stands).
        operations.audit.keys.AuditKeyError: no signing key to sign the manifests with, or not
            the key that signed the newest checkpoint and segment (``current_signing_key``).
        operations.archive.files.ArchiveFileError: a file cannot be written (nothing of its
            segment is committed; its intents stay live).
        ValueError: ``before`` is naive.
    """
    if before.tzinfo is None:
        raise ValueError("before must be a timezone-aware time")
    say = progress or (lambda line: None)
    lease = archive_lease_try_acquire()
    if lease is None:
        raise ArchiveBusyError("another archiver holds the archive lease: one run at a time")
    keeper = ArchiveLeaseKeeper(lease)
    keeper.start()
    check_lease = keeper.check
    report = ArchiveReport()
    try:
        committed = set(ArchiveSegment.objects.values_list("file_name", flat=True))
        committed |= {name.removesuffix(files.DATA_SUFFIX) + files.MANIFEST_SUFFIX for name in committed}
        report.set_aside = files.files_set_aside(committed)
        for name in report.set_aside:
            say(f"set aside {name}: left by a run that stopped before its segment was committed")
        for unfinished in ArchiveSegment.objects.filter(state=ArchiveSegment.State.WRITTEN).order_by(
            "number"
        ):
            _finish_segment(unfinished, report, check_lease, say)
        while max_segments is None or report.segments < max_segments:
            due = _due(before)
            if due is None:
                break
            day, ids = due
            segment = _write_segment(day, ids)
            check_lease()
            if segment is None:
                continue
            report.segments += 1
            report.bytes_written += segment.bytes
            say(f"segment {segment.number}: wrote {segment.intents} intents of {day} to {segment.file_name}")
            _finish_segment(segment, report, check_lease, say)
    finally:
        keeper.stop()
        with contextlib.suppress(Exception):
            lease_release(lease)
    return report
