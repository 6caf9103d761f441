"""After the ledger's database went back in time (a restore, a failover to a replica that
lagged): the execution pause, the fence epoch, the restore guard, and ``recover`` (issue 22).

The providers did not go back: the charges and emails of the forgotten minutes happened. What
keeps "at most one effect per intent" true across that:

* **the pause** (``execution_pause``): while set, no claim succeeds, so nothing is sent from
  the older state before recovery ran. The restore check sets it (``operations.restore.check``).
* **the fence epoch**: ``recover`` raises it to the recovery's Unix time in seconds (at least
  one above the stored one), and every claim's fence is at least ``epoch * FENCE_EPOCH_STRIDE``
  + 1, above any fence a provider saw from the forgotten timeline, even one whose epoch the
  restored database never knew (so a keyed provider answers a replay, not ``stale_fence``).
* **the restore guard**: for ``RESTORE_GUARD_SECONDS`` after a recovery, a send to a provider
  that cannot deduplicate on our key is preceded by a look-up
  (``operations.engine.restore_guard.restore_guard``): an effect the forgotten timeline made — for this
  intent, or for the intent an agent re-submitted after the restore lost it — is found and
  recorded instead of sent again.
* **the outbox re-check**: every READY intent gets a fresh message at once (the old one may
  have been consumed by a worker that found the intent in another state).

Each function is short transactions; none calls a provider.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from operations import metrics
from operations.adapters.registry import ActionUnavailable, capabilities_for
from operations.models import OPEN_STATUSES, ExecutionControl, Intent, RecoveryRun
from operations.services.leases import lease_release, lease_renew, lease_try_acquire
from operations.services.recovery import intent_redispatch
from operations.services.transitions import transition

logger = logging.getLogger("operations.restore")

#: The lease (``operations.services.leases``) held by the one recovery that runs: a row, not a
#: session advisory lock, which a pooler in transaction mode would leave on a pooled connection.
RECOVERY_LEASE = "recovery"
#: Seconds the recovery lease lasts; renewed after every step, so only a recovery whose process
#: died (or one step longer than this) lets another start.
RECOVERY_LEASE_SECONDS = 900.0


#: How the restore guard's holds begin (``hold_reason``), for the console and its counts.
RESTORE_GUARD_HOLD = "restore guard:"


class RecoveryRunning(Exception):
    """Another recovery holds the lock; this one did nothing."""


def execution_control() -> ExecutionControl:
    """The control row (created when missing, e.g. after a test flushed the tables)."""
    control, _ = ExecutionControl.objects.get_or_create(id=1)
    return control


def execution_paused() -> bool:
    """Whether execution is paused now (one primary-key read)."""
    return ExecutionControl.objects.filter(id=1, paused_at__isnull=False).exists()


def database_now() -> datetime:
    """The database's ``statement_timestamp()``: the clock leases and guards are measured by."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        (now,) = cursor.fetchone()
    moment: datetime = now
    return moment


def execution_pause(*, reason: str, actor: str) -> bool:
    """Stop every claim until ``execution_resume``: nothing is sent; submissions, approvals,
    look-ups and lease takeovers go on. Returns True when this call paused (False: already)."""
    execution_control()
    paused = ExecutionControl.objects.filter(id=1, paused_at__isnull=True).update(
        paused_at=Now(), pause_reason=reason[:2000], paused_by=actor[:200], updated_at=Now()
    )
    if paused:
        logger.critical("execution paused", extra={"reason": reason, "actor": actor})
    return bool(paused)


def execution_resume(*, actor: str) -> bool:
    """Let claims succeed again. Returns True when execution was paused."""
    resumed = ExecutionControl.objects.filter(id=1, paused_at__isnull=False).update(
        paused_at=None, pause_reason="", paused_by="", updated_at=Now()
    )
    if resumed:
        logger.warning("execution resumed", extra={"actor": actor})
    return bool(resumed)


def guard_settle_at(*, guard_since: datetime, action: str) -> datetime:
    """When an empty look-up under the restore guard proves the forgotten timeline sent
    nothing for an intent of ``action``: its last possible send (the recovery's start, plus one
    lease for a worker that claimed on the old primary and was still calling) plus the
    provider's consistency window (``Capabilities.consistency_window_seconds``)."""
    try:
        window = capabilities_for(action).consistency_window_seconds
    except ActionUnavailable:
        window = 0.0
    lease = float(settings.EFFECT_LEDGER["LEASE_SECONDS"])
    return guard_since + timedelta(seconds=lease + window)


@dataclass(frozen=True)
class RecoveryPlan:
    """What ``recover`` is asked to do.

    Attributes:
        since: the restore point, or earlier (e.g. the time of the newest backup); intents
            that ended after ``since - margin`` at a provider without keys get duplicate checks.
        margin_seconds: how far before ``since`` to look as well (clock skew, replication lag).
        actor: who runs it (``user:<name>``, ``detector:<worker>``).
        trigger: ``operator`` or ``detector``.
        reason: why (the detector's finding, or the operator's words).
    """

    since: datetime
    margin_seconds: float
    actor: str
    trigger: str
    reason: str = ""


