"""Reads behind the health page (``/health/``): workers, broker queues, the outbox, the
periodic jobs and the provider calls of the last hour, each judged green, amber or red.

Every figure comes from the database except the queue depths, which ask the broker with a
bounded wait (``HEALTH_BROKER_TIMEOUT_SECONDS``) and say "unknown" with the reason rather than
fail. Thresholds are settings (``EFFECT_LEDGER["HEALTH_*"]``; README, "Console", the health
signals table).
"""

from __future__ import annotations

import contextlib
import json
import queue as queue_module
import threading
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection

from operations.access.tenants import EVERY_TENANT, TenantScope
from operations.adapters.registry import adapter_label
from operations.models import Attempt, Intent, OutboxMessage, PeriodicJobRun, WorkerHeartbeat
from operations.workers.delivery import stalled_ready_seconds

GREEN, AMBER, RED = "green", "amber", "red"
_RANK = {GREEN: 0, AMBER: 1, RED: 2}

#: The periodic jobs the page follows: (task name, label, setting of its period in seconds).
PERIODIC_JOBS: tuple[tuple[str, str, str], ...] = (
    ("operations.relay_outbox", "Outbox relay", "RELAY_PERIOD_SECONDS"),
    ("reconciliation.reconcile", "Reconciler", "RECONCILE_PERIOD_SECONDS"),
    ("operations.deliver_webhooks", "Webhook deliveries", "WEBHOOK_PERIOD_SECONDS"),
    ("operations.send_notifications", "Notifications", "NOTIFY_PERIOD_SECONDS"),
    ("reconciliation.reconcile_statements", "Statement reconciliation", "STATEMENT_PERIOD_SECONDS"),
)

#: Attempt results counted as provider trouble: no definite answer (a timeout, a 5xx or 429 that
#: is retried, an ambiguous call, a lease that expired mid-call). ``failed`` is not one: it is
#: the provider's definite refusal (a card declined, a reservation not found), a working
#: provider doing its job, and a shop that declines many cards must not see its provider red
#: (reviewer's finding). It is still shown among the outcomes.
FAILURE_RESULTS = (
    Attempt.Result.UNKNOWN,
    Attempt.Result.RETRY,
    Attempt.Result.ABANDONED,
)
#: Attempt results whose duration is a provider call's (claim to record); ``skipped`` sent
#: nothing, ``pending`` has not ended, ``abandoned`` ended at the lease's expiry, not a call's.
TIMED_RESULTS = (
    Attempt.Result.SUCCEEDED,
    Attempt.Result.FAILED,
    Attempt.Result.RETRY,
    Attempt.Result.UNKNOWN,
    Attempt.Result.FENCED_OUT,
)


def worst(*levels: str) -> str:
    """The worst of ``levels`` (red > amber > green); green for none."""
    return max(levels, key=_RANK.__getitem__, default=GREEN)


def _config() -> dict[str, Any]:
    config: dict[str, Any] = settings.EFFECT_LEDGER
    return config


@dataclass(frozen=True)
class Signal:
    """One line of the health summary: ``level`` (green/amber/red) and what it says."""

    key: str
    name: str
    level: str
    summary: str


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
    late = float(_config()["HEALTH_WORKER_LATE_SECONDS"])
    gone = float(_config()["HEALTH_WORKER_GONE_SECONDS"])
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


@dataclass
class QueueDepth:
    """A broker queue's depth: ``messages`` (None when unknown, with ``reason``)."""

    name: str
    messages: int | None
    reason: str = ""
    level: str = GREEN


@dataclass
class BrokerReport:
    """What the broker said: its transport, each queue's depth, or why it could not answer."""

    transport: str
    queues: list[QueueDepth] = field(default_factory=list)
    unreachable: str = ""


def _measure(names: list[str], timeout: float) -> BrokerReport:
    from celery import current_app

    url = str(settings.CELERY_BROKER_URL)
    options = dict(getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}) or {})
    if url.startswith(("redis://", "rediss://")):
        options.update(socket_connect_timeout=timeout, socket_timeout=timeout)
    transport = url.split("://", 1)[0] or "unknown"
    report = BrokerReport(transport=transport)
    with current_app.connection_for_read(
        url, connect_timeout=timeout, transport_options=options, heartbeat=0
    ) as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, timeout=max(1, round(timeout)))
        # AMQP keeps a declared queue, empty or not: NOT_FOUND means nobody declared it. kombu's
        # virtual transports (Redis, filesystem) keep no queue object: an empty queue is absent.
        amqp = conn.transport.driver_type == "amqp"
        for name in names:
            channel: Any = conn.channel()  # a kombu channel (StdChannel's stub lacks queue_declare)
            try:
                _, count, _ = channel.queue_declare(queue=name, passive=True)
                report.queues.append(QueueDepth(name, int(count)))
            except conn.channel_errors as exc:
                if amqp:
                    report.queues.append(
                        QueueDepth(name, None, f"not declared on the broker yet ({exc})"[:200])
                    )
                else:
                    report.queues.append(QueueDepth(name, 0))
            finally:
                with contextlib.suppress(Exception):  # closed by the broker already
                    channel.close()
    return report


