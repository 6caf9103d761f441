"""Periodic sweeps that keep every intent moving without the broker's help.

Each sweep claims a bounded batch with ``FOR UPDATE SKIP LOCKED`` (several reconcilers can run
at once without blocking each other) and changes intents only through
``operations.services``. Each pass is O(batch), served by a partial index.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.db.models.functions import Now
from django.utils import timezone

from operations import services
from operations.adapters.registry import ActionUnavailable, capabilities_for
from operations.models import Intent, OutboxMessage
from operations.selectors import ledger_gauges
from operations.workers.delivery import MAX_COUNTDOWN_SECONDS, stalled_ready_seconds
from reconciliation.duplicates import run_duplicate_checks, sweep_compensations
from reconciliation.events import sweep_provider_events
from reconciliation.finding_follow_up import follow_up as provider_findings_follow_up
from reconciliation.held import decide_held
from reconciliation.lookups import reconcile_unknown
from reconciliation.models import ReconciliationRun

logger = logging.getLogger("reconciliation")


@dataclass
class SweepCounts:
    """What one pass did."""

    examined: int = 0
    moved: int = 0


def _batch() -> int:
    return int(settings.EFFECT_LEDGER["RECONCILE_BATCH"])


def _same_key_retry_safe(action: str) -> bool:
    try:
        return capabilities_for(action).same_key_retry_safe
    except ActionUnavailable:
        return False


def take_over_expired_leases(*, batch: int | None = None) -> SweepCounts:
    """RUNNING intents whose lease expired by the database clock -> READY (provider
    deduplicates on the key: same key, next fence) or UNKNOWN (otherwise)."""
    counts = SweepCounts()
    with transaction.atomic():
        rows = list(
            Intent.objects.select_for_update(skip_locked=True)
            .filter(status=Intent.Status.RUNNING, lease_expires_at__lt=Now())
            .order_by("lease_expires_at")
            .values_list("id", "fence", "action")[: batch or _batch()]
        )
        for intent_id, fence, action in rows:
            counts.examined += 1
            if services.intent_take_over_lease(
                intent_id=intent_id, fence=fence, provider_deduplicates=_same_key_retry_safe(action)
            ):
                counts.moved += 1
    return counts


def expire_approvals(*, batch: int | None = None) -> SweepCounts:
    """AWAITING_APPROVAL past its expiry -> EXPIRED; nothing executes."""
    counts = SweepCounts()
    with transaction.atomic():
        ids = list(
            Intent.objects.select_for_update(skip_locked=True)
            .filter(status=Intent.Status.AWAITING_APPROVAL, approval_expires_at__lte=Now())
            .order_by("approval_expires_at")
            .values_list("id", flat=True)[: batch or _batch()]
        )
        for intent_id in ids:
            counts.examined += 1
            if services.intent_expire_approval(intent_id=intent_id):
                counts.moved += 1
    return counts


def redispatch_stalled_ready(
    *, stalled_seconds: float | None = None, batch: int | None = None
) -> SweepCounts:
    """READY intents that have been due and unclaimed for ``stalled_seconds`` (their message was
    lost by the broker, or acknowledged without running) get a fresh outbox message, audited as
    ``redispatched`` with the reason. Duplicates are harmless: the claim's compare-and-swap
    absorbs them.

    Args:
        stalled_seconds: default ``operations.workers.delivery.stalled_ready_seconds()``, derived from
            the relay period, the broker settings and the lease (seconds, not minutes).
        batch: intents per pass (default ``EFFECT_LEDGER["RECONCILE_BATCH"]``).
    """
    threshold = stalled_ready_seconds() if stalled_seconds is None else stalled_seconds
    cutoff = Now() - timedelta(seconds=threshold)
    counts = SweepCounts()
    with transaction.atomic():
        ids = list(
            Intent.objects.select_for_update(skip_locked=True)
            .filter(status=Intent.Status.READY)
            # Unmoved since the threshold, and due since then (a message published with a
            # countdown arrives at not_before, not at updated_at).
            .filter(updated_at__lt=cutoff)
            .filter(Q(not_before__isnull=True) | Q(not_before__lt=cutoff))
            # Not while a due message is unconsumed: the relay publishes it (again, once it is
            # past the stalled bound). A row due later than the intent (its not_before moved
            # back) does not count.
            .filter(
                ~Exists(
                    OutboxMessage.objects.filter(
                        intent_id=OuterRef("pk"),
                        acked_at__isnull=True,
                        due_at__lte=Now() + timedelta(seconds=MAX_COUNTDOWN_SECONDS),
                    )
                )
            )
            .order_by("not_before")
            .values_list("id", flat=True)[: batch or _batch()]
        )
        for intent_id in ids:
            counts.examined += 1
            if services.intent_redispatch(
                intent_id=intent_id,
                actor="reconciler",
                reason=f"due and unclaimed for over {threshold:.1f} s: its delivery is presumed lost",
            ):
                counts.moved += 1
    return counts


def outbox_lag_seconds() -> float:
    """Age in seconds of the oldest unsent outbox message (0 when none), by the database clock."""
    return float(ledger_gauges()["outbox_oldest_pending_seconds"])


def reconcile_pass() -> dict[str, Any]:
    """Run every sweep once, each on a bounded batch, and record the pass as a
    ``ReconciliationRun`` (examined, resolved, escalated, errors, and per-sweep detail) when it
    did or found something; an idle pass (every 5 s) leaves no row. Runs older than
    ``EFFECT_LEDGER["RECONCILIATION_RUN_RETENTION_DAYS"]`` are pruned, a bounded batch a pass.

    One sweep's or one item's failure never aborts the pass: each sweep runs on its own, its
    error is recorded on the run (``detail["errors"]``), and the run is written finished.
    """
    started_at = timezone.now()
    errors: list[str] = []
    examined = resolved = escalated = 0
    detail: dict[str, Any] = {}

    def sweep(name: str, function: Callable[[], Any]) -> Any:
        try:
            return function()
        except Exception as exc:  # recorded on the run; the next sweep still runs
            logger.exception("reconciliation sweep failed", extra={"sweep": name})
            errors.append(f"{name}: {exc!r}"[:300])
            return None

    try:
        # First: stored provider events settle what they prove before any lease is taken over
        # or any lookup is made (issue 19).
        events = sweep("provider_events", sweep_provider_events)
        if events:
            detail["provider_events"] = events
            examined += events
        for name, function in (
            ("leases_taken_over", take_over_expired_leases),
            ("approvals_expired", expire_approvals),
            ("redispatched", redispatch_stalled_ready),
        ):
            counts = sweep(name, function)
            if counts is not None:
                detail[name] = counts.moved
                examined += counts.examined
                resolved += counts.moved
        unknown = sweep("unknown", reconcile_unknown)
        if unknown is not None:
            detail["unknown_examined"] = unknown.examined
            examined, resolved, escalated = (
                examined + unknown.examined,
                resolved + unknown.resolved,
                escalated + unknown.escalated,
            )
            errors.extend(unknown.errors)
        duplicates = sweep("duplicates", run_duplicate_checks)
        if duplicates is not None:
            detail["duplicate_checks"] = duplicates.examined
            detail["duplicates_found"] = duplicates.found
            examined += duplicates.examined
            errors.extend(duplicates.errors)
        compensations = sweep("compensations", sweep_compensations)
        if compensations is not None:
            detail["compensations_escalated"] = compensations.escalated
            escalated += compensations.escalated
            errors.extend(compensations.errors)
        held = sweep("held", decide_held)
        if held is not None:
            detail["held_released"] = held.released
            detail["held_to_a_person"] = held.to_a_person
            examined += held.examined
            resolved += held.released + held.rejected
            escalated += held.to_a_person
            errors.extend(held.errors)
        # Provider findings whose compensation ended (issue 19; reconciliation.finding_follow_up).
        followed = sweep("provider_findings", provider_findings_follow_up)
        if followed:
            detail["provider_findings_followed_up"] = followed
            resolved += followed
        lag = sweep("outbox_lag", outbox_lag_seconds)
        if lag is not None:
            detail["outbox_lag_seconds"] = round(lag, 3)
            detail["outbox_lag_warning"] = lag > settings.EFFECT_LEDGER["OUTBOX_LAG_WARNING_SECONDS"]
    finally:
        detail["errors"] = errors[:50]
        if examined or resolved or escalated or errors or detail.get("outbox_lag_warning"):
            ReconciliationRun.objects.create(
                started_at=started_at,
                finished_at=timezone.now(),
                examined=examined,
                resolved=resolved,
                escalated=escalated,
                errors=len(errors),
                detail=detail,
            )
        prune_reconciliation_runs()
    return detail


#: Reconciliation runs pruned per pass at most (a bounded delete on the ``recon_run_started`` index).
RUN_PRUNE_BATCH = 1000


def prune_reconciliation_runs() -> int:
    """Delete up to ``RUN_PRUNE_BATCH`` reconciliation runs older than
    ``EFFECT_LEDGER["RECONCILIATION_RUN_RETENTION_DAYS"]`` (default 7); returns how many."""
    days = float(settings.EFFECT_LEDGER.get("RECONCILIATION_RUN_RETENTION_DAYS", 7))
    old = ReconciliationRun.objects.filter(started_at__lt=Now() - timedelta(days=days)).order_by("started_at")
    deleted, _ = ReconciliationRun.objects.filter(
        id__in=list(old.values_list("id", flat=True)[:RUN_PRUNE_BATCH])
    ).delete()
    return deleted
