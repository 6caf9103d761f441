"""Compensation intents: opening the intent that undoes an effect (an operator's, or a
duplicate's), moving the original COMPENSATING -> COMPENSATED when it succeeds, and an
operator's decisions on a compensation that failed (reopen, or settle without one).

A compensation is an ordinary intent (``intent_submit``) linked to its original by
``compensates``; the operators reach these through ``reconciliation``.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q, QuerySet
from django.db.models.functions import Now

from operations import metrics
from operations.adapters.registry import ActionUnavailable, capabilities_for, get_adapter, serving_problem
from operations.adapters.templates import TemplateValueMissing
from operations.audit.trail import audit_append
from operations.exceptions import IntentMoved, ResolutionRefused, ValidationFailed
from operations.models import ENDED_WITHOUT_EFFECT, Intent
from operations.services.assignment import RELEASED as ASSIGNMENT_RELEASED
from operations.services.resolution import operator_may_decide
from operations.services.submission import SubmitResult, intent_submit
from operations.services.transitions import transition, transition_or_raise


def intent_open_compensation(
    *,
    original: Intent,
    provider_reference: str,
    principal: str,
    cause: str,
    generation: int = 0,
    requested_by: User | None = None,
    effect_arguments: dict[str, Any] | None = None,
) -> Intent:
    """Open (or find) the compensation intent that undoes ``provider_reference`` of ``original``.

    It is an ordinary intent with its own key, retries, policy (it may need approval) and
    audit, linked to the original by ``compensates``. Its client key is derived from the
    provider reference (and ``generation`` for a compensation reopened by an operator after
    an earlier one failed), so asking twice returns the same compensation.

    Args:
        cause: ``operator`` (undo the original's effect) or ``duplicate`` (undo an extra effect).
        generation: 0 for the first compensation of this effect, then 1, 2 ...
        requested_by: the operator behind a ``user:<username>`` principal (required then),
            recorded by id so that they cannot approve their own compensation (four eyes).
        effect_arguments: argument values of the effect to undo where the provider's differ from
            the original's (a provider finding's ``{"amount", "currency"}`` as the provider holds
            them, minor units), so the compensation undoes what the provider holds.

    Raises:
        ResolutionRefused: the action has no compensation, or its compensation cannot be built
            (a template value missing) or opened (its action not served, its arguments refused).
    """
    try:
        action = capabilities_for(original.action).compensation_action
    except ActionUnavailable as exc:
        raise ResolutionRefused(
            f"{original.action} cannot be compensated here: {serving_problem(original.action, original.action_version)}. "
            "Undo the effect at the provider yourself, then confirm it with its reference and say so in the reason."
        ) from exc
    if not action:
        raise ResolutionRefused(f"{original.action} has no compensation action")
    try:
        arguments = get_adapter(original.action).compensation_arguments(
            original.action, {**original.arguments, **(effect_arguments or {})}, provider_reference
        )
    except (NotImplementedError, TemplateValueMissing) as exc:
        raise ResolutionRefused(f"{original.action} cannot be compensated: {exc}") from exc
    suffix = f":{generation}" if generation else ""
    try:
        result = _submit_compensation(
            original, principal, action, arguments, provider_reference, cause, requested_by, suffix
        )
    except ValidationFailed as exc:
        # a declared compensation that names an action not served, or whose arguments its
        # schema refuses (issue 33): nothing is opened, the operator is told why
        raise ResolutionRefused(
            f"{original.action}'s compensation {action} cannot be opened: {exc}. "
            "Undo the effect at the provider yourself, then confirm it with its reference and say so in the reason."
        ) from exc
    if result.created:
        metrics.COMPENSATIONS.labels(cause=cause).inc()
    return result.intent


def _submit_compensation(
    original: Intent,
    principal: str,
    action: str,
    arguments: dict[str, Any],
    provider_reference: str,
    cause: str,
    requested_by: User | None,
    suffix: str,
) -> SubmitResult:
    """Submit the compensation intent (``intent_submit``'s result), in a savepoint so that a
    refusal leaves the caller's transaction usable.

    Raises:
        ValidationFailed: its action is not served or its arguments fail the action's schema.
    """
    with transaction.atomic():
        return intent_submit(
            tenant=original.tenant,
            principal=principal,
            client_key=f"compensate:{original.id}:{provider_reference}"[: 255 - len(suffix)] + suffix,
            action=action,
            arguments=arguments,
            reference=f"compensation:{original.id}",
            metadata={
                "compensates": str(original.id),
                "provider_reference": provider_reference,
                "cause": cause,
            },
            compensates=original,
            requested_by=requested_by,
        )


def next_compensation_generation(*, original_id: uuid.UUID, provider_reference: str) -> int:
    """How many compensations were already opened for ``provider_reference`` of the original
    (the ``generation`` of the next one)."""
    return Intent.objects.filter(
        compensates_id=original_id, metadata__provider_reference=provider_reference
    ).count()


def intent_begin_compensation(
    *,
    intent_id: uuid.UUID,
    from_status: str,
    provider_reference: str,
    actor: str,
    reason: str,
    requested_by: User | None = None,
    effect_arguments: dict[str, Any] | None = None,
) -> Intent:
    """UNKNOWN or SUCCEEDED -> COMPENSATING, opening the compensation intent in the same
    transaction. The original becomes COMPENSATED when the compensation succeeds.
    ``requested_by`` is the operator behind a ``user:`` ``actor`` and ``effect_arguments`` what
    the provider holds where it differs from the original's arguments (see
    ``intent_open_compensation``).

    Raises:
        IntentMoved: the intent moved meanwhile. ResolutionRefused: no compensation action.
    """
    with transaction.atomic():
        operator_may_decide(intent_id, actor)
        original = Intent.objects.get(id=intent_id)
        transition_or_raise(
            intent_id=intent_id,
            from_status=from_status,
            to_status=Intent.Status.COMPENSATING,
            actor=actor,
            event="compensation_started",
            reason=reason,
            data={"provider_reference": provider_reference},
            # Out of the operators' queue while the compensation runs: an UNKNOWN intent that was
            # escalated would otherwise look like a compensation that needs a decision.
            updates={"next_lookup_at": None, "escalated_at": None},
        )
        return intent_open_compensation(
            original=original,
            provider_reference=provider_reference,
            principal=actor,
            cause="operator",
            requested_by=requested_by,
            effect_arguments=effect_arguments,
        )


def complete_compensated_original(*, compensation: Intent) -> None:
    """When a compensation intent succeeds, move its original COMPENSATING -> COMPENSATED.

    Call in the transaction that records the compensation's success. An original that is not
    COMPENSATING (a duplicate was compensated and one effect remains) keeps its state.
    """
    if compensation.compensates_id is None or compensation.metadata.get("cause") == "duplicate":
        return  # a duplicate's compensation undoes an extra effect, not the original's own
    transition(
        intent_id=compensation.compensates_id,
        from_status=Intent.Status.COMPENSATING,
        to_status=Intent.Status.COMPENSATED,
        actor="reconciler",
        event="compensated",
        data={"compensation_intent": str(compensation.id)},
    )


#: States in which a compensation intent can no longer undo anything.
COMPENSATION_DEAD_ENDS = ENDED_WITHOUT_EFFECT


def own_live_compensations(original: Any) -> QuerySet[Intent]:
    """Compensation intents undoing ``original``'s own effect (not a duplicate's) that can still
    succeed. ``original`` is an intent id or an ``OuterRef`` (for an ``Exists`` subquery)."""
    return (
        Intent.objects.filter(compensates=original)
        .exclude(metadata__cause="duplicate")
        .exclude(status__in=COMPENSATION_DEAD_ENDS)
    )


def _refuse_while_compensating(intent_id: uuid.UUID) -> None:
    # The race this stops: an operator deciding on a failed compensation while a newer one
    # (reopened by a colleague) may still undo the effect.
    if own_live_compensations(intent_id).exists():
        raise ResolutionRefused("a compensation of this intent is still running: wait for it to end")


def intent_reopen_compensation(
    *, intent_id: uuid.UUID, actor: str, reason: str, requested_by: User | None = None
) -> Intent:
    """An operator opens a new compensation for an escalated COMPENSATING intent whose last
    compensation failed, was rejected, expired or was cancelled. The intent stays
    COMPENSATING; ``escalated_at`` is cleared; audit event ``compensation_reopened``.
    ``requested_by`` is the operator behind a ``user:`` ``actor`` (see ``intent_open_compensation``).

    Returns:
        The new compensation intent (its own key: the next ``generation``).

    Raises:
        IntentMoved: the intent is not an escalated COMPENSATING intent any more.
        ResolutionRefused: the action has no compensation.
    """
    with transaction.atomic():
        original = Intent.objects.select_for_update().get(id=intent_id)
        operator_may_decide(intent_id, actor)
        if original.status != Intent.Status.COMPENSATING or original.escalated_at is None:
            raise IntentMoved(
                intent_id=intent_id,
                expected="COMPENSATING with a failed compensation",
                current=original.status,
            )
        _refuse_while_compensating(intent_id)
        last = (
            Intent.objects.filter(compensates=original)
            .exclude(metadata__cause="duplicate")
            .order_by("-created_at")
            .first()
        )
        reference = str(last.metadata.get("provider_reference", "")) if last else ""
        compensation = intent_open_compensation(
            original=original,
            provider_reference=reference,
            principal=actor,
            cause="operator",
            generation=next_compensation_generation(original_id=original.id, provider_reference=reference),
            requested_by=requested_by,
        )
        # Out of the queue again: its assignment ends, as with any resolution.
        Intent.objects.filter(id=intent_id).update(escalated_at=None, updated_at=Now(), **ASSIGNMENT_RELEASED)
        audit_append(
            intent_id=intent_id,
            event="compensation_reopened",
            actor=actor,
            reason=reason,
            data={"compensation_intent": str(compensation.id), "provider_reference": reference},
        )
    return compensation


def intent_settle_compensation(*, intent_id: uuid.UUID, compensated: bool, actor: str, reason: str) -> None:
    """An operator ends an escalated COMPENSATING intent without a new compensation:
    ``compensated=True`` -> COMPENSATED (undone outside the ledger, e.g. by provider support);
    ``compensated=False`` -> SUCCEEDED (the effect stands, e.g. the customer kept the booking).

    Raises:
        IntentMoved: the intent is not an escalated COMPENSATING intent.
        ResolutionRefused: one of its compensations can still succeed: wait for it to end.
    """
    target = Intent.Status.COMPENSATED if compensated else Intent.Status.SUCCEEDED
    with transaction.atomic():
        # Lock the row first so no compensation can be reopened between the check and the move.
        Intent.objects.select_for_update().filter(id=intent_id).values_list("id", flat=True).first()
        operator_may_decide(intent_id, actor)
        _refuse_while_compensating(intent_id)
        _settle(intent_id, target, compensated, actor, reason)


def _settle(intent_id: uuid.UUID, target: str, compensated: bool, actor: str, reason: str) -> None:
    transition_or_raise(
        intent_id=intent_id,
        from_status=Intent.Status.COMPENSATING,
        to_status=target,
        actor=actor,
        event="compensation_settled",
        reason=reason,
        data={"compensated": compensated},
        updates={"escalated_at": None},
        # The race this stops: settling while a reopened compensation runs.
        where=Q(escalated_at__isnull=False),
    )
