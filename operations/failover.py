"""Detect a database that went back in time and recover from it: what the workers, the beat
and ``manage.py recover`` call (issue 22). The rules live in ``operations.restore_check`` (is
the database behind?) and ``operations.services.failover`` (pause, epoch, guard, recover);
this module joins them to the audit checkpoint re-baseline.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from django.conf import settings

from operations import metrics
from operations.checkpoint_signing import CheckpointUnpublishedError, audit_checkpoint_create
from operations.checkpoints import checkpoint_file_newest, checkpoint_file_path
from operations.models import AuditCheckpoint, RecoveryRun
from operations.restore_check import Behind, database_behind
from operations.services.failover import RecoveryPlan, RecoveryRunning, execution_pause, recover

logger = logging.getLogger("operations.restore")


def pause_if_behind(*, actor: str) -> Behind | None:
    """The check made on every worker's start (and before a delivery the database interrupted):
    when the database is behind the checkpoint file, pause execution. Returns the finding."""
    behind = database_behind()
    if behind is not None:
        metrics.RESTORES_DETECTED.inc()
        execution_pause(reason=behind.reason, actor=actor)
    return behind


def restore_check(*, actor: str) -> str:
    """The beat's periodic check (``operations.restore_check`` task, and once when a worker
    finds the database behind): pause when behind, then recover when
    ``RECOVER_AUTOMATICALLY`` (the default) — since the newest checkpoint the database kept.

    Returns ``level`` (nothing to do), ``paused`` (behind; an operator runs ``recover``),
    ``recovered``, or ``running`` (another recovery holds the lock).
    """
    behind = pause_if_behind(actor=actor)
    if behind is None:
        return "level"
    if not settings.EFFECT_LEDGER["RECOVER_AUTOMATICALLY"]:
        logger.critical("the database went back in time; execution paused until manage.py recover runs")
        return "paused"
    kept = AuditCheckpoint.objects.order_by("-number").values_list("created_at", flat=True).first()
    plan = RecoveryPlan(
        since=kept or datetime(1970, 1, 1, tzinfo=UTC),
        margin_seconds=float(settings.EFFECT_LEDGER["RECOVERY_MARGIN_SECONDS"]),
        actor=actor,
        trigger="detector",
        reason=behind.reason,
    )
    try:
        recover_with_rebaseline(plan)
    except RecoveryRunning:
        return "running"
    return "recovered"


def recover_with_rebaseline(plan: RecoveryPlan) -> RecoveryRun:
    """``services.failover.recover`` with the audit checkpoint re-baseline as its last step:
    when the database is behind the checkpoint file, a checkpoint that follows the file's newest
    is signed over the faults (the chains the restore cut back), with ``accepted.restored``
    naming the checkpoints only the file holds, so later checks find the database level again.

    Raises:
        RecoveryRunning: another recovery is running.
        operations.audit_keys.AuditKeyError: the database is behind but no signing key is at
            hand to re-baseline (the run records it; execution stays paused).
    """

    def rebaseline(run: RecoveryRun) -> int | None:
        if database_behind() is None:
            return None
        newest = checkpoint_file_newest(checkpoint_file_path())
        if newest is None:
            return None
        try:
            row = audit_checkpoint_create(
                accept_faults_reason=(
                    f"recovery #{run.pk} ({run.trigger}, {run.actor}) after the database went back in time"
                ),
                restored_after=newest,
            )
        except CheckpointUnpublishedError as exc:
            logger.error("recovery's checkpoint is stored but not in the file: %s", exc)
            row = AuditCheckpoint.objects.order_by("-number").first()
        return row.number if row else None

    return recover(plan, rebaseline=rebaseline)
