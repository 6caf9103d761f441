"""Reads behind the health page (``/health/``): workers, broker queues, the outbox, the
periodic jobs and the provider calls of the last hour, each judged green, amber or red.

Every figure comes from the database except the queue depths, which ask the broker with a
bounded wait (``HEALTH_BROKER_TIMEOUT_SECONDS``) and say "unknown" with the reason rather than
fail. Thresholds are settings (``EFFECT_LEDGER["HEALTH_*"]``; docs/reference/console.md, the health
signals table).

The workers, the outbox and the periodic jobs are read here; the broker's queues in
``operations.selectors.broker_queues``, the provider calls in ``operations.selectors.provider_calls``,
and the levels they are judged by in ``operations.selectors.health_levels``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection

from operations.access.tenants import TenantScope
from operations.models import Attempt, BeatHeartbeat, OutboxMessage, PeriodicJobRun, WorkerHeartbeat
from operations.selectors.beats import beats_seen, beats_signal
from operations.selectors.broker_queues import broker_queue_depths, broker_signal
from operations.selectors.health_levels import AMBER, GREEN, RED, Signal, health_settings, worst
from operations.selectors.provider_calls import provider_call_stats, providers_signal
from operations.workers.delivery import stalled_ready_seconds

#: The periodic jobs the page follows: (task name, label, setting of its period in seconds).
#: Seconds after one period from the beat's start that a job that never ran is still "not due
#: yet": the beat's and the worker's start-up, and a run that is under way.
NOT_DUE_GRACE_SECONDS = 60.0

PERIODIC_JOBS: tuple[tuple[str, str, str], ...] = (
    ("operations.relay_outbox", "Outbox relay", "RELAY_PERIOD_SECONDS"),
    ("reconciliation.reconcile", "Reconciler", "RECONCILE_PERIOD_SECONDS"),
    ("operations.deliver_webhooks", "Webhook deliveries", "WEBHOOK_PERIOD_SECONDS"),
    ("operations.send_notifications", "Notifications", "NOTIFY_PERIOD_SECONDS"),
    ("reconciliation.reconcile_statements", "Statement reconciliation", "STATEMENT_PERIOD_SECONDS"),
    ("reconciliation.prune", "Pruning", "PRUNE_PERIOD_SECONDS"),
    ("operations.archive", "Archive", "ARCHIVE_PERIOD_SECONDS"),
)


@dataclass
class WorkerRow:
    """A worker's last heartbeat; ``state`` is ``alive``, ``late``, ``gone`` or ``stopped``."""

    hostname: str
    pid: int
    queues: list[str]
    concurrency: int
    started_at: Any
    beat_at: Any
    age_seconds: float
    stopped_at: Any
    state: str


