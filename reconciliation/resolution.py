"""Operators' resolutions of UNKNOWN intents: ``confirmed``, ``absent``, ``compensate``.

Used by the console and ``manage.py resolve``. Each needs a reason, records who decided and
what evidence they were shown, and is refused with a clear message if the intent moved
meanwhile (the compare-and-swap on UNKNOWN decides).
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from operations import services
from operations.adapters.base import LookupStatus
from operations.adapters.registry import get_adapter
from operations.exceptions import IntentMoved, ResolutionRefused
from operations.models import Intent, Outcome
from reconciliation.models import Evidence
from reconciliation.selectors import intent_evidence

RESOLVER_GROUPS = ("operator", "admin")


def can_resolve(user: User) -> bool:
    """Operators and admins (and superusers) may resolve UNKNOWN intents."""
    return bool(
        user.is_active and (user.is_superuser or user.groups.filter(name__in=RESOLVER_GROUPS).exists())
    )


def _load(intent_id: uuid.UUID, user: User, reason: str) -> Intent:
    if not can_resolve(user):
        raise ResolutionRefused("only operators and admins can resolve UNKNOWN intents")
    if not reason.strip():
        raise ResolutionRefused("a resolution needs a reason")
    intent = Intent.objects.filter(id=intent_id).first()
    if intent is None:
        raise ResolutionRefused(f"no intent {intent_id}")
    if intent.status != Intent.Status.UNKNOWN:
        raise IntentMoved(intent_id=intent_id, expected="UNKNOWN", current=intent.status)
    return intent


def _record(intent: Intent, user: User, verb: str, reason: str, references: list[str], **detail: Any) -> None:
    shown = [e.id for e in intent_evidence(intent)]
    Evidence.objects.create(
        intent=intent,
        kind=Evidence.Kind.RESOLUTION,
        result=verb,
        provider_references=references,
        actor=f"user:{user.get_username()}",
        detail={"reason": reason, "evidence_shown": shown, **detail},
    )


def resolve_confirmed(*, intent_id: uuid.UUID, user: User, provider_reference: str, reason: str) -> Intent:
    """The effect happened: UNKNOWN -> SUCCEEDED with ``provider_reference`` (source operator).

    Where the adapter can look up, the reference is checked first: a lookup that finds other
    references, or proves absence, refuses the confirmation.

    Raises:
        ResolutionRefused: no permission, no reason, no reference, or the provider contradicts it.
        IntentMoved: the intent is no longer UNKNOWN.
    """
    intent = _load(intent_id, user, reason)
    reference = provider_reference.strip()
    if not reference:
        raise ResolutionRefused("confirmed needs the provider's reference for the effect")
    verification = "unverified: the provider has no lookup"
    from reconciliation.lookups import execution_call_for

    result = get_adapter(intent.action).lookup(execution_call_for(intent))
    if result.status == LookupStatus.FOUND:
        if reference not in result.provider_references:
            raise ResolutionRefused(
                f"the provider reports {', '.join(result.provider_references)} for this intent, not {reference}"
            )
        verification = "confirmed by lookup"
    elif result.status == LookupStatus.ABSENT:
        raise ResolutionRefused("the provider's authoritative lookup shows no effect for this intent")
    elif result.status != LookupStatus.UNSUPPORTED:
        verification = f"unverified: the provider's lookup answered {result.status.value}"
    with transaction.atomic():
        _record(intent, user, "confirmed", reason, [reference], verification=verification)
        services.intent_resolve_found(
            intent_id=intent.id,
            provider_reference=reference,
            source=Outcome.Source.OPERATOR,
            actor=f"user:{user.get_username()}",
            reason=reason,
            detail={"verification": verification},
        )
    intent.refresh_from_db()
    return intent


def resolve_absent(
    *, intent_id: uuid.UUID, user: User, reason: str, accept_duplicate_risk: bool = False
) -> Intent:
    """The effect did not happen: UNKNOWN -> READY, retried with the same key.

    For a provider that does not deduplicate on the key a retry may create a second effect, so
    the operator must accept that risk explicitly (it is recorded).

    Raises:
        ResolutionRefused: no permission, no reason, or duplicate risk not accepted.
        IntentMoved: the intent is no longer UNKNOWN.
    """
    intent = _load(intent_id, user, reason)
    deduplicates = get_adapter(intent.action).capabilities.idempotency_keys
    if not deduplicates and not accept_duplicate_risk:
        raise ResolutionRefused(
            f"{intent.action}'s provider does not deduplicate on our key: retrying may create a second effect. "
            "Accept the duplicate risk explicitly to retry."
        )
    with transaction.atomic():
        _record(intent, user, "absent", reason, [], accepted_duplicate_risk=accept_duplicate_risk)
        services.intent_resolve_absent(
            intent_id=intent.id,
            actor=f"user:{user.get_username()}",
            reason=reason,
            data={"accepted_duplicate_risk": accept_duplicate_risk, "provider_deduplicates": deduplicates},
        )
    intent.refresh_from_db()
    return intent


def resolve_compensate(
    *, intent_id: uuid.UUID, user: User, reason: str, provider_reference: str = ""
) -> Intent:
    """Undo the effect: UNKNOWN -> COMPENSATING and open the compensation intent; the original
    becomes COMPENSATED when the compensation succeeds.

    The effect to undo is ``provider_reference`` or, if empty, the one the reconciler found.

    Raises:
        ResolutionRefused: no permission, no reason, no compensation action, or no known effect.
        IntentMoved: the intent is no longer UNKNOWN.
    """
    intent = _load(intent_id, user, reason)
    reference = provider_reference.strip()
    if not reference:
        found = (
            Evidence.objects.filter(intent=intent, kind=Evidence.Kind.LOOKUP, result=LookupStatus.FOUND.value)
            .order_by("-created_at")
            .values_list("provider_references", flat=True)
            .first()
        )
        reference = found[0] if found else ""
    if not reference:
        raise ResolutionRefused(
            "compensate needs the provider reference of the effect to undo; no lookup has found one yet"
        )
    with transaction.atomic():
        _record(intent, user, "compensate", reason, [reference])
        services.intent_begin_compensation(
            intent_id=intent.id,
            from_status=Intent.Status.UNKNOWN,
            provider_reference=reference,
            actor=f"user:{user.get_username()}",
            reason=reason,
        )
    intent.refresh_from_db()
    return intent
