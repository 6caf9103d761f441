"""Detect a database that went back in time and recover from it: what the workers, the beat
and ``manage.py recover`` call (issue 22). The rules live in ``operations.restore.check`` (is
the database behind?) and ``operations.services.failover`` (pause, epoch, guard, recover);
this module joins them to the audit checkpoint re-baseline.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from itertools import islice

from django.conf import settings

from operations import metrics
from operations.audit.chain_checks import audit_verify
from operations.audit.checkpoint_file import checkpoint_file_newest, checkpoint_file_path
from operations.audit.keys import public_key_load
from operations.audit.signing import CheckpointUnpublishedError, audit_checkpoint_create
from operations.audit.verification import checkpoint_verify
from operations.models import AuditCheckpoint, RecoveryRun
from operations.restore.check import Behind, database_behind
from operations.services.failover import (
    RecoveryPlan,
    RecoveryRunning,
    execution_pause,
    intents_mark_forgotten_changes,
    recover,
)

logger = logging.getLogger("operations.restore")


def pause_if_behind(*, actor: str) -> Behind | None:
    """The check made on every worker's start (and before a delivery the database interrupted):
    when the database is behind the checkpoint file, pause execution. Returns the finding."""
    behind = database_behind()
    if behind is not None and execution_pause(reason=behind.reason, actor=actor):
        metrics.RESTORES_DETECTED.inc()
    return behind


def restore_check(*, actor: str) -> str:
    """The beat's periodic check (``operations.restore.check`` task, and once when a worker
    finds the database behind): pause when behind, then recover when
    ``RECOVER_AUTOMATICALLY`` (the default) — since the newest checkpoint the database kept.

    Returns ``level`` (nothing to do), ``paused`` (behind; an operator runs ``recover``),
    ``recovered``, ``running`` (another recovery holds the lock), or ``refused`` (the database
    does not match its own newest checkpoint: ``AuditFaultsRefused``; not retried by itself).
    """
    behind = pause_if_behind(actor=actor)
    if behind is None:
        return "level"
    if not settings.EFFECT_LEDGER["RECOVER_AUTOMATICALLY"]:
        logger.critical("the database went back in time; execution paused until manage.py recover runs")
        return "paused"
    refused = RecoveryRun.objects.order_by("-started_at", "-id").values_list("error", flat=True).first()
    if refused and refused.startswith(AuditFaultsRefused.__name__):
        # Not retried by itself: the faults need a person (docs/how-to/failover-runbook.md).
        return "refused"
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
    except AuditFaultsRefused as exc:
        logger.critical("automatic recovery refused; execution stays paused: %s", exc)
        return "refused"
    return "recovered"


class AuditFaultsRefused(Exception):
    """The database does not match its own newest audit checkpoint: not what a restore leaves
    (a restore to any point after a checkpoint keeps every head that checkpoint saw). Nothing
    was re-baselined; execution stays paused until an operator looks and decides."""


#: Faults named in ``AuditFaultsRefused``'s message (the rest are counted).
FAULTS_NAMED = 10


def recover_with_rebaseline(plan: RecoveryPlan, *, accept_audit_faults: str | None = None) -> RecoveryRun:
    """``services.failover.recover`` with the audit checkpoint re-baseline as its last step
    before execution resumes, when the database is behind the checkpoint file:

    1. the database must look like a restore: its chains whole and every intent where its
       chain left it (``audit.audit_verify``: intent and events are written in one transaction,
       so a snapshot has both), its own newest checkpoint's heads all there
       (``checkpoint_verify`` against the stored series), and at least one checkpoint (without
       one, a restore cannot be told from a wiped or new database). Otherwise
       ``AuditFaultsRefused`` — unless an operator passes ``accept_audit_faults`` (a reason,
       recorded with the faults in the signed checkpoint). The detector never does;
    2. the open intents the forgotten timeline changed are flagged, and made UNKNOWN when READY,
       AWAITING_APPROVAL or HELD (``services.failover.intents_mark_forgotten_changes``);
    3. a checkpoint that follows the file's newest is signed over the faults (the chains the
       restore cut back), with ``accepted.restored`` naming the checkpoints only the file holds.

    Raises:
        RecoveryRunning: another recovery is running.
        AuditFaultsRefused: see step 1 (the run records it; execution stays paused).
        operations.audit.keys.AuditKeyError: no key to verify or sign with (the same).
    """

    def rebaseline(run: RecoveryRun) -> int | None:
        if database_behind() is None:
            return None
        own = checkpoint_verify(public_key=public_key_load(), checkpoint_file=None)
        faults = [str(fault) for fault in own.faults]
        # A restore leaves every chain whole and every intent where its chain left it (they are
        # written in one transaction), and, past its first checkpoint, that checkpoint's heads.
        breaks = list(islice(audit_verify(), FAULTS_NAMED))
        faults += [f"intent {b.intent_id}: {b.problem}" for b in breaks]
        if not AuditCheckpoint.objects.exists():
            faults.append(
                "the database holds no audit checkpoint: a restore to before its first checkpoint cannot be told "
                "from a wiped or new database"
            )
        if faults and accept_audit_faults is None:
            named = "; ".join(faults[:FAULTS_NAMED])
            more = len(faults) + own.omitted - min(len(faults), FAULTS_NAMED)
            raise AuditFaultsRefused(
                "the database does not match its own audit log and newest checkpoint as a restore leaves "
                f"them: {named}" + (f"; and {more} more" if more > 0 else "") + ". Nothing was "
                "re-baselined and execution stays paused: investigate (manage.py verify_audit), then run "
                "manage.py recover --since <restore point> --accept-audit-faults <reason>"
            )
        newest = checkpoint_file_newest(checkpoint_file_path())
        if newest is None:
            return None
        run.counts["changed_after_restore_point"] = intents_mark_forgotten_changes(
            newest.head_rows(), actor=run.actor, recovery=run.pk
        )
        run.save(update_fields=["counts"])
        reason = f"recovery #{run.pk} ({run.trigger}, {run.actor}) after the database went back in time"
        if accept_audit_faults is not None and faults:
            reason += f"; audit faults accepted by the operator: {accept_audit_faults}"
        try:
            row = audit_checkpoint_create(accept_faults_reason=reason, restored_after=newest)
        except CheckpointUnpublishedError as exc:
            logger.error("recovery's checkpoint is stored but not in the file: %s", exc)
            row = AuditCheckpoint.objects.order_by("-number").first()
        return row.number if row else None

    return recover(plan, rebaseline=rebaseline)
