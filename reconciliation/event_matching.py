"""Which intent a provider event is about (issue 19): by our idempotency key, else our business
reference (within one tenant), else the provider's reference on a recorded outcome.
"""

from __future__ import annotations

from django.db.models import Q

from operations.adapters.events import EventFacts
from operations.models import Intent, Outcome


def match_intent(*, facts: EventFacts, actions: tuple[str, ...]) -> Intent | None:
    """The intent an event is about, or None.

    When the event carries our idempotency key (``data.idempotency_key``, or the key inside an
    email's Message-ID) the key decides: the intent with that key, or none (an orphan) — an
    effect made under another key is not this intent's, whatever reference it names. Only an
    event without a key is matched by our business reference (the intent's ``reference`` or
    ``arguments.reference``; of several, the one whose outcome has the event's provider
    reference, else the newest — within one tenant only: a reference that intents of several
    tenants hold is ambiguous, and the event matches none of them, for an operator to link;
    ``reference_tenants``), then by the provider's reference on a recorded outcome (so an intent
    found that way never has a key the event contradicts). An
    effect-proving event is matched only to intents of the action it proves
    (``charge.succeeded`` never matches a refund).
    """
    if facts.proves_action:
        actions = (facts.proves_action,)
    intents = Intent.objects.filter(action__in=actions)
    if facts.idempotency_key:
        return intents.filter(idempotency_key=facts.idempotency_key).first()
    if facts.reference:
        candidates = intents.filter(Q(reference=facts.reference) | Q(arguments__reference=facts.reference))
        if facts.provider_reference:
            same = candidates.filter(outcomes__provider_reference=facts.provider_reference).first()
            if same is not None:
                return same
        if len(reference_tenants(facts=facts, actions=actions)) > 1:
            return None
        newest = candidates.order_by("-created_at").first()
        if newest is not None:
            return newest
    if facts.provider_reference:
        outcome = (
            Outcome.objects.filter(provider_reference=facts.provider_reference, intent__action__in=actions)
            .order_by("created_at")
            .select_related("intent")
            .first()
        )
        if outcome is not None:
            return outcome.intent
    return None


def reference_tenants(*, facts: EventFacts, actions: tuple[str, ...]) -> list[str]:
    """The tenants whose intents of ``actions`` (or of the action the event proves) hold the
    event's business reference, sorted; [] for an event without one. A business reference is
    the caller's, unique at most within a tenant, while a provider account serves them all."""
    if not facts.reference:
        return []
    if facts.proves_action:
        actions = (facts.proves_action,)
    return sorted(
        set(
            Intent.objects.filter(action__in=actions)
            .filter(Q(reference=facts.reference) | Q(arguments__reference=facts.reference))
            .values_list("tenant", flat=True)
        )
    )