def worker_heartbeats(*, limit: int = 50) -> list[WorkerRow]:
    """The newest worker heartbeats (database clock), each judged by the age of its last beat:
    alive up to ``HEALTH_WORKER_LATE_SECONDS``, late up to ``HEALTH_WORKER_GONE_SECONDS``, gone
    beyond; ``stopped`` when the worker said goodbye (a warm shutdown). Served by
    ``worker_heartbeat_beat``."""
    late = float(health_settings()["HEALTH_WORKER_LATE_SECONDS"])
    gone = float(health_settings()["HEALTH_WORKER_GONE_SECONDS"])
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT hostname, pid, queues, concurrency, started_at, beat_at, stopped_at,
                   EXTRACT(EPOCH FROM statement_timestamp() - beat_at)
            FROM {WorkerHeartbeat._meta.db_table} ORDER BY beat_at DESC LIMIT %s
            """,
            [limit],
        )
        rows = cursor.fetchall()
    workers = []
    for hostname, pid, queues, concurrency, started_at, beat_at, stopped_at, age in rows:
        age = max(0.0, float(age))
        if stopped_at is not None:
            state = "stopped"
        elif age <= late:
            state = "alive"
        elif age <= gone:
            state = "late"
        else:
            state = "gone"
        workers.append(
            WorkerRow(
                hostname=hostname,
                pid=pid,
                queues=_json_list(queues),
                concurrency=concurrency,
                started_at=started_at,
                beat_at=beat_at,
                age_seconds=age,
                stopped_at=stopped_at,
                state=state,
            )
        )
    return workers


def _json_list(value: Any) -> list[str]:
    # A raw cursor hands jsonb over as text (Django registers no JSON loader on it).
    if isinstance(value, str | bytes):
        value = json.loads(value)
    return [str(item) for item in value] if isinstance(value, list) else []


def workers_signal(workers: list[WorkerRow]) -> Signal:
    """Red when no worker is alive (none ever seen, or every one late, gone or stopped); amber
    when one that is not stopped is late or gone; green otherwise."""
    alive = sum(1 for w in workers if w.state == "alive")
    troubled = [w for w in workers if w.state in ("late", "gone")]
    if not workers:
        return Signal("workers", "Workers", RED, "no worker has ever recorded a heartbeat")
    if not alive:
        return Signal("workers", "Workers", RED, "no worker is alive")
    if troubled:
        late = sum(1 for w in troubled if w.state == "late")
        gone = len(troubled) - late
        return Signal("workers", "Workers", AMBER, f"{alive} alive, {late} late, {gone} gone")
    return Signal("workers", "Workers", GREEN, f"{alive} alive")


def outbox_backlog() -> dict[str, Any]:
    """The relay's backlog (every tenant's; served by ``outbox_due_q`` and ``outbox_unacked``).

    Returns:
        ``pending``: rows due and never handed to the broker; ``oldest_pending_seconds``: how
        long the oldest of them has been due (0 when none); ``scheduled``: rows not due yet (a
        retry's backoff, not lag); ``stalled``: rows handed over but unacknowledged for longer
        than ``operations.workers.delivery.stalled_ready_seconds()`` (the relay publishes them again).
    """
    table = OutboxMessage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT count(*) FILTER (WHERE due_at <= statement_timestamp()),
                   count(*) FILTER (WHERE due_at > statement_timestamp()),
                   COALESCE(EXTRACT(EPOCH FROM statement_timestamp()
                            - min(due_at) FILTER (WHERE due_at <= statement_timestamp())), 0)
            FROM {table} WHERE sent_at IS NULL AND acked_at IS NULL
            """
        )
        pending, scheduled, oldest = cursor.fetchone()
        cursor.execute(
            f"SELECT count(*) FROM {table} WHERE sent_at IS NOT NULL AND acked_at IS NULL"
            " AND sent_at < statement_timestamp() - make_interval(secs => %s)",
            [stalled_ready_seconds()],
        )
        (stalled,) = cursor.fetchone()
    return {
        "pending": int(pending),
        "scheduled": int(scheduled),
        "oldest_pending_seconds": float(oldest),
        "stalled": int(stalled),
    }


def outbox_signal(backlog: dict[str, Any]) -> Signal:
    """By the age of the oldest due, unsent row: amber past ``OUTBOX_LAG_WARNING_SECONDS`` (or
    any row stalled after its hand-off), red past ``HEALTH_OUTBOX_RED_SECONDS``."""
    oldest = backlog["oldest_pending_seconds"]
    level = GREEN
    if oldest > float(health_settings()["HEALTH_OUTBOX_RED_SECONDS"]):
        level = RED
    elif oldest > float(health_settings()["OUTBOX_LAG_WARNING_SECONDS"]) or backlog["stalled"]:
        level = AMBER
    summary = f"{backlog['pending']} pending, oldest {oldest:.0f} s; {backlog['stalled']} stalled"
    return Signal("outbox", "Outbox backlog", level, summary)


