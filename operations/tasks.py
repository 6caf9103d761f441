"""Celery tasks of the ledger: thin wrappers that take ids and call one function."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from typing import Any, TypeVar

from celery import shared_task
from celery.exceptions import Reject
from django.db import DatabaseError, connections
from django.utils import timezone

from operations import metrics, services
from operations.archive.services import ArchiveBusyError, archive_run
from operations.audit import checkpoints, signing
from operations.audit.keys import AuditKeyError
from operations.engine import protocol
from operations.restore import recovery
from operations.services import notifications
from operations.services.periodic_claims import periodic_claim
from operations.workers import outbox
from operations.workers.delivery import database_retry_countdown, database_unavailable

logger = logging.getLogger(__name__)

_Result = TypeVar("_Result")


def period_claimed(job: str, claim_period: float | None) -> bool:
    """Whether this run of periodic job ``job`` may work: always when not run by the beat
    (``claim_period`` None: a kick, a command), else only when it wins the period's claim
    (``operations.services.periodic_claims``), so two beats make one run per period. A run
    that lost is logged at debug level and counted by the caller as skipped."""
    if claim_period is None:
        return True
    won = periodic_claim(job=job, period_seconds=claim_period, claimed_by=protocol.worker_identity())
    if not won:
        logger.debug("periodic run skipped: another scheduler's run claimed this period", extra={"job": job})
    return won


def did_work(result: object) -> bool:
    """Whether a periodic task's ``result`` says it did something: a positive count, ``True``, a
    non-empty list (errors), or any of these inside a dict (``{"published": 0, "errors": []}``
    is idle). Floats are measurements (a lag in seconds), not work; ``None`` and 0 are idle."""
    if isinstance(result, bool):
        return result
    if isinstance(result, int):
        return result > 0
    if isinstance(result, dict):
        return any(did_work(value) for value in result.values())
    if isinstance(result, list | tuple):
        return len(result) > 0
    return False


def periodic_result(job: str, result: _Result, *, worked: bool | None = None) -> _Result:
    """Log what a run of periodic job ``job`` did and return ``result``: at INFO when it did
    something (``worked``, else ``did_work(result)``), at DEBUG when it did nothing, so an idle
    ledger's log stays quiet (Celery's own lines about the run are DEBUG too:
    ``console.log_filters``)."""
    level = logging.INFO if (did_work(result) if worked is None else worked) else logging.DEBUG
    logger.log(level, "periodic job %s: %s", job, result, extra={"job": job})
    return result


@shared_task(
    bind=True, name="operations.execute_intent", acks_late=True, reject_on_worker_lost=True, max_retries=None
)
def execute_intent(self: Any, intent_id: str, message_id: str | None = None) -> str:
    """Execute one intent (see ``operations.engine.protocol.execute_intent``); safe to deliver twice.

    When the database is unreachable (``operations.workers.delivery.database_unavailable``), the
    delivery is retried, never acknowledged and dropped: the broken connections are closed and
    ``Task.retry`` publishes a copy of the message with a short countdown
    (``database_retry_countdown``: 0.5 s doubling to 2 s, with jitter), for as long as the
    database stays away; the copy carries the retry count into the claim's audit event.

    Why ``Task.retry`` and not ``Reject(requeue=True)``: late acknowledgement only covers a worker
    that dies mid-task; an exception the task raises is acknowledged all the same, and expected,
    catchable errors are what ``Task.retry`` is for (Celery FAQ, "Should I use retry or
    acks_late?"). ``retry`` acknowledges the original only after its copy is published, and the
    countdown paces the copies, whereas a requeued message comes straight back, which the Celery
    task guide warns "can easily result in an infinite message loop". If publishing the copy
    fails too (the broker is down as well), Celery would reject the message without requeue; we
    requeue it after the same pause instead, and the stalled-READY sweep is the last net.
    """
    try:
        return protocol.execute_intent(uuid.UUID(intent_id), delivery_retries=self.request.retries)
    except DatabaseError as exc:
        if not database_unavailable(exc):
            raise
        for conn in connections.all(initialized_only=True):
            with contextlib.suppress(Exception):  # it is broken; closing it is all we want
                conn.close()
        countdown = database_retry_countdown(self.request.retries)
        metrics.DATABASE_RETRIES.inc()
        logger.warning(
            "database unreachable; delivery retried",
            extra={"intent_id": intent_id, "retries": self.request.retries, "countdown": round(countdown, 3)},
        )
        try:
            raise self.retry(exc=exc, countdown=countdown, max_retries=None) from exc
        except Reject as rejected:  # Celery's "the copy could not be published"
            time.sleep(countdown)
            raise Reject(f"database and broker unreachable: {rejected}", requeue=True) from exc


@shared_task(name="operations.relay_outbox")
def relay_outbox(claim_period: float | None = None) -> int:
    """Publish pending outbox rows (the periodic safety net behind the post-commit kick); the
    run is recorded for the health page (``operations.services.periodic_job_run``). The beat
    passes ``claim_period`` (seconds): one run per period however many beats (``period_claimed``);
    the rows themselves are claimed with ``SKIP LOCKED`` by any number of relays."""
    if not period_claimed("operations.relay_outbox", claim_period):
        return 0
    with services.periodic_job_run("operations.relay_outbox"):
        return periodic_result("operations.relay_outbox", outbox.outbox_relay())


@shared_task(name="operations.audit_checkpoint")
def audit_checkpoint(claim_period: float | None = None) -> int | None:
    """Sign a checkpoint of the audit chains' heads when they changed since the last one (the
    beat's, every ``AUDIT_CHECKPOINT_PERIOD_SECONDS``); returns its number, or None.

    A missing key or an unwritable checkpoint file is logged as an error, not raised: the next
    period tries again, and ``manage.py check`` warns about the key (``operations.W003``). A
    log altered since the previous checkpoint is never signed over: the refusal is logged as an
    error naming the faults and counted (``effect_ledger_audit_checkpoint_refused_total``), and
    every later period refuses again until an operator acts (docs/explanation/audit-threat-model.md).
    """
    if not period_claimed("operations.audit_checkpoint", claim_period):
        # Another scheduler's run signs this period; this host's file still catches up, so a
        # host whose workers lose every claim does not lag until it wins one.
        signing.checkpoint_file_catch_up()
        return None
    try:
        row = signing.audit_checkpoint_create(only_if_changed=True)
    except signing.CheckpointRefusedError as exc:
        metrics.AUDIT_CHECKPOINTS_REFUSED.inc()
        logger.error("%s", exc, extra={"audit_checkpoint_faults": exc.faults, "omitted": exc.omitted})
        return None
    except (AuditKeyError, checkpoints.CheckpointError) as exc:
        logger.error("audit checkpoint failed: %s", exc)
        return None
    # A checkpoint signed is logged at INFO by the signing itself ("audit checkpoint signed").
    return periodic_result("operations.audit_checkpoint", row.number if row else None, worked=False)


@shared_task(name="operations.archive")
def archive(claim_period: float | None = None) -> dict[str, int]:
    """Archive what retention says is due (``operations.archive.services.archive_run`` with
    ``before`` now: ``INTENT_RETENTION_DAYS``, ``TENANT_RETENTION_DAYS`` decide); returns the
    counts. The beat passes ``claim_period`` (``ARCHIVE_PERIOD_SECONDS``): one run per period
    however many beats, and the archive lease keeps a run that outlasts its period alone.
    A run going on elsewhere is not an error; a missing signing key or an unwritable archive
    directory is logged and recorded as the run's error (health page) and retried next period."""
    if not period_claimed("operations.archive", claim_period):
        return {}
    with services.periodic_job_run("operations.archive"):
        try:
            report = archive_run(before=timezone.now(), progress=logger.debug)
        except ArchiveBusyError:
            return periodic_result("operations.archive", {"busy": 1}, worked=False)
        return periodic_result(
            "operations.archive",
            {
                "segments": report.segments,
                "archived": report.intents_archived,
                "superseded": report.superseded,
                "bytes": report.bytes_written,
            },
        )


@shared_task(name="operations.restore.check")
def restore_check() -> str:
    """Compare the database with the outward checkpoint file (the beat's, every
    ``RESTORE_CHECK_PERIOD_SECONDS``; and once when a worker starts and finds it behind): pause
    execution when the database went back in time, then recover (``operations.restore.recovery``).
    Returns ``level``, ``paused``, ``recovered`` or ``running``.

    Not claimed per period (``period_claimed``): each host compares the database with its own
    file, so a second check is a second witness, and its writes (the pause, the recovery) are
    guarded in the database."""
    result = recovery.restore_check(actor=f"detector:{protocol.worker_identity()}")
    return periodic_result("operations.restore.check", result, worked=result != "level")


@shared_task(name="operations.send_notifications")
def send_notifications(claim_period: float | None = None) -> int:
    """Send the notices to approvers and operators (the beat's, every ``NOTIFY_PERIOD_SECONDS``;
    ``operations.services.notifications.notifications_send``); returns the messages sent."""
    if not period_claimed("operations.send_notifications", claim_period):
        return 0
    with services.periodic_job_run("operations.send_notifications"):
        return periodic_result("operations.send_notifications", notifications.notifications_send())


@shared_task(name="operations.status_rollup")
def status_rollup(claim_period: float | None = None) -> dict[str, int]:
    """Recount SUCCEEDED and the terminal states for the dashboard and ``/metrics`` (the beat's,
    every ``STATUS_ROLLUP_PERIOD_SECONDS``; see ``operations.services.status_rollup``)."""
    if not period_claimed("operations.status_rollup", claim_period):
        return {}
    # Totals recounted, not work done: never worth a line of its own.
    return periodic_result("operations.status_rollup", services.status_rollup_refresh(), worked=False)


@shared_task(name="operations.deliver_webhooks")
def deliver_webhooks(claim_period: float | None = None) -> dict[str, int]:
    """POST the due signed webhooks to agents (the beat's, every ``WEBHOOK_PERIOD_SECONDS``, and
    a kick after each commit that wrote one; see ``operations.services.webhooks``). Returns the
    attempts by result. The run is recorded for the health page."""
    if not period_claimed("operations.deliver_webhooks", claim_period):
        return {}
    with services.periodic_job_run("operations.deliver_webhooks"):
        return periodic_result("operations.deliver_webhooks", services.webhooks_deliver_due())
