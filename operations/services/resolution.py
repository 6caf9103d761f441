"""Transitions out of UNKNOWN, and compensation intents.

The reconciler and operators (through ``reconciliation``) call these; each is one
compare-and-swap on ``status = UNKNOWN`` (or SUCCEEDED for compensation) plus its audit event.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction
from django.db.models.functions import Now

from operations import metrics
from operations.adapters.registry import get_adapter
from operations.audit import audit_append
from operations.exceptions import ResolutionRefused
from operations.models import Intent, Outcome
from operations.services.submission import intent_submit
from operations.services.transitions import transition, transition_or_raise


def intent_resolve_found(
    *, intent_id: uuid.UUID, provider_reference: str, source: str, actor: str, reason: str = "",
    detail: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    """UNKNOWN -> SUCCEEDED with the provider's receipt found by lookup or given by an operator.

    Args:
        source: ``reconciler`` or ``operator`` (``Outcome.Source``).

    Raises:
        IntentMoved: the intent is no longer UNKNOWN.
    """
    with transaction.atomic():
        transition_or_raise(
            intent_id=intent_id,
            from_status=Intent.Status.UNKNOWN,
            to_status=Intent.Status.SUCCEEDED,
            actor=actor,
            event="outcome_found",
            reason=reason,
            data={"provider_reference": provider_reference, "source": source},
            updates={"last_error": "", "next_lookup_at": None},
        )
        Outcome.objects.create(
            intent_id=intent_id, source=source, provider_reference=provider_reference, detail=detail or {}
        )
    metrics.ACCEPTED_EFFECTS.labels(source=source).inc()


def intent_resolve_absent(
    *, intent_id: uuid.UUID, actor: str, reason: str, data: dict[str, Any] | None = None
) -> None:
    """UNKNOWN -> READY with the same key (and an outbox message): the effect did not happen.

    Raises:
        IntentMoved: the intent is no longer UNKNOWN.
    """
    transition_or_raise(
        intent_id=intent_id,
        from_status=Intent.Status.UNKNOWN,
        to_status=Intent.Status.READY,
        actor=actor,
        event="outcome_absent",
        reason=reason,
        data=data or {},
        updates={"not_before": None, "next_lookup_at": None, "escalated_at": None, "lookup_count": 0},
        dispatch=True,
    )


def intent_escalate(*, intent_id: uuid.UUID, reason: str) -> bool:
    """Hand an UNKNOWN intent to the operators' queue (once). Returns True if newly escalated.

    Not a status change: the intent stays UNKNOWN; ``escalated_at`` is set and audited.
    """
    with transaction.atomic():
        # The race this stops: two reconciler passes escalating the same intent twice.
        updated = Intent.objects.filter(
            id=intent_id, status=Intent.Status.UNKNOWN, escalated_at__isnull=True
        ).update(escalated_at=Now())
        if updated:
            audit_append(intent_id=intent_id, event="escalated", actor="reconciler", reason=reason)
    if updated:
        metrics.ESCALATIONS.inc()
    return bool(updated)


def intent_open_compensation(
    *, original: Intent, provider_reference: str, principal: str, cause: str
) -> Intent:
    """Open (or find) the compensation intent that undoes ``provider_reference`` of ``original``.

    It is an ordinary intent with its own key, retries, policy (it may need approval) and
    audit, linked to the original by ``compensates``. Its client key is derived from the
    provider reference, so asking twice returns the same compensation.

    Raises:
        ResolutionRefused: the action has no compensation.
    """
    adapter = get_adapter(original.action)
    action = adapter.capabilities.compensation_action
    if not action:
        raise ResolutionRefused(f"{original.action} has no compensation action")
    try:
        arguments = adapter.compensation_arguments(original.action, original.arguments, provider_reference)
    except NotImplementedError as exc:
        raise ResolutionRefused(f"{original.action} cannot be compensated: {exc}") from exc
    result = intent_submit(
        tenant=original.tenant,
        principal=principal,
        client_key=f"compensate:{original.id}:{provider_reference}"[:255],
        action=action,
        arguments=arguments,
        reference=f"compensation:{original.id}",
        metadata={"compensates": str(original.id), "provider_reference": provider_reference, "cause": cause},
        compensates=original,
    )
    if result.created:
        metrics.COMPENSATIONS.labels(cause=cause).inc()
    return result.intent


def intent_begin_compensation(
    *, intent_id: uuid.UUID, from_status: str, provider_reference: str, actor: str, reason: str
) -> Intent:
    """UNKNOWN or SUCCEEDED -> COMPENSATING, opening the compensation intent in the same
    transaction. The original becomes COMPENSATED when the compensation succeeds.

    Raises:
        IntentMoved: the intent moved meanwhile. ResolutionRefused: no compensation action.
    """
    with transaction.atomic():
        original = Intent.objects.get(id=intent_id)
        transition_or_raise(
            intent_id=intent_id,
            from_status=from_status,
            to_status=Intent.Status.COMPENSATING,
            actor=actor,
            event="compensation_started",
            reason=reason,
            data={"provider_reference": provider_reference},
            updates={"next_lookup_at": None},
        )
        return intent_open_compensation(
            original=original, provider_reference=provider_reference, principal=actor, cause="operator"
        )


def complete_compensated_original(*, compensation: Intent) -> None:
    """When a compensation intent succeeds, move its original COMPENSATING -> COMPENSATED.

    Call in the transaction that records the compensation's success. An original that is not
    COMPENSATING (a duplicate was compensated and one effect remains) keeps its state.
    """
    if compensation.compensates_id is None:
        return
    transition(
        intent_id=compensation.compensates_id,
        from_status=Intent.Status.COMPENSATING,
        to_status=Intent.Status.COMPENSATED,
        actor="reconciler",
        event="compensated",
        data={"compensation_intent": str(compensation.id)},
    )
