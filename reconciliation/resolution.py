"""Operators' resolutions of UNKNOWN intents: ``confirmed``, ``absent``, ``compensate``.

Used by the console and ``manage.py resolve``. Each needs a reason, records who decided and
what evidence they were shown, and is refused with a clear message if the intent moved
meanwhile (the compare-and-swap on UNKNOWN decides). The checks and the record every decision
shares are ``reconciliation.decision_checks``.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from operations import services
from operations.adapters.base import LookupStatus
from operations.adapters.registry import capabilities_for, serving_problem
from operations.engine.calls import provider_lookup
from operations.exceptions import ResolutionRefused
from operations.models import Intent, Outcome
from reconciliation.attribution import attribute
from reconciliation.decision_checks import (
    absent_refusal,
    check_decider,
    check_tenant,
    compensate_refusal,
    load_for_decision,
    record_decision,
)
from reconciliation.lookups import reconcile_intent
from reconciliation.models import DuplicateFinding
from reconciliation.selectors import found_by_lookup


def _finding_intent(arguments: dict[str, Any]) -> uuid.UUID | None:
    """The intent a duplicate finding belongs to (where a refused decision on it is recorded)."""
    return (
        DuplicateFinding.objects.filter(id=arguments["finding_id"])
        .values_list("intent_id", flat=True)
        .first()
    )


@services.refusals_audited("resolve confirmed")
def resolve_confirmed(
    *,
    intent_id: uuid.UUID,
    user: User,
    provider_reference: str,
    reason: str,
    accept_unverified: bool = False,
    seen_seq: int | None = None,
) -> Intent:
    """The effect happened: UNKNOWN -> SUCCEEDED with ``provider_reference`` (source operator).

    The reference is checked by a lookup first: a lookup that finds other references, or
    proves absence, refuses the confirmation. When the provider cannot verify it (no lookup,
    a lagging lookup that sees nothing yet, an inconclusive answer), the operator must say so
    explicitly (``accept_unverified``); the outcome, the audit event and every page that shows
    the intent then say "unverified".

    Raises:
        ResolutionRefused: no permission, no reason, no reference, the reference is another
            intent's recorded effect, the provider contradicts it, or it is unverified and
            ``accept_unverified`` is False.
        IntentMoved: the intent is no longer UNKNOWN.
    """
    intent = load_for_decision(intent_id, user, reason, seen_seq=seen_seq)
    reference = provider_reference.strip()
    if not reference:
        raise ResolutionRefused("confirmed needs the provider's reference for the effect")
    taken = attribute(intent, [reference], by_key=True).others.get(reference)
    if taken:
        # One effect is one intent's (``reconciliation.attribution``, C34): confirming another
        # intent's effect here would hand it to this intent's agent (who might cancel it).
        raise ResolutionRefused(f"{reference} is {taken}: it cannot be this intent's effect too")
    result = provider_lookup(intent)  # never raises: a removed action answers INCONCLUSIVE
    verified = False
    if result.status == LookupStatus.FOUND:
        if reference not in result.provider_references:
            raise ResolutionRefused(
                f"the provider reports {', '.join(result.provider_references)} for this intent, not {reference}"
            )
        ambiguous = attribute(intent, result.provider_references).ambiguous
        if ambiguous:
            # Listed by reference beside other intents' effects: the list does not say it is ours.
            verification = f"unverified: {ambiguous}"
        else:
            verified, verification = True, "confirmed by lookup"
    elif result.status == LookupStatus.ABSENT:
        raise ResolutionRefused("the provider's authoritative lookup shows no effect for this intent")
    elif result.status == LookupStatus.UNSUPPORTED:
        verification = "unverified: the provider has no lookup"
    elif unserved := serving_problem(intent.action, intent.action_version):
        verification = f"unverified: no lookup is possible ({unserved})"
    else:
        verification = f"unverified: the provider's lookup answered {result.status.value}"
    if not verified and not accept_unverified:
        raise ResolutionRefused(
            f"the provider cannot verify {reference} ({verification.removeprefix('unverified: ')}); "
            "confirm it as unverified explicitly if you are sure"
        )
    with transaction.atomic():
        record_decision(
            intent, user, "confirmed", reason, [reference], verification=verification, verified=verified
        )
        services.intent_resolve_found(
            intent_id=intent.id,
            provider_reference=reference,
            source=Outcome.Source.OPERATOR,
            actor=f"user:{user.get_username()}",
            reason=reason,
            detail={"verification": verification, "verified": verified},
        )
    intent.refresh_from_db()
    return intent


@services.refusals_audited("resolve absent")
def resolve_absent(
    *, intent_id: uuid.UUID, user: User, reason: str, accept_duplicate_risk: bool = False,
    seen_seq: int | None = None,
) -> Intent:  # fmt: skip
    """The effect did not happen: UNKNOWN -> READY, retried with the same key.

    For a provider that does not deduplicate on the key a retry may create a second effect, so
    the operator must accept that risk explicitly (it is recorded), and the intent waits out
    any lookup still in flight (``intent_resolve_absent``). Evidence wins: when a lookup on
    record found the effect, ``absent`` is refused with that evidence (issue 21 item 9).

    An intent that must not be sent again (``services.resend_refusal``: its attempt budget is
    spent, or this deployment does not serve its action or version) ends FAILED instead: no
    effect, by the operator's word, and no re-send (issue 21). The page says so beforehand.

    Raises:
        ResolutionRefused: no permission, no reason, duplicate risk not accepted, or a lookup
            found the effect, or the provider accepted it (``reconciliation.selectors.effect_on_record``).
        IntentMoved: the intent is no longer UNKNOWN.
    """
    intent = load_for_decision(intent_id, user, reason, seen_seq=seen_seq)
    cannot_resend = services.resend_refusal(intent)
    deduplicates = False if cannot_resend else capabilities_for(intent.action).same_key_retry_safe
    if not cannot_resend and not deduplicates and not accept_duplicate_risk:
        raise ResolutionRefused(
            f"{intent.action}'s provider does not deduplicate on our key: retrying may create a second effect. "
            "Accept the duplicate risk explicitly to retry."
        )
    actor = f"user:{user.get_username()}"
    with transaction.atomic():
        # The race this stops: a lookup that found the effect while the operator was deciding.
        # The row lock orders this against ``record_lookup``: found evidence on record refuses
        # (also where ``absent`` would end the intent FAILED: it happened, so it did not fail).
        Intent.objects.select_for_update().filter(id=intent.id).exists()
        refusal = absent_refusal(intent)
        if refusal:
            raise ResolutionRefused(refusal)
        if cannot_resend:
            record_decision(intent, user, "absent", reason, [], not_sent_again=cannot_resend)
            services.intent_end_absent(intent_id=intent.id, actor=actor, reason=reason, why=cannot_resend)
        else:
            record_decision(intent, user, "absent", reason, [], accepted_duplicate_risk=accept_duplicate_risk)
            services.intent_resolve_absent(
                intent_id=intent.id,
                actor=actor,
                reason=reason,
                data={
                    "accepted_duplicate_risk": accept_duplicate_risk,
                    "provider_deduplicates": deduplicates,
                },
            )
    intent.refresh_from_db()
    return intent


@services.refusals_audited("resolve compensate")
def resolve_compensate(
    *, intent_id: uuid.UUID, user: User, reason: str, provider_reference: str = "",
    seen_seq: int | None = None,
) -> Intent:  # fmt: skip
    """Undo the effect: UNKNOWN -> COMPENSATING and open the compensation intent; the original
    becomes COMPENSATED when the compensation succeeds.

    The effect to undo is ``provider_reference`` or, if empty, the one the reconciler found.

    Raises:
        ResolutionRefused: no permission, no reason, no compensation (``compensate_refusal``: the
            action is not served, declares no compensation, or its compensation is not served),
            or no known effect;
            the reference is another intent's recorded effect, or none was named and the
            lookups' effects cannot be told apart from other intents' (C34).
        IntentMoved: the intent is no longer UNKNOWN.
    """
    intent = load_for_decision(intent_id, user, reason, seen_seq=seen_seq)
    # What the capability model rules out is refused before anything else (issue 39 item 4): an
    # email asked to be compensated hears that it has none, not that no reference was found.
    refusal = compensate_refusal(intent)
    if refusal:
        raise ResolutionRefused(refusal)
    reference = provider_reference.strip()
    if not reference:
        found = found_by_lookup(intent)
        attribution = attribute(intent, found.provider_references) if found else None
        if attribution is not None and attribution.ambiguous:
            # C34: the first listed may be another tenant's booking; never undone on a guess.
            raise ResolutionRefused(
                f"the lookups found effects by this intent's reference, but {attribution.ambiguous}: "
                "name the provider reference of this intent's own effect"
            )
        reference = attribution.own[0] if attribution is not None and attribution.own else ""
    if not reference:
        raise ResolutionRefused(
            "compensate needs the provider reference of the effect to undo; no lookup has found one yet"
        )
    taken = attribute(intent, [reference], by_key=True).others.get(reference)
    if taken:
        raise ResolutionRefused(f"{reference} is {taken}: undoing it is not this intent's compensation")
    with transaction.atomic():
        record_decision(intent, user, "compensate", reason, [reference])
        services.intent_begin_compensation(
            intent_id=intent.id,
            from_status=Intent.Status.UNKNOWN,
            provider_reference=reference,
            actor=f"user:{user.get_username()}",
            reason=reason,
            requested_by=user,
        )
    intent.refresh_from_db()
    return intent


def lookup_now(*, intent_id: uuid.UUID, user: User) -> str:
    """An operator asks for a fresh lookup of an UNKNOWN intent now, whatever its backoff
    (escalated items are looked up at most hourly). The result is recorded and acted on
    exactly as the reconciler would (``reconciliation.lookups.reconcile_intent``).

    Returns:
        ``resolved``, ``retry``, ``waiting``, ``escalated`` or ``moved``.

    Raises:
        ResolutionRefused: no permission. IntentMoved: the intent is no longer UNKNOWN.
    """
    load_for_decision(intent_id, user, "fresh lookup")
    return reconcile_intent(intent_id, actor=f"user:{user.get_username()}")


@services.refusals_audited("resolve")
def resolve_failed_compensation(
    *, intent_id: uuid.UUID, user: User, verb: str, reason: str, seen_seq: int | None = None
) -> Intent:
    """Decide on a COMPENSATING intent whose compensation failed, was rejected, expired or was
    cancelled (escalated by ``reconciliation.duplicates.sweep_compensations``).

    Args:
        verb: ``reopen`` (open a new compensation intent, own key), ``compensated`` (it was
            undone outside the ledger -> COMPENSATED) or ``kept`` (the effect stands -> SUCCEEDED).

    Raises:
        ResolutionRefused: no permission, no reason, an unknown verb.
        IntentMoved: the intent is not an escalated COMPENSATING intent any more.
    """
    intent = load_for_decision(intent_id, user, reason, status=Intent.Status.COMPENSATING, seen_seq=seen_seq)
    actor = f"user:{user.get_username()}"
    if intent.escalated_at is None:
        raise ResolutionRefused("its compensation is still running: wait for it to end")
    with transaction.atomic():
        record_decision(intent, user, f"compensation_{verb}", reason, [])
        if verb == "reopen":
            services.intent_reopen_compensation(
                intent_id=intent.id, actor=actor, reason=reason, requested_by=user
            )
        elif verb in {"compensated", "kept"}:
            services.intent_settle_compensation(
                intent_id=intent.id, compensated=verb == "compensated", actor=actor, reason=reason
            )
        else:
            raise ResolutionRefused(f"unknown decision {verb!r}: reopen, compensated or kept")
    intent.refresh_from_db()
    return intent


@services.refusals_audited("decide duplicate", intent_of=_finding_intent)
def resolve_duplicate_finding(*, finding_id: int, user: User, verb: str, reason: str) -> DuplicateFinding:
    """Decide on an open duplicate finding (an extra effect nobody could undo automatically).

    Args:
        verb: ``acknowledge`` (the extra effect stands or was handled outside; resolved) or
            ``compensate`` (open a new compensation intent, where the action has one).

    Raises:
        ResolutionRefused: no permission, no reason, an unknown verb, no compensation action,
            or the finding is not open.
    """
    check_decider(user, reason)
    actor = f"user:{user.get_username()}"
    with transaction.atomic():
        finding = DuplicateFinding.objects.select_for_update().filter(id=finding_id).first()
        if finding is None:
            raise ResolutionRefused(f"no duplicate finding {finding_id}")
        check_tenant(user, finding.intent.tenant, f"no duplicate finding {finding_id}")
        if finding.state != DuplicateFinding.State.OPEN:
            raise ResolutionRefused(f"this finding is {finding.get_state_display().lower()}, not open")
        record_decision(finding.intent, user, f"duplicate_{verb}", reason, [finding.provider_reference])
        if verb == "acknowledge":
            finding.state, finding.resolved_by = DuplicateFinding.State.RESOLVED, actor
            finding.note = f"acknowledged: {reason}"[:1000]
        elif verb == "compensate":
            compensation = services.intent_open_compensation(
                original=finding.intent,
                provider_reference=finding.provider_reference,
                principal=actor,
                cause="duplicate",
                generation=services.next_compensation_generation(
                    original_id=finding.intent_id, provider_reference=finding.provider_reference
                ),
                requested_by=user,
            )
            finding.state, finding.compensation = DuplicateFinding.State.COMPENSATING, compensation
            finding.note = f"compensation reopened by {actor}: {reason}"[:1000]
        else:
            raise ResolutionRefused(f"unknown decision {verb!r}: acknowledge or compensate")
        finding.save()
    return finding


@services.refusals_audited("release held")
def release_held(
    *, intent_id: uuid.UUID, user: User, reason: str, accept_duplicate_risk: bool, seen_seq: int | None = None
) -> Intent:
    """An operator releases a HELD intent before the rule does: its earlier intent for the same
    business action is still open (or SUCCEEDED: a likely duplicate). A second effect may follow,
    so the duplicate risk must be accepted explicitly (recorded). An intent held because its
    action or version is not served here needs no such acceptance; it is released only once it
    is served again.

    Raises:
        ResolutionRefused: no permission, no reason, risk not accepted, still not served.
        IntentMoved: the intent is not HELD any more.
    """
    intent = load_for_decision(intent_id, user, reason, status=Intent.Status.HELD, seen_seq=seen_seq)
    # Held because this deployment cannot run it (``hold_reason``): no earlier intent to weigh;
    # ``intent_release_held`` refuses while its action or version is still not served.
    if not accept_duplicate_risk and not intent.hold_reason:
        raise ResolutionRefused(
            "an earlier intent for the same business action is open or already succeeded: releasing this "
            "one may create a second effect. Accept the duplicate risk explicitly to release it."
        )
    with transaction.atomic():
        record_decision(intent, user, "release", reason, [], accepted_duplicate_risk=accept_duplicate_risk)
        released = services.intent_release_held(
            intent_id=intent.id,
            actor=f"user:{user.get_username()}",
            reason=reason,
            duplicate_risk_accepted=accept_duplicate_risk,
        )
    return released


@services.refusals_audited("reject held")
def reject_held(*, intent_id: uuid.UUID, user: User, reason: str, seen_seq: int | None = None) -> Intent:
    """An operator rejects a HELD intent: it must not run (e.g. the order was already charged).

    Raises:
        ResolutionRefused: no permission or no reason. IntentMoved: not HELD any more.
    """
    intent = load_for_decision(intent_id, user, reason, status=Intent.Status.HELD, seen_seq=seen_seq)
    with transaction.atomic():
        record_decision(intent, user, "reject", reason, [])
        services.intent_reject_held(intent_id=intent.id, actor=f"user:{user.get_username()}", reason=reason)
    intent.refresh_from_db()
    return intent
