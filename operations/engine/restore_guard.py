"""The restore guard's check before a send (DESIGN.md, "When the database goes back in time";
issue 22): after the database went back in time, an intent for a provider that cannot
deduplicate on our key is looked up before it is sent, since a timeline the database forgot may
already have made its effect. ``operations.engine.protocol`` calls ``restore_guard`` after the
claim and before the approval re-check; the guard's window itself is ``services.failover``.
"""

from __future__ import annotations

import logging

from operations import metrics
from operations.adapters.base import LookupKind, LookupStatus
from operations.adapters.bounds import reference_problem
from operations.adapters.registry import ActionUnavailable, capabilities_for
from operations.engine.calls import provider_lookup
from operations.services import claims
from operations.services import execution as svc
from operations.services.failover import RESTORE_GUARD_HOLD, database_now, guard_settle_at

# The protocol's logger: one name for everything a delivery logs.
logger = logging.getLogger("operations.engine.protocol")

#: Events after which a person has decided to send an intent the restore guard stopped.
_GUARD_OVERRIDES = ("released", "outcome_absent")


def restore_guard(claim: claims.Claim, context: dict[str, object]) -> str | None:
    """Under the restore guard (``services.failover``; issue 22), before sending to a provider
    that cannot deduplicate on our key: did a timeline the database forgot already make this
    effect? None means send; otherwise the label of what happened instead:

    ==========================  =============================================================
    look-up                     what happens (nothing is sent)
    ==========================  =============================================================
    FOUND                       ``succeeded``: SUCCEEDED with the found receipt (outcome
                                source ``reconciler``); two or more schedule duplicate checks
    nothing found, before the   ``deferred``: READY again, due at the settle point (the
    settle point                recovery's start + a lease + the consistency window)
    nothing found, after it     None: send; ``held`` for a person when the intent has
                                ``forgotten_changes`` (the lost change may be a cancel)
    anything else               ``unknown``: UNKNOWN, cause ``restore_guard``, for the
                                reconciler and operators
    no look-up possible         ``held``: HELD for a person, unless one already released it
                                (or said ``absent``) since the recovery
    ==========================  =============================================================

    An intent with ``forgotten_changes`` is looked up at keyed providers too, and after the
    guard's window has ended.
    """
    since = claim.restore_guard_since
    intent = claim.intent
    marked = intent.forgotten_changes
    if since is None and not marked:
        return None
    try:
        capabilities = capabilities_for(intent.action)
    except ActionUnavailable:
        return None  # served when claimed (_hold_if_unserved); the call fails on its own
    if not capabilities.duplicates_possible and not marked:
        return None  # the provider deduplicates on our key: a replay, never a second effect
    # Only a person's decision counts (the reconciler's authoritative absence does not: the
    # forgotten change may have been a cancel, which no lookup can see).
    overrides = intent.audit_events.filter(event__in=_GUARD_OVERRIDES, actor__startswith="user:")
    if overrides.filter(created_at__gte=since).exists() if since else overrides.exists():
        return None  # a person decided to send it after the recovery
    if capabilities.lookup == LookupKind.NONE and not capabilities.list_by_reference:
        metrics.RESTORE_GUARD_CHECKS.labels(decision="held").inc()
        problem = (
            f"{RESTORE_GUARD_HOLD} the database went back in time and this provider offers no look-up, so whether "
            "the forgotten timeline already sent this"
            + (" (or cancelled or rejected it)" if marked else "")
            + " cannot be known here; confirm with the provider, then release or reject"
        )
        return "held" if svc.intent_hold_restored(claim=claim, problem=problem) else "stale"
    result = provider_lookup(intent)
    evidence = {"restore_guard": {"lookup": result.status.value, **result.detail}}
    found_storable = bool(result.provider_references) and not reference_problem(result.provider_references[0])
    if result.status == LookupStatus.FOUND and found_storable:
        metrics.RESTORE_GUARD_CHECKS.labels(decision="found").inc()
        logger.warning("restore guard found the effect; not sent again", extra=context)
        found = svc.intent_record_found_before_send(
            claim=claim, provider_references=list(result.provider_references), detail=evidence
        )
        return "succeeded" if found else "stale"
    if result.status in {LookupStatus.NOT_FOUND_YET, LookupStatus.ABSENT}:
        settle = guard_settle_at(guard_since=since, action=intent.action) if since else None
        if settle is not None and database_now() < settle:
            metrics.RESTORE_GUARD_CHECKS.labels(decision="deferred").inc()
            deferred = svc.intent_defer_for_restore(claim=claim, not_before=settle, detail=evidence)
            return "deferred" if deferred else "stale"
        if marked:
            # Not sent, yet changed after the restore point: perhaps cancelled or rejected.
            metrics.RESTORE_GUARD_CHECKS.labels(decision="held").inc()
            problem = (
                f"{RESTORE_GUARD_HOLD} a timeline the database forgot changed this intent after the restore point and "
                "the provider has no effect of it: it may have been cancelled, rejected or refused there; ask "
                "whoever submitted it, then release (send) or reject"
            )
            return "held" if svc.intent_hold_restored(claim=claim, problem=problem) else "stale"
        metrics.RESTORE_GUARD_CHECKS.labels(decision="send").inc()
        return None
    metrics.RESTORE_GUARD_CHECKS.labels(decision="unknown").inc()
    marked = svc.intent_mark_unknown(
        claim=claim,
        error=f"restore guard: the look-up before sending was {result.status.value}; nothing sent",
        cause="restore_guard",
        detail=evidence,
    )
    return "unknown" if marked else "stale"