def broker_queue_depths(names: list[str], *, timeout: float | None = None) -> BrokerReport:
    """Messages waiting in each named queue of the configured broker (a passive declare:
    AMQP's ``queue.declare-ok`` message count, kombu's list length on Redis, files on the
    filesystem transport), within ``timeout`` seconds (default ``HEALTH_BROKER_TIMEOUT_SECONDS``).

    Never raises and never waits past the timeout: the broker is asked from a daemon thread, and
    an error or no answer in time becomes ``unreachable`` with the reason (the page shows
    "unknown (reason)"). Each queue is judged by ``HEALTH_QUEUE_DEPTH_AMBER`` / ``_RED``.
    """
    wait = float(timeout if timeout is not None else _config()["HEALTH_BROKER_TIMEOUT_SECONDS"])
    transport = str(settings.CELERY_BROKER_URL).split("://", 1)[0] or "unknown"
    answers: queue_module.Queue[BrokerReport | BaseException] = queue_module.Queue(maxsize=1)

    def ask() -> None:
        try:
            answers.put(_measure(names, wait))
        except BaseException as exc:  # noqa: BLE001 - reported to the caller as the reason
            answers.put(exc)

    threading.Thread(target=ask, name="health-broker-probe", daemon=True).start()
    try:
        answer = answers.get(timeout=wait + 0.5)
    except queue_module.Empty:
        return BrokerReport(transport=transport, unreachable=f"no answer within {wait:g} s")
    if isinstance(answer, BaseException):
        return BrokerReport(transport=transport, unreachable=f"{type(answer).__name__}: {answer}"[:300])
    amber = int(_config()["HEALTH_QUEUE_DEPTH_AMBER"])
    red = int(_config()["HEALTH_QUEUE_DEPTH_RED"])
    for depth in answer.queues:
        if depth.messages is None:
            depth.level = AMBER
        elif depth.messages >= red:
            depth.level = RED
        elif depth.messages >= amber:
            depth.level = AMBER
    return answer


def broker_signal(report: BrokerReport) -> Signal:
    """Red when the broker cannot be reached (nothing can be published); else the worst queue."""
    if report.unreachable:
        return Signal("broker", "Broker queue", RED, f"unknown ({report.unreachable})")
    level = worst(*(q.level for q in report.queues))
    parts = [
        f"{q.name}: {q.messages}" if q.messages is not None else f"{q.name}: unknown ({q.reason})"
        for q in report.queues
    ]
    return Signal("broker", "Broker queue", level, "; ".join(parts) or "no queue")


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
    if oldest > float(_config()["HEALTH_OUTBOX_RED_SECONDS"]):
        level = RED
    elif oldest > float(_config()["OUTBOX_LAG_WARNING_SECONDS"]) or backlog["stalled"]:
        level = AMBER
    summary = f"{backlog['pending']} pending, oldest {oldest:.0f} s; {backlog['stalled']} stalled"
    return Signal("outbox", "Outbox backlog", level, summary)


def periodic_jobs() -> list[dict[str, Any]]:
    """The last run of each periodic job (``PERIODIC_JOBS``), judged by its age in periods of
    the job: amber past ``HEALTH_JOB_AMBER_PERIODS`` (or when the last run raised), red past
    ``HEALTH_JOB_RED_PERIODS`` or when it never ran."""
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
    amber_periods = float(_config()["HEALTH_JOB_AMBER_PERIODS"])
    red_periods = float(_config()["HEALTH_JOB_RED_PERIODS"])
    jobs = []
    for name, label, period_setting in PERIODIC_JOBS:
        period = float(_config()[period_setting])
        job: dict[str, Any] = {"name": name, "label": label, "period_seconds": period}
        row = found.get(name)
        if row is None:
            job.update(ran=False, level=RED, age_seconds=None, error="")
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
            parts.append(f"{job['label']}: never ran")
        else:
            parts.append(
                f"{job['label']}: {job['age_seconds']:.0f} s ago" + (" (failed)" if job["error"] else "")
            )
    return Signal("jobs", "Periodic jobs", worst(*(job["level"] for job in jobs)), "; ".join(parts))


