"""Reads of the archive: where an archived intent is (``ArchivedIntent`` rows), and its record
read back from its segment file."""

from __future__ import annotations

import contextlib
import json
import uuid
from typing import Any, TypeVar

from django.db import connection, models
from django.db.models import Count, Q, QuerySet, Sum
from django.db.models.functions import Now

from operations.archive.files import ArchiveFileError, records_read_file
from operations.archive.proofs import record_request_problem
from operations.archive.records import head_of
from operations.audit.chain_checks import verify_export
from operations.models import ArchivedIntent, ArchiveSegment

ModelT = TypeVar("ModelT", bound=models.Model)


def archived_for_key(*, tenant: str, principal: str, client_key: str) -> ArchivedIntent | None:
    """The archived intent a submission under this key replays: archived (its live rows
    deleted) and its key's retention not over; None otherwise."""
    return (
        ArchivedIntent.objects.select_related("segment")
        .filter(
            tenant=tenant,
            principal=principal,
            client_key=client_key,
            state=ArchivedIntent.State.ARCHIVED,
            key_expires_at__gt=Now(),
        )
        .order_by("-settled_at")
        .first()
    )


def archived_get(*, tenant: str, intent_id: uuid.UUID, principal: str | None = None) -> ArchivedIntent | None:
    """The archived intent ``intent_id`` of ``tenant`` (and of ``principal`` when given: an agent
    whose scope is its own intents); None when it is not archived or not theirs."""
    found = ArchivedIntent.objects.select_related("segment").filter(
        intent_id=intent_id, tenant=tenant, state=ArchivedIntent.State.ARCHIVED
    )
    if principal is not None:
        found = found.filter(principal=principal)
    return found.first()


def archived_search(text: str, *, tenants: list[str] | None = None) -> QuerySet[ArchivedIntent]:
    """Archived intents (state ``archived``) whose id, reference, Idempotency-Key or provider
    key is ``text`` exactly, newest first; of ``tenants`` only when given (None: every tenant)."""
    text = text.strip()
    match = Q(reference=text) | Q(client_key=text) | Q(idempotency_key=text)
    with contextlib.suppress(ValueError):  # not an id: the other fields only
        match |= Q(intent_id=uuid.UUID(text))
    found = ArchivedIntent.objects.select_related("segment").filter(
        match, state=ArchivedIntent.State.ARCHIVED
    )
    if tenants is not None:
        found = found.filter(tenant__in=tenants)
    return found.order_by("-settled_at")


def archived_record(archived: ArchivedIntent) -> dict[str, Any]:
    """The record of ``archived`` read from its segment file (streamed until found).

    Raises:
        ArchiveFileError: the file is missing or unreadable, or does not hold the intent.
    """
    wanted = str(archived.intent_id)
    for record in records_read_file(archived.segment.file_name):
        if record.get("intent", {}).get("id") == wanted:
            return record
    raise ArchiveFileError(f"archive file {archived.segment.file_name} does not hold intent {wanted}")


def archived_by_id(intent_id: uuid.UUID, *, tenants: list[str] | None = None) -> ArchivedIntent | None:
    """The archived intent ``intent_id`` (state ``archived``) with its segment, of ``tenants``
    only when given (None: every tenant); None when it is not archived or not theirs (the
    console's tenant scope: another tenant's archived intent is as absent as a live one)."""
    found = ArchivedIntent.objects.select_related("segment").filter(
        intent_id=intent_id, state=ArchivedIntent.State.ARCHIVED
    )
    if tenants is not None:
        found = found.filter(tenant__in=tenants)
    return found.first()


def archived_rows(record: dict[str, Any], model: type[ModelT]) -> list[ModelT]:
    """The rows of ``model``'s table in ``record`` (its audit events for ``AuditEvent``) as
    unsaved instances, in the file's order, for rendering only (never saved). Columns the model
    no longer has are left out, and binary ones too (``to_jsonb`` wrote them as ``\\x`` hex)."""
    table = model._meta.db_table
    rows = record["audit_events"] if table == "operations_auditevent" else record["rows"].get(table, [])
    fields = {
        field.attname: field
        for field in model._meta.concrete_fields
        if not isinstance(field, models.BinaryField)
    }
    return [
        model(**{name: fields[name].to_python(value) for name, value in row.items() if name in fields})
        for row in rows
    ]


def archived_chain_problems(archived: ArchivedIntent, record: dict[str, Any]) -> list[str]:
    """What is wrong with the audit chain of ``record`` as read from its file: each event's hash
    against its content and its link to the one before, from seq 1
    (``operations.audit.chain_checks.verify_export``), and its head against the head the index
    kept when it was written (``head_seq``, ``head_hash``), and the intent's stored request against
    its chain (``record_request_problem``: an edited argument). Empty when all verify. The
    file against its signed manifest is ``verify_audit``'s (it reads the whole file)."""
    events = record.get("audit_events") or []
    problems = []
    if events:
        lines = (json.dumps(event, ensure_ascii=False, separators=(",", ":")) for event in events)
        try:
            report = verify_export(lines, complete=True)
        except ValueError as exc:
            return [f"the audit events in the file are not exported events: {exc}"]
        problems += [f"event {event.event_id}: {event.problem}" for event in report.breaks]
    seq, head = head_of(record)
    if (seq, head) != (archived.head_seq, archived.head_hash):
        problems.append(
            f"the chain in the file ends at seq {seq} ({head[:12]}), the index recorded seq "
            f"{archived.head_seq} ({archived.head_hash[:12]})"
        )
    if events and isinstance(record.get("intent"), dict):
        request = record_request_problem(record["intent"], events)
        if request:
            problems.append(f"the intent's row: {request}")
    return problems


def storage_sizes() -> dict[str, int]:
    """The live database's size and the archive's, for the dashboard; cheap whatever the size
    of the ledger (no count over a big table).

    ``live_bytes``: ``pg_database_size(current_database())``, every table, index and TOAST of
    the database as PostgreSQL stats its files (no row read, no lock taken); ``archive_bytes``:
    the compressed segment files (sum of ``ArchiveSegment.bytes``, as written); ``segments``;
    ``archived_intents``: the records written to them (sum of ``ArchiveSegment.intents``, those
    superseded since included). ``ArchiveSegment`` holds one row per file, so it is summed whole.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(current_database())")
        (live_bytes,) = cursor.fetchone()
    totals = ArchiveSegment.objects.aggregate(
        archive_bytes=Sum("bytes"), segments=Count("id"), archived_intents=Sum("intents")
    )
    return {
        "live_bytes": int(live_bytes),
        "archive_bytes": int(totals["archive_bytes"] or 0),
        "segments": int(totals["segments"]),
        "archived_intents": int(totals["archived_intents"] or 0),
    }