def recover(plan: RecoveryPlan, *, rebaseline: Any = None) -> RecoveryRun:
    """Recover after a restore or a failover, before anything is sent again.

    Steps (each committed before the next; the run row records them):

    1. pause execution (if not paused already);
    2. raise the fence epoch to ``max(stored + 1, now in Unix seconds)`` and start the restore
       guard (``RESTORE_GUARD_SECONDS``, default 24 h);
    3. reconcile what the forgotten timeline may have touched:
       UNKNOWN intents are due for a look-up now (READY ones get their message in step 5; their
       send goes through the guard); intents that SUCCEEDED
       after ``since - margin`` at a provider without keys get duplicate checks over its
       consistency window; RUNNING intents are left to the lease takeover (their leases are
       from before the restore), AWAITING_APPROVAL and HELD ones to people (any later send
       goes through the guard) — all counted;
    4. ``rebaseline()`` (the audit checkpoint re-baseline; ``restore_check`` passes it), whose
       return value (a checkpoint number or None) is recorded;
    5. resume execution, then give every READY intent its fresh message (a message published
       while paused would be consumed and dropped).

    Args:
        plan: see ``RecoveryPlan``.
        rebaseline: a callable ``(run) -> int | None`` for step 4, or None to skip it.

    Returns:
        The finished ``RecoveryRun``. On an error before step 5 the run records it, execution
        stays paused (nothing is sent from an unreconciled state) and the error is raised; one
        while re-dispatching is recorded and raised too (the stalled-READY sweep re-dispatches
        what is left).

    Raises:
        RecoveryRunning: another recovery is running (nothing was done).
    """
    held = lease_try_acquire(name=RECOVERY_LEASE, ttl_seconds=RECOVERY_LEASE_SECONDS)
    if held is None:
        raise RecoveryRunning("another recovery is running")
    try:
        return _recover(plan, rebaseline, lambda: lease_renew(held, ttl_seconds=RECOVERY_LEASE_SECONDS))
    finally:
        lease_release(held)


def _recover(plan: RecoveryPlan, rebaseline: Any, renew: Callable[[], bool]) -> RecoveryRun:
    run = RecoveryRun.objects.create(
        started_at=database_now(),
        since=plan.since,
        margin_seconds=plan.margin_seconds,
        trigger=plan.trigger,
        actor=plan.actor[:200],
        reason=plan.reason[:4000],
    )
    logger.critical("recovery started", extra={"recovery": run.pk, "since": plan.since.isoformat()})
    execution_pause(reason=f"recovery #{run.pk} is running: {plan.reason}"[:2000], actor=plan.actor)
    try:
        _raise_epoch(run)
        renew()
        run.counts = _reconcile(plan)
        run.save(update_fields=["counts"])
        renew()
        if rebaseline is not None:
            run.checkpoint_number = rebaseline(run)
            run.save(update_fields=["checkpoint_number"])
            renew()
    except Exception as exc:
        _failed(run, exc, "recovery failed; execution stays paused")
        raise
    execution_resume(actor=plan.actor)
    # After the resume: a message published while paused would be consumed and dropped.
    try:
        run.counts["ready_redispatched"] = _redispatch_ready(run, plan)
    except Exception as exc:
        _failed(
            run, exc, "recovery failed while re-dispatching; the stalled-READY sweep re-dispatches the rest"
        )
        raise
    run.finished_at = timezone.now()
    run.save(update_fields=["counts", "finished_at"])
    metrics.RECOVERIES.labels(result="finished").inc()
    logger.critical("recovery finished", extra={"recovery": run.pk, "counts": run.counts})
    return run


def _failed(run: RecoveryRun, exc: Exception, message: str) -> None:
    run.error = f"{type(exc).__name__}: {exc}"[:4000]
    run.save(update_fields=["error"])
    metrics.RECOVERIES.labels(result="error").inc()
    logger.exception(message, extra={"recovery": run.pk})


def _raise_epoch(run: RecoveryRun) -> None:
    execution_control()
    guard = float(settings.EFFECT_LEDGER["RESTORE_GUARD_SECONDS"])
    with transaction.atomic():
        control = ExecutionControl.objects.select_for_update().get(id=1)
        run.fence_epoch_before = control.fence_epoch
        control.fence_epoch = max(control.fence_epoch + 1, int(time.time()))
        control.guard_started_at = run.started_at
        control.guard_until = run.started_at + timedelta(seconds=guard)
        control.save(update_fields=["fence_epoch", "guard_started_at", "guard_until"])
        run.fence_epoch_after, run.guard_until = control.fence_epoch, control.guard_until
        run.save(update_fields=["fence_epoch_before", "fence_epoch_after", "guard_until"])


