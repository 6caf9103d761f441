"""Reads of the archive: where an archived intent is (``ArchivedIntent`` rows), and its record
read back from its segment file."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

from django.db.models import Q, QuerySet
from django.db.models.functions import Now

from operations.archive.files import ArchiveFileError, records_read_file
from operations.models import ArchivedIntent


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
