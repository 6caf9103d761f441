"""Whose effect is it: the one rule for taking a provider's effect as an intent's (issue 38, C34).

A provider account serves every tenant, and business references are the callers': two tenants
may both book ``trip-1``. Wherever the ledger matches an effect the provider shows to an intent
— a lookup, a duplicate check, a provider event, a statement line — the same rule decides:

1. An effect that another intent already holds (its recorded ``Outcome``) is that intent's,
   never this one's, and never this one's duplicate to compensate.
2. An intent that ended before it was ever sent (no attempt) made no effect: nothing is its
   effect (``reconciliation.late_evidence``). Not a rule for an UNKNOWN intent: after a
   restore (issue 22) the database may have forgotten the attempts a provider did see.
3. Evidence that names the idempotency key it was made under belongs to the intent with that
   key only (``reconciliation.event_matching.match_intent`` applies this to events, statement lines are
   matched by key first).
4. When other intents that were sent (or are UNKNOWN) and hold no effect yet — or were sent
   more than once, so may hold an unrecorded second one — share this intent's business
   reference (of any tenant), an effect matched by reference alone cannot be told apart: it is
   *ambiguous*. Nothing is decided automatically on it — no outcome, no compensation — and a
   person decides with the evidence.

``attribute`` applies 1 and 4 to a list of provider references found for an intent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from django.db.models import Exists, OuterRef, Q

from operations.adapters.registry import ActionUnavailable, capabilities_for
from operations.models import Intent, Outcome


@dataclass(frozen=True)
class Attribution:
    """What of the provider's effects ``intent`` may take.

    Attributes:
        own: the provider references that may be the intent's effects, in the provider's order.
        others: reference -> why it is not the intent's ("the recorded effect of another
            intent"; no other intent or tenant is named: operators of this tenant read it).
        ambiguous: "" or why the ``own`` ones cannot be told apart from other intents' effects
            (then nothing is decided automatically on them).
    """

    own: tuple[str, ...]
    others: dict[str, str] = field(default_factory=dict)
    ambiguous: str = ""

    def as_detail(self) -> dict[str, object]:
        """The attribution as evidence detail (stored with the lookup, shown to operators)."""
        detail: dict[str, object] = {}
        if self.others:
            detail["not_this_intents"] = dict(list(self.others.items())[:20])
        if self.ambiguous:
            detail["ambiguous"] = self.ambiguous
        return detail


def _lists_by_reference(action: str) -> bool:
    try:
        return capabilities_for(action).list_by_reference
    except ActionUnavailable:
        return True  # not known here: the careful answer


def same_reference(intent: Intent) -> Q:
    """Intents of ``intent``'s action that name its business reference (the request's
    ``reference`` or ``arguments.reference``, what the adapters list by), other than itself."""
    in_arguments = intent.arguments.get("reference") if isinstance(intent.arguments, dict) else None
    reference = intent.reference or (str(in_arguments) if in_arguments else "")
    if not reference:
        return Q(pk__in=[])
    return (
        (Q(reference=reference) | Q(arguments__reference=reference))
        & Q(action=intent.action)
        & ~Q(id=intent.id)
    )


def attribute(intent: Intent, references: Sequence[str], *, by_key: bool | None = None) -> Attribution:
    """Which of ``references`` (found at the provider for ``intent``) may be ``intent``'s
    effects, by the module's rules 1 and 4. At most two queries (one ``EXISTS``); reads only.

    Args:
        by_key: the references were found by ``intent``'s own idempotency key (rule 4 does not
            apply). None: judged from the action's capabilities, by key unless the provider
            lists effects by our business reference (``Capabilities.list_by_reference``).

    Raises nothing; an empty ``references`` gives an empty attribution.
    """
    found = list(dict.fromkeys(ref for ref in references if ref))
    if not found:
        return Attribution(own=())
    # The words name no other intent and no tenant: they are shown to operators who may read
    # this intent's tenant only (docs/how-to/add-approvers.md: another tenant reveals nothing).
    others = {
        ref: "the recorded effect of another intent"
        for ref in Outcome.objects.filter(provider_reference__in=found, intent__action=intent.action)
        .exclude(intent_id=intent.id)
        .values_list("provider_reference", flat=True)
    }
    own = tuple(ref for ref in found if ref not in others)
    ambiguous = ""
    if by_key is None:
        by_key = not _lists_by_reference(intent.action)
    if own and not by_key:
        rivals = (
            Intent.objects.filter(same_reference(intent))
            .filter(Q(attempt_count__gt=0) | Q(status=Intent.Status.UNKNOWN))
            # No effect on record, or sent more than once (a provider without keys may hold a
            # second effect of it that nobody recorded).
            .filter(~Exists(Outcome.objects.filter(intent=OuterRef("pk"))) | Q(attempt_count__gt=1))
            .exists()
        )
        if rivals:
            ambiguous = (
                "another intent sent with the same reference (perhaps of another tenant) holds no effect "
                "on record yet: the provider's effects cannot be told apart by reference"
            )
    return Attribution(own=own, others=others, ambiguous=ambiguous)