_PROVIDER_STATS_SQL = f"""
    SELECT i.action,
           count(*) AS calls,
           {", ".join(f"count(*) FILTER (WHERE a.result = '{r.value}')" for r in Attempt.Result)},
           percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM a.finished_at - a.started_at))
               FILTER (WHERE a.result = ANY(%(timed)s)),
           percentile_cont(0.95) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM a.finished_at - a.started_at))
               FILTER (WHERE a.result = ANY(%(timed)s))
    FROM {Attempt._meta.db_table} a JOIN {Intent._meta.db_table} i ON i.id = a.intent_id
    WHERE a.started_at >= statement_timestamp() - make_interval(secs => %(window)s)
      AND (%(every)s OR i.tenant = ANY(%(tenants)s))
    GROUP BY i.action ORDER BY i.action
"""


def provider_call_stats(
    *, scope: TenantScope = EVERY_TENANT, window_seconds: float = 3600.0
) -> list[dict[str, Any]]:
    """Provider calls (attempts) started in the last ``window_seconds``, per action: counts by
    outcome, failures, and the 50th and 95th percentiles of claim-to-record time in seconds.

    One aggregate query: a range scan of ``attempt_started`` joined to the intents for their
    action and tenant (``scope``: a console reader's tenants; attempts belong to intents, so to
    tenants). Each row is judged by its failure share (``HEALTH_PROVIDER_FAILURE_AMBER`` /
    ``_RED``) and its p95 (``HEALTH_PROVIDER_P95_AMBER_SECONDS`` / ``_RED_SECONDS``).
    """
    results = [r.value for r in Attempt.Result]
    with connection.cursor() as cursor:
        cursor.execute(
            _PROVIDER_STATS_SQL,
            {
                "timed": [r.value for r in TIMED_RESULTS],
                "window": window_seconds,
                "every": scope.every,
                "tenants": sorted(scope.names),
            },
        )
        rows = cursor.fetchall()
    config = _config()
    stats = []
    for row in rows:
        action, calls = row[0], int(row[1])
        by_result = dict(zip(results, (int(n) for n in row[2 : 2 + len(results)]), strict=True))
        p50, p95 = row[2 + len(results)], row[3 + len(results)]
        failures = sum(by_result[r.value] for r in FAILURE_RESULTS)
        ended = calls - by_result[Attempt.Result.PENDING]
        share = failures / ended if ended else 0.0
        level = GREEN
        if share >= float(config["HEALTH_PROVIDER_FAILURE_RED"]) or (
            p95 is not None and p95 > float(config["HEALTH_PROVIDER_P95_RED_SECONDS"])
        ):
            level = RED
        elif share >= float(config["HEALTH_PROVIDER_FAILURE_AMBER"]) or (
            p95 is not None and p95 > float(config["HEALTH_PROVIDER_P95_AMBER_SECONDS"])
        ):
            level = AMBER
        stats.append(
            {
                "action": action,
                "adapter": adapter_label(action),
                "calls": calls,
                "by_result": by_result,
                "outcomes": [(r.value, by_result[r.value]) for r in Attempt.Result if by_result[r.value]],
                "failures": failures,
                "failure_share": share,
                "p50_seconds": float(p50) if p50 is not None else None,
                "p95_seconds": float(p95) if p95 is not None else None,
                "level": level,
            }
        )
    return stats


def providers_signal(stats: list[dict[str, Any]]) -> Signal:
    """The worst action; green with no call in the window."""
    if not stats:
        return Signal("providers", "Provider calls (last hour)", GREEN, "no call in the last hour")
    calls = sum(s["calls"] for s in stats)
    failures = sum(s["failures"] for s in stats)
    bad = [s["action"] for s in stats if s["level"] != GREEN]
    summary = f"{calls} calls, {failures} without a definite answer" + (
        f"; look at {', '.join(bad)}" if bad else ""
    )
    return Signal("providers", "Provider calls (last hour)", worst(*(s["level"] for s in stats)), summary)


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
        ``workers``, ``broker``, ``outbox``, ``jobs``, ``providers``; those of no tenant are
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
