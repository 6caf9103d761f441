"""The API's representation of an archived intent (``ArchivedIntentSerializer``), rendered from
what its ``ArchivedIntent`` row keeps (``operations.archive.records.answer_record``): what a
replay of its ``Idempotency-Key`` and ``GET /api/v1/intents/{id}`` answer once its rows left the
live tables, as they answered before.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from drf_spectacular.utils import OpenApiParameter

from operations.api.intent_representation import IntentDetailSerializer
from operations.models import ArchivedIntent, AuditEvent, Intent, Outcome
from operations.selectors.intents import may_be_likely_duplicate


def _event(row: dict[str, Any]) -> AuditEvent:
    return AuditEvent(
        event=row["event"],
        actor=row["actor"],
        from_status=row["from_status"],
        to_status=row["to_status"],
        reason=row["reason"],
        data=row["data"],
        seq=row["seq"],
        created_at=datetime.fromisoformat(row["created_at"]),
    )


class ArchivedIntentSerializer(IntentDetailSerializer):
    """``IntentDetailSerializer`` whose outcome, likely duplicate and resolution come from the
    record in ``context["record"]`` (an ``answer_record``) instead of queries; the same rules
    pick them (``operations.selectors.intents``). Render with ``archived_representation``."""

    def _record(self) -> dict[str, Any]:
        record: dict[str, Any] = self.context["record"]
        return record

    def held_behind_principal(self, instance: Intent) -> str | None:
        """The earlier intent may be live or archived too."""
        if instance.held_behind_id is None:
            return None
        live = Intent.objects.filter(id=instance.held_behind_id).values_list("principal", flat=True).first()
        if live is not None:
            return live
        return (
            ArchivedIntent.objects.filter(intent_id=instance.held_behind_id)
            .values_list("principal", flat=True)
            .first()
        )

    def latest_outcome(self, intent: Intent) -> Outcome | None:
        from operations.archive.records import outcomes_of  # the record's rows as models

        outcomes = sorted(outcomes_of(self._record()), key=lambda outcome: (outcome.created_at, outcome.id))
        return outcomes[-1] if outcomes else None

    def likely_duplicate_event(self, intent: Intent) -> AuditEvent | None:
        if not may_be_likely_duplicate(intent):
            return None
        rows = [row for row in self._record()["audit_events"] if row["event"] == "likely_duplicate"]
        return _event(rows[-1]) if rows else None

    def latest_decision(self, intent: Intent) -> AuditEvent | None:
        rows = [
            row
            for row in self._record()["audit_events"]
            if row["actor"].startswith("user:") and row["to_status"]
        ]
        return _event(rows[-1]) if rows else None


def archived_representation(archived: ArchivedIntent, context: dict[str, Any]) -> dict[str, Any]:
    """The API's body for ``archived`` (the serializers' ``context``: agent and request)."""
    from operations.archive.records import intent_of

    record = archived.answer or {}
    return dict(ArchivedIntentSerializer(intent_of(record), context={**context, "record": record}).data)


#: Names the archive segment file an answer was read from: the intent left the live tables
#: (``operations.archive``; docs/how-to/archive.md) and the body is what the API answered then.
ARCHIVED_HEADER = "Effect-Ledger-Archived"
#: The header on an answer read from the archive (``ARCHIVED_HEADER``), for the OpenAPI schema.
ARCHIVED_HEADER_PARAMETER = OpenApiParameter(
    ARCHIVED_HEADER,
    str,
    OpenApiParameter.HEADER,
    response=[200, 201],
    description="present when the intent was archived (docs/how-to/archive.md): the segment file that holds "
    "it; the body is what the API answered for it before",
)


def archived_answer(
    archived: ArchivedIntent, context: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The body of an archived intent as the API answered it (the serializers' ``context``:
    agent and request), and the header that says in which archive file it is."""
    return archived_representation(archived, context), {ARCHIVED_HEADER: archived.segment.file_name}
