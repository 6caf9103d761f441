"""Archived intents (issue 36): where an archived intent is, and the read-only page that reads
it back from its archive file. No action: an archived intent is settled and its live rows gone."""

from __future__ import annotations

import uuid
from typing import Any

from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from console.permissions import console_role_required, reader_scope
from console.views.common import HtmxHttpRequest, capped
from operations.archive.files import DATA_SUFFIX, MANIFEST_SUFFIX, ArchiveFileError
from operations.archive.records import intent_of
from operations.archive.selectors import (
    archived_by_id,
    archived_chain_problems,
    archived_record,
    archived_rows,
    archived_search,
)
from operations.models import ArchivedIntent, Attempt, AuditEvent, Outcome
from reconciliation.timeline import record_timeline

#: At most this many archived matches are listed under an intents search (``capped``).
ARCHIVED_MATCHES_SHOWN = 20

#: The tables a record's page shows in their own sections; the other rows about it are listed
#: by table, as the file holds them.
SHOWN_TABLES = {Attempt._meta.db_table, Outcome._meta.db_table}


def archive_tenants(request: HttpRequest) -> list[str] | None:
    """The tenants whose archived intents the user may read, as ``archived_search`` takes them:
    None for every tenant, else the names of ``reader_scope`` (the same scope as live intents)."""
    scope = reader_scope(request.user)
    return None if scope.every else sorted(scope.names)


def archived_matches(request: HttpRequest, text: str) -> tuple[list[ArchivedIntent], bool]:
    """The archived intents of the user's tenants whose id, reference, Idempotency-Key or
    provider key is ``text`` exactly, newest first: at most ``ARCHIVED_MATCHES_SHOWN``, and
    whether more match."""
    return capped(archived_search(text, tenants=archive_tenants(request)), ARCHIVED_MATCHES_SHOWN)


def archived_or_404(request: HttpRequest, intent_id: uuid.UUID) -> ArchivedIntent:
    """The archived intent ``intent_id`` if it belongs to a tenant the user may read; else 404,
    the same answer as for one that does not exist (as ``scoped_intent`` for live intents)."""
    archived = archived_by_id(intent_id, tenants=archive_tenants(request))
    if archived is None:
        raise Http404("no such archived intent")
    return archived


def render_archived_notice(request: HttpRequest, archived: ArchivedIntent) -> HttpResponse:
    """The page ``/intents/<id>/`` answers for an intent that is archived: where it is (file and
    segment) and a link to read it from there."""
    return render(request, "console/intent_archived.html", {"archived": archived, "section": "intents"})


def _record_context(archived: ArchivedIntent, record: dict[str, Any]) -> dict[str, Any]:
    return {
        "intent": intent_of(record),
        "timeline": record_timeline(record),
        "events": archived_rows(record, AuditEvent),
        "attempts": archived_rows(record, Attempt),
        "outcomes": archived_rows(record, Outcome),
        "other_rows": sorted(
            (table, rows) for table, rows in record["rows"].items() if table not in SHOWN_TABLES and rows
        ),
        "chain_problems": archived_chain_problems(archived, record),
    }


@require_GET
@console_role_required
def archived_intent_detail(request: HtmxHttpRequest, intent_id: uuid.UUID) -> HttpResponse:
    """An archived intent, read-only, from its record in its segment file: its fields, its
    timeline and audit chain (checked against the head the index kept), attempts, outcomes and
    every other row the file holds about it, and the segment and its signed manifest. A file
    that is missing or unreadable is named on the page (200, with what the index knows)."""
    archived = archived_or_404(request, intent_id)
    segment = archived.segment
    context: dict[str, Any] = {
        "archived": archived,
        "segment": segment,
        "manifest_name": segment.file_name.removesuffix(DATA_SUFFIX) + MANIFEST_SUFFIX,
        "section": "intents",
    }
    try:
        record = archived_record(archived)
        context.update(_record_context(archived, record))
    except ArchiveFileError as exc:
        context["file_error"] = str(exc)
    except (ValidationError, KeyError, TypeError, ValueError) as exc:  # a line edited by hand
        context["file_error"] = (
            f"archive file {segment.file_name} holds a record of intent {intent_id} "
            f"that cannot be shown: {exc!r}"
        )
    return render(request, "console/archived_intent.html", context)
