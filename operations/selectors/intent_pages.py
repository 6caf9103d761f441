"""What the API shows beside each intent of a page, read for the whole page at once (issue 37):
a list answer costs a fixed number of queries, not one or more per intent."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from operations.models import AuditEvent, Intent, Outcome
from operations.selectors.intents import may_be_likely_duplicate


@dataclass(frozen=True)
class PageFacts:
    """For the intents of one page, by intent id: the newest outcome (``intent_latest_outcome``),
    the newest ``likely_duplicate`` event (``intent_likely_duplicate``), and the principal of
    the intent each is held behind. An id missing from a map has none."""

    outcomes: dict[uuid.UUID, Outcome] = field(default_factory=dict)
    likely_duplicates: dict[uuid.UUID, AuditEvent] = field(default_factory=dict)
    held_behind_principals: dict[uuid.UUID, str] = field(default_factory=dict)


def intent_page_facts(intents: Sequence[Intent], *, outcome_statuses: frozenset[str]) -> PageFacts:
    """The ``PageFacts`` of ``intents``: at most three queries whatever their number, each only
    when some intent needs it (outcomes for those in ``outcome_statuses``)."""
    with_outcome = [intent.id for intent in intents if intent.status in outcome_statuses]
    outcomes = {}
    if with_outcome:
        newest_first = Outcome.objects.filter(intent_id__in=with_outcome).order_by(
            "intent_id", "-created_at", "-id"
        )
        outcomes = {outcome.intent_id: outcome for outcome in newest_first.distinct("intent_id")}
    flagged = [intent.id for intent in intents if may_be_likely_duplicate(intent)]
    duplicates: dict[uuid.UUID, AuditEvent] = {}
    if flagged:
        events = AuditEvent.objects.filter(intent_id__in=flagged, event="likely_duplicate")
        for event in events.order_by("intent_id", "-seq").distinct("intent_id"):
            duplicates[event.intent_id] = event  # type: ignore[index]  # filtered by intent
    behind = {intent.held_behind_id for intent in intents if intent.held_behind_id is not None}
    principals = dict(Intent.objects.filter(id__in=behind).values_list("id", "principal")) if behind else {}
    return PageFacts(outcomes, duplicates, principals)
