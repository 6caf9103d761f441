"""The Celery application (settings namespace ``CELERY``) and the beat schedule."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.schedules import crontab
from celery.signals import beat_init, task_postrun, worker_init
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connections

from operations.workers.beat_heartbeat import beat_heartbeat_start
from operations.workers.heartbeat import WorkerHeartbeatStep

# The settings module Django loads, unless the environment names another.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

# Product tasks only: autodiscovery finds ``<app>.tasks`` of the installed apps (operations,
# reconciliation). The lab's tasks live in modules of other names (console.lab.LAB_TASK_MODULES)
# and are registered only by workers started with ``--include`` of them (console/lab/cluster.py).
app = Celery("effect_ledger")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# The default app of every thread, so ``celery.current_app`` (used by the ledger to publish,
# without importing this package) is this app in thread pools and on_commit callbacks too.
app.set_default()
# Every worker records its heartbeat in the database (the health page reads it; operations.workers.heartbeat).
app.steps["worker"].add(WorkerHeartbeatStep)


# Every beat process records its own heartbeat, so a second beat is seen on the health page
# (operations.workers.beat_heartbeat; run exactly one beat: docs/how-to/deploy.md).
beat_init.connect(beat_heartbeat_start, weak=False)


def _every(period_setting: str) -> dict[str, Any]:
    """A schedule entry's timing every ``EFFECT_LEDGER[period_setting]`` seconds, with that
    period passed to the task as ``claim_period``: the task claims its run per period in the
    database (``operations.tasks.period_claimed``), so two beats make one run per period."""
    period = float(settings.EFFECT_LEDGER[period_setting])
    return {"schedule": period, "kwargs": {"claim_period": period}}


_STATEMENT_PERIOD = float(settings.EFFECT_LEDGER["STATEMENT_PERIOD_SECONDS"])

# The periodic safety nets, declared in code. Each task claims a bounded batch, so a pass
# costs O(batch) whatever the table size. The periods (seconds) are settings, because the
# stalled-READY sweep derives its threshold from the relay's (operations.workers.delivery).
app.conf.beat_schedule = {
    "relay-outbox": {
        "task": "operations.relay_outbox",
        **_every("RELAY_PERIOD_SECONDS"),
    },
    "reconcile": {
        "task": "reconciliation.reconcile",
        **_every("RECONCILE_PERIOD_SECONDS"),
    },
    # A signed checkpoint of every audit chain's head (skipped when nothing changed); it reads
    # one consistent snapshot without locking the writers (operations.audit.checkpoints).
    "audit-checkpoint": {
        "task": "operations.audit_checkpoint",
        **_every("AUDIT_CHECKPOINT_PERIOD_SECONDS"),
    },
    # Settled intents past their retention leave for signed archive files (operations.archive;
    # INTENT_RETENTION_DAYS, TENANT_RETENTION_DAYS): one run per period, under the archive lease.
    "archive": {
        "task": "operations.archive",
        **_every("ARCHIVE_PERIOD_SECONDS"),
    },
    # Has the database gone back in time (a restore, a failover)? Compared with the outward
    # checkpoint file; behind, execution pauses and recovery runs (operations.restore.recovery).
    # Not claimed per period: each host compares with its own file (a second witness).
    "restore-check": {
        "task": "operations.restore.check",
        "schedule": settings.EFFECT_LEDGER["RESTORE_CHECK_PERIOD_SECONDS"],
    },
    # Notices to approvers and operators: digested and rate-limited per recipient
    # (operations.services.notifications).
    "send-notifications": {
        "task": "operations.send_notifications",
        **_every("NOTIFY_PERIOD_SECONDS"),
    },
    # SUCCEEDED and the terminal states counted with one GROUP BY for the dashboard and /metrics
    # (operations.services.status_rollup_refresh: why a period and not a counter per transition).
    "status-rollup": {
        "task": "operations.status_rollup",
        **_every("STATUS_ROLLUP_PERIOD_SECONDS"),
    },
    # Signed webhooks to agents due now (first attempts a commit's kick missed, and retries).
    "deliver-webhooks": {
        "task": "operations.deliver_webhooks",
        **_every("WEBHOOK_PERIOD_SECONDS"),
    },
    # What is no evidence of an intent's history, once settled and past its retention:
    # acknowledged outbox rows, settled webhook deliveries, old provider event bodies
    # (reconciliation.pruning; bounded batches, each its own short transaction).
    "prune": {
        "task": "reconciliation.prune",
        **_every("PRUNE_PERIOD_SECONDS"),
    },
    # Yesterday's statement of every source with a statement API, reconciled both ways, daily
    # at 02:00 UTC (after the day closed; reconciliation.statements); every
    # STATEMENT_PERIOD_SECONDS where that is shorter than a day (the lab). One scheduled run per
    # source and day, by a claim per period and a unique constraint (issue 35).
    "reconcile-statements": {
        "task": "reconciliation.reconcile_statements",
        "schedule": crontab(hour=2, minute=0) if _STATEMENT_PERIOD >= 86400 else _STATEMENT_PERIOD,
        "kwargs": {"claim_period": _STATEMENT_PERIOD},
    },
}


# Database sessions in workers (issue 13). Celery's Django fix-up closes every connection before
# and after every task unless CELERY_DB_REUSE_MAX is set (settings): a new PostgreSQL session,
# a server process and its set-up, per intent. With it set, a worker keeps its connection as a
# web process does, and after each task does what Django's request cycle does: close a
# connection older than CONN_MAX_AGE or left unusable by an error (``close_old_connections``).
# No health check before reuse in workers (a ``SELECT 1`` and a commit per task): a task that
# finds its connection broken (the database restarted) closes it and is delivered again
# (``operations.tasks.execute_intent``).
@worker_init.connect
def _no_health_check_in_workers(**_: Any) -> None:
    connections.settings[DEFAULT_DB_ALIAS]["CONN_HEALTH_CHECKS"] = False


@task_postrun.connect
def _close_old_connections(**_: Any) -> None:
    close_old_connections()
