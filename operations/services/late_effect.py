"""Evidence after the decision (issue 38): an intent that ended without effect, and the provider
has one.

An intent ends FAILED, REJECTED, EXPIRED or CANCELLED on the ledger's own account ("no effect
was made"): an operator's ``absent`` when it could not be sent again, a refusal, a lapsed
approval. The provider may still hold an effect of it: a lookup that was in flight when the
operator decided, a signed event or a statement line that arrives later. The evidence wins: the
intent moves to SUCCEEDED with the provider's receipt, and every party that acted on the
earlier ending is told — the agent by its webhook (``intent.succeeded``, written with the
transition), the operators (and the person whose decision ended it) by an
``effect_found_late`` notice. The earlier ending and the evidence both stay on the timeline.

An agent that re-submits the business action afterwards meets an intent that made its effect
(the business-identity rule, ``operations.services.business``): a likely duplicate.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import connection, transaction

from operations import metrics
from operations.models import ENDED_WITHOUT_EFFECT, Intent, Notification, Outcome
from operations.services.ceilings import reservation_statements
from operations.services.duplicates import duplicate_check_updates
from operations.services.transitions import transition_or_raise
from operations.statements import run_together


def intent_found_after_ending(
    *,
    intent_id: uuid.UUID,
    from_status: str,
    provider_reference: str,
    source: str,
    actor: str,
    reason: str,
    detail: dict[str, Any] | None = None,
) -> None:
    """FAILED, REJECTED, EXPIRED or CANCELLED -> SUCCEEDED: evidence arriving after the intent
    ended without effect proves the provider has ``provider_reference``.

    In one transaction: the compare-and-swap on ``from_status`` with the audit event
    ``effect_found_late`` (``data.ended`` keeps the earlier state; the agent's
    ``intent.succeeded`` webhook is written with it), the ``Outcome``, duplicate checks where
    the intent was sent more than once to a provider without keys (as on every path that ends
    an intent), and an ``effect_found_late`` notice for the tenant's operators and the person
    whose decision ended it (``operations.selectors.notifications``). The effect counts
    against the day's ceilings again (its ending had given the reservation back), over the cap
    if need be: the money moved.

    Args:
        from_status: the state it ended in, one of ``ENDED_WITHOUT_EFFECT``.
        source: ``reconciler`` (a lookup or a statement line) or ``provider_event``
            (``Outcome.Source``).
        detail: stored on the outcome and in the audit event (e.g. the event id).

    Raises:
        ValueError: ``from_status`` is not an ending without effect.
        IntentMoved: the intent is no longer in ``from_status``.
    """
    if from_status not in ENDED_WITHOUT_EFFECT:
        raise ValueError(f"{from_status} is not an ending without effect")
    with transaction.atomic():
        intent = Intent.objects.get(id=intent_id)
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement_timestamp()")
            (now,) = cursor.fetchone()
        transition_or_raise(
            intent_id=intent_id,
            from_status=from_status,
            to_status=Intent.Status.SUCCEEDED,
            actor=actor,
            event="effect_found_late",
            reason=reason,
            data={
                "provider_reference": provider_reference,
                "source": source,
                "ended": from_status,
                **(detail or {}),
            },
            updates={
                "last_error": "",
                "next_lookup_at": None,
                "not_before": None,
                "escalated_at": None,
                **duplicate_check_updates(action=intent.action, attempts=intent.attempt_count),
            },
        )
        # The ending gave its ceilings' reservation back; the money moved after all, so the
        # effect counts again, over the cap if need be (``ceilings.reservation_statements``).
        run_together(*reservation_statements(intent, now=now, made=True))
        Outcome.objects.create(
            intent_id=intent_id, source=source, provider_reference=provider_reference, detail=detail or {}
        )
        Notification.objects.create(kind=Notification.Kind.EFFECT_FOUND_LATE, intent_id=intent_id)
    metrics.ACCEPTED_EFFECTS.labels(source=source).inc()
    metrics.EFFECTS_FOUND_LATE.labels(ended=from_status).inc()
