"""The API's representation of an archived intent (``ArchivedIntentSerializer``), rendered from
what its ``ArchivedIntent`` row keeps (``operations.archive.records.answer_record``): what a
replay of its ``Idempotency-Key`` and ``GET /api/v1/intents/{id}`` answer once its rows left the
live tables, as they answered before.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from operations.api.intent_representation import (
    OUTCOME_STATUSES,
    IntentDetailSerializer,
    LikelyDuplicateSerializer,
    OutcomeSerializer,
    ResolutionSerializer,
)
from operations.models import ArchivedIntent, AuditEvent, Intent


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

    def get_outcome(self, intent: Intent) -> dict[str, Any] | None:
        from operations.archive.records import outcomes_of  # the record's rows as models

        if intent.status not in OUTCOME_STATUSES:
            return None
        outcomes = sorted(outcomes_of(self._record()), key=lambda outcome: (outcome.created_at, outcome.id))
        return OutcomeSerializer(outcomes[-1]).data if outcomes else None

    def get_likely_duplicate(self, intent: Intent) -> dict[str, Any] | None:
        if intent.held_behind_id is None or intent.hold_reason:
            return None
        held_for_a_person = intent.status == Intent.Status.HELD and intent.escalated_at is not None
        if not (held_for_a_person or intent.status == Intent.Status.REJECTED):
            return None
        rows = [row for row in self._record()["audit_events"] if row["event"] == "likely_duplicate"]
        if not rows:
            return None
        event = _event(rows[-1])
        earlier = event.data.get("earlier") if isinstance(event.data, dict) else None
        return LikelyDuplicateSerializer(
            {
                "earlier_intent": earlier or intent.held_behind_id,
                "reason": event.reason,
                "at": event.created_at,
            }
        ).data

    def get_resolution(self, intent: Intent) -> dict[str, Any] | None:
        rows = [
            row
            for row in self._record()["audit_events"]
            if row["actor"].startswith("user:") and row["to_status"] != ""
        ]
        return ResolutionSerializer(_event(rows[-1])).data if rows else None


def archived_representation(archived: ArchivedIntent, context: dict[str, Any]) -> dict[str, Any]:
    """The API's body for ``archived`` (the serializers' ``context``: agent and request)."""
    from operations.archive.records import intent_of

    record = archived.answer or {}
    return dict(ArchivedIntentSerializer(intent_of(record), context={**context, "record": record}).data)