def periodic_jobs() -> list[dict[str, Any]]:
    """The last run of each periodic job (``PERIODIC_JOBS``), judged by its age in periods of
    the job: amber past ``HEALTH_JOB_AMBER_PERIODS`` (or when the last run raised), red past
    ``HEALTH_JOB_RED_PERIODS``. A job that never ran is judged by how long the beat seen now has
    been up: green (``not_due``) for one period plus ``NOT_DUE_GRACE_SECONDS`` (a daily job on a
    fresh install is not unhealthy), amber for one period more, then red; red when no beat is
    seen (issue 39 item 1)."""
    names = [name for name, _, _ in PERIODIC_JOBS]
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT name, last_started_at, last_finished_at, last_duration_ms, last_error, last_succeeded_at,
                   EXTRACT(EPOCH FROM statement_timestamp() - last_finished_at)
            FROM {PeriodicJobRun._meta.db_table} WHERE name = ANY(%s)
            """,
            [names],
        )
        found = {row[0]: row for row in cursor.fetchall()}
        # How long the beat running now has been up: a job it has not had a period to run yet is
        # not due, not failing (a fresh install, a job added by an upgrade).
        cursor.execute(
            f"SELECT EXTRACT(EPOCH FROM statement_timestamp() - min(started_at)) FROM {BeatHeartbeat._meta.db_table} "
            "WHERE seen_at >= statement_timestamp() - make_interval(secs => %s)",
            [float(health_settings()["HEALTH_BEAT_WINDOW_SECONDS"])],
        )
        (beat_up,) = cursor.fetchone()
    amber_periods = float(health_settings()["HEALTH_JOB_AMBER_PERIODS"])
    red_periods = float(health_settings()["HEALTH_JOB_RED_PERIODS"])
    jobs = []
    for name, label, period_setting in PERIODIC_JOBS:
        period = float(health_settings()[period_setting])
        job: dict[str, Any] = {"name": name, "label": label, "period_seconds": period}
        row = found.get(name)
        if row is None:
            # Due one period (and a start-up grace) after the running beat started; then amber
            # for one more period, then red. No beat seen: red.
            due_after = period + NOT_DUE_GRACE_SECONDS
            up = None if beat_up is None else float(beat_up)
            not_due = up is not None and up <= due_after
            level = GREEN if not_due else AMBER if up is not None and up <= due_after + period else RED
            job.update(
                ran=False,
                level=level,
                not_due=not_due,
                due_after_seconds=due_after,
                beat_up_seconds=up,
                age_seconds=None,
                error="",
            )
        else:
            _, started, finished, duration_ms, error, succeeded, age = row
            age = max(0.0, float(age))
            level = GREEN
            if age > red_periods * period:
                level = RED
            elif age > amber_periods * period or error:
                level = AMBER
            job.update(
                ran=True,
                level=level,
                started_at=started,
                finished_at=finished,
                duration_ms=duration_ms,
                error=error,
                succeeded_at=succeeded,
                age_seconds=age,
            )
        job["amber_after_seconds"] = amber_periods * period
        job["red_after_seconds"] = red_periods * period
        jobs.append(job)
    return jobs


def periodic_jobs_signal(jobs: list[dict[str, Any]]) -> Signal:
    """The worst job; a job that never ran is named."""
    parts = []
    for job in jobs:
        if not job["ran"]:
            parts.append(f"{job['label']}: {'not due yet' if job.get('not_due') else 'never ran'}")
        else:
            parts.append(
                f"{job['label']}: {job['age_seconds']:.0f} s ago" + (" (failed)" if job["error"] else "")
            )
    return Signal("jobs", "Periodic jobs", worst(*(job["level"] for job in jobs)), "; ".join(parts))


def system_health(*, scope: TenantScope, system_wide: bool) -> dict[str, Any]:
    """Everything the health page shows, for a reader of ``scope``.

    Args:
        scope: the tenants whose provider calls are counted (attempts belong to tenants).
        system_wide: whether the signals of no tenant (workers, broker, outbox, periodic jobs)
            are read too: for a role on every tenant only, like the dashboard's outbox and
            counters (they describe the machinery every tenant shares, and name hosts).

    Returns:
        ``signals`` (list of ``Signal``, the summary), ``overall`` (the worst level), ``partial``
        (true when the signals of no tenant were not read, so ``overall`` speaks for the
        reader's provider calls only and must not be shown as the system's), and the details:
        ``workers``, ``broker``, ``outbox``, ``jobs``, ``providers``; the beat signal (exactly
        one beat, ``operations.selectors.beats``) is among ``signals``; those of no tenant are
        None when ``system_wide`` is false.
    """
    providers = provider_call_stats(scope=scope)
    signals = []
    workers = broker = outbox = jobs = None
    if system_wide:
        workers = worker_heartbeats()
        queues = {str(settings.CELERY_TASK_DEFAULT_QUEUE)}
        for worker in workers:
            if worker.state in ("alive", "late"):
                queues.update(worker.queues)
        broker = broker_queue_depths(sorted(queues)[:10])
        outbox = outbox_backlog()
        jobs = periodic_jobs()
        signals += [
            workers_signal(workers),
            broker_signal(broker),
            outbox_signal(outbox),
            periodic_jobs_signal(jobs),
            beats_signal(beats_seen()),
        ]
    signals.append(providers_signal(providers))
    return {
        "signals": signals,
        "overall": worst(*(s.level for s in signals)),
        "partial": not system_wide,
        "workers": workers,
        "broker": broker,
        "outbox": outbox,
        "jobs": jobs,
        "providers": providers,
        "results": [(r.value, r.label) for r in Attempt.Result],
    }
