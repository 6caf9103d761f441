"""One rule for late evidence (issue 38): proof of an effect for an intent that ended without one.

Whatever brings the proof — a lookup that was in flight when an operator decided ``absent``
(C31), a provider's signed event, a statement line — and whatever the ending (FAILED,
REJECTED, EXPIRED, CANCELLED), the ledger does the same, in the caller's transaction, under
the intent's row lock:

1. The effect must be the intent's by ``reconciliation.attribution``: another intent's effect,
   or any effect of an intent that was never sent, is not; nor, surely, one found by a
   reference that other intents share while they hold no effect. Then nothing moves and the
   caller records the effect as it records any effect no intent surely has (an orphan event,
   a line extra at the provider; a lookup files the finding below for a person).
2. A ``ProviderFinding`` of kind ``effect_after_ending`` for the operators (once per intent and
   provider reference): they keep the effect (close) or undo it (compensate: the intent's own
   effect, so it goes COMPENSATING, as for an amount mismatch).
3. The intent moves to SUCCEEDED with the provider's receipt (``operations.services.
   intent_found_after_ending``): the agent's webhook, the operators' notice (and the notice to
   the person who decided), both endings on the timeline. A re-submission of the same business
   action is then held as a likely duplicate (``operations.services.business``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from operations import services
from operations.adapters.registry import ActionUnavailable, get_adapter
from operations.models import ENDED_WITHOUT_EFFECT, Intent
from operations.money import Money
from reconciliation.attribution import attribute
from reconciliation.models import ProviderEvent, ProviderFinding, StatementLine, StatementRun


@dataclass(frozen=True)
class LateProof:
    """Evidence of an effect that reached the ledger after its intent ended.

    Attributes:
        provider_reference: the provider's id of the effect.
        source: ``Outcome.Source`` of the proof (``reconciler``, ``provider_event``).
        actor: who brings it (``reconciler``, ``provider:<source>``).
        what: a sentence naming the evidence ("the provider's signed event evt_1 ...").
        by_key: the evidence names the intent's own idempotency key (decisive; the rule on
            shared references does not apply).
        amount / currency: what the provider holds (minor units, ISO 4217), when it says.
        detail: stored on the outcome and the finding (event id, statement run, ...).
    """

    provider_reference: str
    source: str
    actor: str
    what: str
    by_key: bool = False
    amount: int | None = None
    currency: str = ""
    detail: dict[str, Any] | None = None


def finding_source(intent: Intent) -> str:
    """The evidence source a finding about ``intent`` is filed under: its adapter's declared
    source (``sandbox-payments``), else its action."""
    try:
        return get_adapter(intent.action).evidence_source or intent.action
    except ActionUnavailable:
        return intent.action


@dataclass(frozen=True)
class LateOutcome:
    """What ``apply_late_proof`` did: ``applied`` (finding open, intent SUCCEEDED), or nothing,
    with ``why``: ``ambiguous`` (the effect cannot be told apart from other intents') or
    ``not_its_effect`` (another intent's, or the intent was never sent)."""

    result: str
    why: str = ""


def file_late_finding(
    intent: Intent,
    proof: LateProof,
    *,
    ambiguous: str = "",
    event: ProviderEvent | None = None,
    run: StatementRun | None = None,
    line: StatementLine | None = None,
) -> ProviderFinding:
    """The open ``effect_after_ending`` finding of ``intent`` and ``proof``'s effect (once per
    intent and provider reference: ``late:<intent id>:<provider reference>``); ``ambiguous``,
    when given, says why a person must tell whose effect it is (the intent is not moved then).
    ``detail.also_done_by`` names the intents of the same business action that made their effect
    meanwhile (a re-submission after the ending): the operator undoes one of the two."""
    money = Money.of(intent.arguments)
    # Intents of the same business action (same tenant) that made their effect meanwhile, e.g.
    # a re-submission after the ending: with this one, two effects for one business action.
    also_done = (
        [
            str(other)
            for other in Intent.objects.filter(
                business_key=intent.business_key,
                status__in=[Intent.Status.SUCCEEDED, Intent.Status.COMPENSATING],
            )
            .exclude(id=intent.id)
            .values_list("id", flat=True)[:10]
        ]
        if intent.business_key
        else []
    )
    finding, _ = ProviderFinding.objects.get_or_create(
        fingerprint=f"late:{intent.id}:{proof.provider_reference}",
        defaults={
            "kind": ProviderFinding.Kind.EFFECT_AFTER_ENDING,
            "source": finding_source(intent),
            "intent": intent,
            "event": event,
            "run": run,
            "line": line,
            "provider_reference": proof.provider_reference,
            "amount": proof.amount,
            "currency": proof.currency,
            "expected_amount": money.amount_minor if money else None,
            "expected_currency": money.currency if money else "",
            "detail": {
                "ended": intent.status,
                "evidence": proof.what,
                **({"ambiguous": ambiguous} if ambiguous else {}),
                **({"also_done_by": also_done} if also_done else {}),
                **(proof.detail or {}),
            },
        },
    )
    return finding


def apply_late_proof(
    intent: Intent,
    proof: LateProof,
    *,
    event: ProviderEvent | None = None,
    run: StatementRun | None = None,
    line: StatementLine | None = None,
) -> LateOutcome:
    """Apply ``proof`` to ``intent`` (locked by the caller, read in this transaction), which
    ended without effect, by the module's rule; ``event``, ``run`` and ``line`` are attached to
    the finding. Nothing is written unless it is ``applied``: the caller records an effect that
    is not (or not surely) the intent's as it records any stray effect.

    Raises:
        ValueError: ``intent`` has not ended without effect.
    """
    if intent.status not in ENDED_WITHOUT_EFFECT:
        raise ValueError(f"intent {intent.id} is {intent.status}, not ended without effect")
    if intent.attempt_count == 0:
        return LateOutcome(
            "not_its_effect", f"intent {intent.id} ended {intent.status} before it was ever sent"
        )
    attribution = attribute(intent, [proof.provider_reference], by_key=proof.by_key or None)
    if proof.provider_reference in attribution.others:
        return LateOutcome("not_its_effect", attribution.others[proof.provider_reference])
    if attribution.ambiguous:
        return LateOutcome("ambiguous", attribution.ambiguous)
    ended = intent.status
    file_late_finding(intent, proof, event=event, run=run, line=line)
    services.intent_found_after_ending(
        intent_id=intent.id,
        from_status=ended,
        provider_reference=proof.provider_reference,
        source=proof.source,
        actor=proof.actor,
        reason=f"it ended {ended} without effect, but {proof.what}",
        detail=proof.detail,
    )
    intent.status = Intent.Status.SUCCEEDED
    return LateOutcome("applied")
