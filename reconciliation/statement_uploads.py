"""CSV statements imported in the background (issue 39 item 10): the upload request checks the
file and returns at once; a Celery task imports it a batch of lines per transaction.

**Accepting** (``statement_upload_accept``, the console's upload request): the whole file is
read and checked as before (``reconciliation.statement_csv.parse_statement``: a bad file is
refused with its line and column, nothing stored; about a second for the largest file), then
stored with its SHA-256 and the mapping it was read with (a ``StatementUpload``, ``queued``), its
``StatementRun`` (unfinished) and an outbox message for the import task, in one transaction: a
broker that is down loses no import (the outbox relay publishes the message when it is back).
The same file of the same source and day again (a second click, a new try after a proxy's 504)
is refused naming the first upload (``StatementAlreadyUploaded``; a unique constraint settles
two at once); one whose upload failed may be tried again.

**Importing** (``statement_upload_import``, the task): each batch (``BATCH_LINES``) is one
transaction that locks the upload row, matches the next lines (``reconciliation.
statement_matching``: no savepoint per line), adds to the run's counts and moves
``lines_done`` on. A worker killed mid-batch loses that batch's transaction only; the message,
unacknowledged, is delivered again (the broker on a lost worker, else the outbox relay) and the
import goes on from the last committed batch, so no line is stored twice. A delivery whose
message is no longer the upload's (``message_id``) changes nothing. After ``SLICE_SECONDS`` the
task hands the rest to a new message in the batch's own transaction and ends, well inside
Celery's time limits and without holding a worker for minutes. The last step records the
intents missing at the provider and audits the run (``reconciliation.statements.run_finish``).

A slice that raises is tried again by the relay's next delivery (``failures`` counts them; an
unreachable database is not counted); the ``MAX_FAILURES``-th, or a file that no longer reads,
fails the upload: its run keeps the lines of the committed batches and says where it stopped.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import time
import uuid

from django.db import IntegrityError, transaction
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from operations.idempotency import canonical_json
from operations.models import OutboxMessage
from operations.statements import run_together
from operations.workers.delivery import database_unavailable
from operations.workers.outbox import Handoff, enqueue_statement, handoff_after_commit
from reconciliation.models import StatementRun, StatementUpload
from reconciliation.statement_csv import (
    FIELDS,
    StatementFileError,
    default_mapping,
    mapping_of,
    parse_statement,
    statement_text,
)
from reconciliation.statement_matching import BATCH_LINES, MatchState, match_batch
from reconciliation.statement_sources import source_actions, statement_actions
from reconciliation.statements import run_finish

logger = logging.getLogger("reconciliation")

#: The Celery task that imports an accepted upload (``reconciliation.tasks``).
IMPORT_TASK = "reconciliation.import_statement_upload"
#: Seconds one task imports before it hands the rest to a new message: a third of Celery's
#: default soft time limit (``CELERY_TASK_SOFT_TIME_LIMIT``, 60 s).
SLICE_SECONDS = 20.0
#: Slices that may raise before the upload is failed.
MAX_FAILURES = 3

Status = StatementUpload.Status
FINISHED = (Status.DONE, Status.FAILED)


class StatementAlreadyUploaded(StatementFileError):
    """The same file (SHA-256) of the same source and day was uploaded before and did not
    fail; ``str()`` names that upload, for operators."""


def statement_upload_accept(
    *, source: str, day: dt.date, data: bytes, filename: str, actor: str
) -> StatementUpload:
    """Check an uploaded CSV statement of ``source`` for ``day`` and queue its import (module
    docstring); nothing is stored when it is refused.

    Args:
        data: the file's bytes (at most ``MAX_UPLOAD_BYTES``).
        actor: who uploaded it (``user:<name>``), the run's actor.

    Returns:
        the ``queued`` upload, with its unfinished run.

    Raises:
        StatementRefused: an unknown source.
        StatementFileError: no saved mapping and no ``provider_reference`` column for the
            default one, or a bad file (``parse_statement``: the line and column named).
        StatementAlreadyUploaded: the same file of this source and day was taken before.
    """
    source_actions(source)
    statement_text(data)  # an empty or mis-encoded file is told so, not sent to the mapping
    columns = mapping_of(source) or default_mapping(data)
    if columns is None:
        raise StatementFileError(
            f"{source} has no saved column mapping, and the file's header has no column named"
            f" provider_reference (the default mapping names each column like its field: {', '.join(FIELDS)})."
            f" Save the headers of your file as {source}'s column mapping, then upload it again"
        )
    entries, _ = parse_statement(data, columns)
    digest = hashlib.sha256(data).hexdigest()
    _refuse_a_repeat(source, day, digest)
    message_id = uuid.uuid4()
    try:
        with transaction.atomic():
            statement_run = StatementRun.objects.create(
                source=source,
                statement_date=day,
                origin=StatementRun.Origin.UPLOAD,
                actor=actor,
                filename=filename[:255],
            )
            upload = StatementUpload.objects.create(
                run=statement_run,
                source=source,
                statement_date=day,
                sha256=digest,
                data=data,
                columns=columns,
                total_lines=len(entries),
                message_id=message_id,
            )
            _hand_over(upload.id, message_id)
    except IntegrityError:
        _refuse_a_repeat(source, day, digest)  # the same file, uploaded at the same moment, won
        raise
    return upload


def _refuse_a_repeat(source: str, day: dt.date, digest: str) -> None:
    earlier = (
        StatementUpload.objects.filter(source=source, statement_date=day, sha256=digest)
        .exclude(status=Status.FAILED)
        .select_related("run")
        .defer("data")
        .first()
    )
    if earlier is None:
        return
    raise StatementAlreadyUploaded(
        f"this file was already uploaded as the statement of {source} for {day.isoformat()}"
        f" ({earlier.run.filename or 'no name'}, by {earlier.run.actor} at"
        f" {earlier.created_at.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC, run {earlier.run_id},"
        f" {earlier.get_status_display().lower()}): nothing was imported again"
    )


def _hand_over(upload_id: int, message_id: uuid.UUID) -> None:
    """Write the outbox message that runs the import task (in the caller's transaction); it is
    published after commit, or by the relay when the broker cannot take it."""
    handoff = Handoff(
        id=message_id,
        task=IMPORT_TASK,
        body=canonical_json(
            {"message_id": str(message_id), "task": IMPORT_TASK, "upload_id": upload_id}
        ).decode(),
    )
    (countdown,) = run_together(enqueue_statement(handoff, intent_id=None))
    handoff_after_commit(handoff, countdown)


def _ack(message_id: uuid.UUID) -> None:
    OutboxMessage.objects.filter(id=message_id, acked_at__isnull=True).update(acked_at=Now())


def statement_upload_import(
    *,
    upload_id: int,
    message_id: uuid.UUID,
    seconds: float = SLICE_SECONDS,
    batch_lines: int = BATCH_LINES,
) -> str:
    """Import the next lines of an accepted upload, a batch per transaction, for about
    ``seconds``; then hand the rest to a new message, or finish the run (module docstring).
    Idempotent: a delivery of a message the upload no longer holds, or of a finished upload,
    only acknowledges it.

    Returns:
        the upload's status afterwards (``running`` when the rest was handed on, ``done``,
        ``failed``; ``missing`` when there is no such upload).

    Raises:
        DatabaseError: the database is unreachable (the message is delivered again later).
    """
    upload = StatementUpload.objects.filter(id=upload_id).defer("data").select_related("run").first()
    if upload is None or upload.message_id != message_id or upload.status in FINISHED:
        _ack(message_id)
        return upload.status if upload is not None else "missing"
    data = StatementUpload.objects.filter(id=upload_id).values_list("data", flat=True).get()
    try:
        entries, rows = parse_statement(bytes(data), upload.columns)
    except StatementFileError as exc:  # checked when accepted: a file that no longer reads fails now
        return _failed(upload_id, message_id, exc, final=True)
    actions = statement_actions(upload.source)
    deadline = time.monotonic() + seconds
    state: MatchState | None = None
    expected = -1  # where this delivery's last batch ended
    try:
        while True:
            with transaction.atomic():
                # The row lock serialises two deliveries of one message (the relay re-sends one
                # it thinks lost): each batch starts where the last committed one ended.
                locked = StatementUpload.objects.select_for_update().defer("data").get(id=upload_id)
                if locked.message_id != message_id or locked.status in FINISHED:
                    return str(locked.status)
                start = locked.lines_done
                if start >= len(entries):
                    return _finish(locked, message_id, actions)
                if state is None or start != expected:  # resumed, or another delivery went on
                    state = MatchState.of_run(upload.run)
                counts = match_batch(
                    statement_run=upload.run,
                    source=upload.source,
                    day=upload.statement_date,
                    actions=actions,
                    entries=entries[start : start + batch_lines],
                    first_number=start + 1,
                    raw=rows[start : start + batch_lines],
                    state=state,
                )
                StatementRun.objects.filter(id=upload.run_id).update(
                    lines=F("lines") + counts.lines,
                    matched=F("matched") + counts.matched,
                    extra_at_provider=F("extra_at_provider") + counts.extra,
                    amount_mismatches=F("amount_mismatches") + counts.mismatch,
                )
                expected = start + counts.lines
                progress: dict[str, object] = {"lines_done": expected, "status": Status.RUNNING}
                if expected < len(entries) and time.monotonic() >= deadline:
                    progress["message_id"] = next_message = uuid.uuid4()
                    _hand_over(upload_id, next_message)
                    _ack(message_id)
                StatementUpload.objects.filter(id=upload_id).update(**progress)
            if "message_id" in progress:
                return Status.RUNNING
    except Exception as exc:
        if database_unavailable(exc):
            raise
        logger.exception("importing a statement upload failed", extra={"upload": upload_id})
        return _failed(upload_id, message_id, exc, final=False)


def _finish(locked: StatementUpload, message_id: uuid.UUID, actions: list[str]) -> str:
    """Every line is in: finish the run (missing intents, audit), mark the upload done, empty
    its file and acknowledge the message, in the caller's transaction."""
    statement_run = StatementRun.objects.get(id=locked.run_id)
    run_finish(statement_run=statement_run, actions=actions)
    StatementUpload.objects.filter(id=locked.id).update(
        status=Status.DONE, finished_at=timezone.now(), data=b"", error=""
    )
    _ack(message_id)
    return Status.DONE


def _failed(upload_id: int, message_id: uuid.UUID, exc: Exception, *, final: bool) -> str:
    """Count a slice that raised: below ``MAX_FAILURES`` (and not ``final``) the message stays
    unacknowledged for the relay to deliver again; else the upload and its run fail, saying how
    many lines were imported, and the message is acknowledged."""
    with transaction.atomic():
        locked = StatementUpload.objects.select_for_update().defer("data").get(id=upload_id)
        if locked.message_id != message_id or locked.status in FINISHED:
            return str(locked.status)
        failures = locked.failures + 1
        if not final and failures < MAX_FAILURES:
            StatementUpload.objects.filter(id=upload_id).update(
                failures=failures, error=f"try {failures} of {MAX_FAILURES} failed: {exc!r}"[:2000]
            )
            return str(locked.status)
        error = (
            f"the import stopped after {locked.lines_done} of {locked.total_lines} lines"
            f" (those stay imported): {exc!r}"
        )[:2000]
        now = timezone.now()
        StatementUpload.objects.filter(id=upload_id).update(
            status=Status.FAILED, failures=failures, error=error, finished_at=now
        )
        StatementRun.objects.filter(id=locked.run_id).update(error=error, finished_at=now)
        _ack(message_id)
    return Status.FAILED