def _reconcile(plan: RecoveryPlan) -> dict[str, int]:
    counts: dict[str, int] = {}
    counts["unknown_looked_up"] = Intent.objects.filter(status=Intent.Status.UNKNOWN).update(
        next_lookup_at=Now()
    )
    counts["duplicate_checks"] = _schedule_duplicate_checks(plan)
    for key, status in (
        ("running", Intent.Status.RUNNING),
        ("awaiting_approval", Intent.Status.AWAITING_APPROVAL),
        ("held", Intent.Status.HELD),
    ):
        counts[key] = Intent.objects.filter(status=status).count()
    return counts


def _redispatch_ready(run: RecoveryRun, plan: RecoveryPlan) -> int:
    """A fresh outbox message for every READY intent (audited ``redispatched``)."""
    ready = 0
    reason = f"recovery #{run.pk}: the database went back in time; a fresh message (the old one may be gone)"
    for intent_id in (
        Intent.objects.filter(status=Intent.Status.READY).values_list("id", flat=True).iterator()
    ):
        ready += intent_redispatch(intent_id=intent_id, actor=plan.actor, reason=reason)
    return ready


#: Heads compared per statement when marking forgotten changes.
MARK_BATCH = 5000


def intents_mark_forgotten_changes(heads: list[tuple[str, int, str]], *, actor: str, recovery: int) -> int:
    """Flag the open intents a timeline the database forgot changed after the restore point,
    and make the ones nobody is working on UNKNOWN.

    ``heads`` are the checkpoint file's newest heads ``(intent_id, seq, hash)``: an intent whose
    chain in the database has no event at that seq with that hash was changed by the forgotten
    timeline (approved and sent, cancelled by its agent, rejected...), and the database no
    longer knows how. Open ones (``OPEN_STATUSES``) get ``forgotten_changes``. Those in READY,
    AWAITING_APPROVAL or HELD become UNKNOWN (audited ``forgotten_changes``, due for a lookup
    now): a decision that ends them without an effect (a reject, an expiry, a cancel) must not
    be taken while their effect may exist; the reconciler looks them up (found: SUCCEEDED), and
    should one come back to READY the restore guard looks it up again and holds it for a person
    when nothing is found (the lost change may have been a cancel). RUNNING and UNKNOWN ones
    already go through a lookup. Chains missing from the database altogether are intents the
    restore lost: the agent re-submits those.

    Returns:
        How many intents were flagged (again, for one flagged by an earlier recovery).
    """
    flagged: list[tuple[uuid.UUID, str]] = []
    for start in range(0, len(heads), MARK_BATCH):
        batch = heads[start : start + MARK_BATCH]
        with connection.cursor() as cursor:
            cursor.execute(
                """
                UPDATE operations_intent AS i SET forgotten_changes = true
                FROM unnest(%s::uuid[], %s::integer[], %s::text[]) AS f(intent_id, seq, hash)
                WHERE i.id = f.intent_id AND i.status = ANY(%s)
                  AND NOT EXISTS (
                      SELECT 1 FROM operations_auditevent AS e
                      WHERE e.intent_id = f.intent_id AND e.seq = f.seq AND e.hash = f.hash
                  )
                RETURNING i.id, i.status
                """,
                [[h[0] for h in batch], [h[1] for h in batch], [h[2] for h in batch], sorted(OPEN_STATUSES)],
            )
            flagged += cursor.fetchall()
    reason = (
        f"recovery #{recovery}: a timeline the database forgot changed this intent after the restore point "
        "(sent? cancelled? approved?); its effect may exist: looked up before anything else"
    )
    for intent_id, status in flagged:
        if status in UNSETTLED_BY_RECOVERY and transition(
            intent_id=intent_id,
            from_status=status,
            to_status=Intent.Status.UNKNOWN,
            actor=actor,
            event="forgotten_changes",
            reason=reason,
            data={"recovery": recovery},
            updates={"next_lookup_at": Now(), "not_before": None, "escalated_at": None},
        ):  # a compare-and-swap: an intent a person moved meanwhile stays where they put it
            metrics.UNKNOWN_OUTCOMES.labels(cause="forgotten_changes").inc()
    return len(flagged)


#: The states a recovery turns UNKNOWN when the forgotten timeline changed the intent.
UNSETTLED_BY_RECOVERY = frozenset({Intent.Status.READY, Intent.Status.AWAITING_APPROVAL, Intent.Status.HELD})


def _schedule_duplicate_checks(plan: RecoveryPlan) -> int:
    """Intents that SUCCEEDED after ``since - margin`` at a provider without keys: duplicate
    checks from now over the provider's consistency window plus a lease."""
    after = plan.since - timedelta(seconds=plan.margin_seconds)
    lease = float(settings.EFFECT_LEDGER["LEASE_SECONDS"])
    scheduled = 0
    recent = Intent.objects.filter(status=Intent.Status.SUCCEEDED, updated_at__gte=after)
    for action in recent.values_list("action", flat=True).distinct():
        try:
            capabilities = capabilities_for(action)
        except ActionUnavailable:
            continue
        if not capabilities.duplicates_possible:
            continue
        window = timedelta(seconds=capabilities.consistency_window_seconds + lease)
        scheduled += recent.filter(Q(action=action)).update(
            next_duplicate_check_at=Now(), duplicate_check_until=Now() + window
        )
    return scheduled
