"""Compensating a provider finding's effect (issue 19; ``reconciliation.findings``' decision
``compensate``): which action would undo it, and the compensation intent that undoes the amount
the provider holds.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User

from operations import services
from operations.adapters.registry import ActionUnavailable, capabilities_for
from operations.exceptions import IntentMoved, ResolutionRefused
from operations.models import Intent
from reconciliation.models import ProviderFinding
from reconciliation.statement_sources import StatementRefused, source_actions

#: Findings about the effect the intent itself holds: compensating one undoes the intent's own
#: effect (SUCCEEDED -> COMPENSATING), never a duplicate's.
OWN_EFFECT = (ProviderFinding.Kind.AMOUNT_MISMATCH, ProviderFinding.Kind.EFFECT_AFTER_ENDING)


def open_compensation(
    finding: ProviderFinding, original: Intent, *, user: User, actor: str, reason: str
) -> Intent:
    """The compensation of ``finding``'s effect, undoing the amount the provider holds;
    ``user`` requested it, recorded as ``actor`` (``user:<username>``).

    An amount mismatch, or an effect found after the intent ended without one (``OWN_EFFECT``),
    is the intent's own effect: the intent goes SUCCEEDED -> COMPENSATING and becomes COMPENSATED
    when its compensation succeeds (``intent_begin_compensation``, as an
    operator's ``compensate``). Any other finding's effect is not the intent's own (an extra
    effect the operator attributes to it): a compensation of cause ``duplicate``, which leaves the
    intent's own state alone (``intent_open_compensation``).

    Raises:
        ResolutionRefused: a finding of the intent's own effect whose intent is no longer SUCCEEDED.
    """
    effect = _effect_arguments(finding, original)
    if finding.kind in OWN_EFFECT:
        if original.status != Intent.Status.SUCCEEDED:
            raise ResolutionRefused(
                f"intent {original.id} is {original.status}: work its effect on the operators' queue"
            )
        try:
            return services.intent_begin_compensation(
                intent_id=original.id,
                from_status=Intent.Status.SUCCEEDED,
                provider_reference=finding.provider_reference,
                actor=actor,
                reason=reason,
                requested_by=user,
                effect_arguments=effect,
            )
        except IntentMoved as exc:
            raise ResolutionRefused(f"intent {original.id} moved meanwhile: reload and decide again") from exc
    return services.intent_open_compensation(
        original=original,
        provider_reference=finding.provider_reference,
        principal=actor,
        cause="duplicate",
        generation=services.next_compensation_generation(
            original_id=original.id, provider_reference=finding.provider_reference
        ),
        requested_by=user,
        effect_arguments=effect,
    )


def _effect_arguments(finding: ProviderFinding, original: Intent) -> dict[str, Any]:
    """The provider's amount and currency of the finding's effect, for an action that moves
    money (its arguments hold ``amount``); nothing to override otherwise."""
    arguments = original.arguments if isinstance(original.arguments, dict) else {}
    if finding.amount is None or "amount" not in arguments:
        return {}
    return {"amount": finding.amount, "currency": finding.currency or arguments.get("currency")}


def compensation_action_for(finding: ProviderFinding) -> str | None:
    """The action that would compensate ``finding``'s effect (``payments.refund``), or None when
    compensating is not offered: a missing effect has nothing to undo, and an action without a
    compensation (an email) cannot be undone. A finding without an intent is judged by its
    source's actions (the first with a compensation)."""
    if finding.kind == ProviderFinding.Kind.MISSING_AT_PROVIDER:
        return None
    if finding.intent is not None:
        actions = [finding.intent.action]
    else:
        try:
            actions = source_actions(finding.source)
        except StatementRefused:
            return None
    for action in actions:
        try:
            compensation = capabilities_for(action).compensation_action
        except ActionUnavailable:
            continue
        if compensation:
            return compensation
    return None
