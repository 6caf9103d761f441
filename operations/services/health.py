"""Writes behind the health page: worker heartbeats and the last run of each periodic job.

Each is one upsert of one row (``INSERT ... ON CONFLICT DO UPDATE``), so a worker beating every
10 s or the relay running every 2 s costs one small write, and two writers never collide.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.db import Error as DatabaseLibraryError
from django.db import connection, transaction
from django.db.models.functions import Now
from django.utils import timezone

from operations.models import PeriodicJobRun, WorkerHeartbeat

logger = logging.getLogger(__name__)

#: Rows of workers silent for longer than this are deleted by the next beat of any worker.
HEARTBEAT_RETENTION = timedelta(days=1)


@contextmanager
def heartbeat_cursor() -> Iterator[Any]:
    """A cursor in a transaction whose statements wait at most 1 s for a lock and run at most
    2 s (``SET LOCAL``: transaction-scoped, so safe behind a pooler in transaction mode); for
    heartbeats, which must never hold up the loop that sends them and are retried next period."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '1s'")
        cursor.execute("SET LOCAL statement_timeout = '2s'")
        yield cursor


def worker_heartbeat_record(
    *, hostname: str, pid: int, queues: list[str], concurrency: int, started_at: datetime
) -> None:
    """Upsert a worker's heartbeat: ``beat_at`` = database now, ``stopped_at`` cleared.

    Args:
        hostname: the worker's node name (``name@host``), the row's key.
        pid: its main process id.
        queues: the queue names it consumes.
        concurrency: its pool size.
        started_at: when the worker started (aware datetime).
    """
    table = WorkerHeartbeat._meta.db_table
    # Bounded: the beat runs in the worker's own loop, so it may never wait long on a lock or a
    # slow statement (it is retried next period anyway).
    with heartbeat_cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {table} (hostname, pid, queues, concurrency, started_at, beat_at, stopped_at)
            VALUES (%s, %s, %s, %s, %s, statement_timestamp(), NULL)
            ON CONFLICT (hostname) DO UPDATE SET pid = EXCLUDED.pid, queues = EXCLUDED.queues,
                concurrency = EXCLUDED.concurrency, started_at = EXCLUDED.started_at,
                beat_at = EXCLUDED.beat_at, stopped_at = NULL
            """,
            [hostname, pid, json.dumps(sorted(queues)), concurrency, started_at],
        )
        # Housekeeping on the beat's own connection, served by worker_heartbeat_beat.
        cursor.execute(
            f"DELETE FROM {table} WHERE beat_at < statement_timestamp() - make_interval(secs => %s)",
            [HEARTBEAT_RETENTION.total_seconds()],
        )


def worker_heartbeat_stopped(*, hostname: str) -> None:
    """Mark a worker as stopped on its warm shutdown (a killed worker never gets here)."""
    WorkerHeartbeat.objects.filter(hostname=hostname).update(stopped_at=Now())


def periodic_job_record(*, name: str, started_at: datetime, duration_ms: int, error: str = "") -> None:
    """Upsert the last run of a periodic job.

    Args:
        name: the Celery task name (``operations.relay_outbox``, ``reconciliation.reconcile``).
        started_at: when the run began (aware datetime).
        duration_ms: how long it took, in milliseconds.
        error: empty for a run that succeeded, else what it raised (kept to 1,000 characters);
            ``last_succeeded_at`` keeps the previous success then.
    """
    table = PeriodicJobRun._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {table} (name, last_started_at, last_finished_at, last_duration_ms, last_error,
                                 last_succeeded_at)
            VALUES (%s, %s, statement_timestamp(), %s, %s,
                    CASE WHEN %s = '' THEN statement_timestamp() END)
            ON CONFLICT (name) DO UPDATE SET last_started_at = EXCLUDED.last_started_at,
                last_finished_at = EXCLUDED.last_finished_at, last_duration_ms = EXCLUDED.last_duration_ms,
                last_error = EXCLUDED.last_error,
                last_succeeded_at = COALESCE(EXCLUDED.last_succeeded_at, {table}.last_succeeded_at)
            """,
            [name, started_at, max(0, duration_ms), error[:1000], error[:1000]],
        )


@contextmanager
def periodic_job_run(name: str) -> Iterator[None]:
    """Time the body and record it as the last run of job ``name`` (``periodic_job_record``),
    with the error it raised, if any (re-raised). A record that cannot be written (the database
    is away) is logged, never raised over the job's own result."""
    started_at = timezone.now()
    clock = time.monotonic()
    error = ""
    try:
        yield
    except Exception as exc:
        error = repr(exc) or type(exc).__name__
        raise
    finally:
        try:
            periodic_job_record(
                name=name,
                started_at=started_at,
                duration_ms=int((time.monotonic() - clock) * 1000),
                error=error,
            )
        except DatabaseLibraryError as exc:  # DatabaseError or InterfaceError (a closed connection)
            logger.warning("periodic job run not recorded", extra={"job": name, "error": str(exc)[:200]})
