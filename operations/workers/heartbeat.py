"""Worker heartbeats: every Celery worker records itself alive in the database.

``WorkerHeartbeatStep`` is a worker bootstep (registered in ``console/celery.py``). At start it
upserts the worker's row (``operations.services.worker_heartbeat_record``: node name, main pid,
queues, pool size, start time, ``beat_at`` in database time), then again every
``EFFECT_LEDGER["WORKER_HEARTBEAT_SECONDS"]`` on the worker's own timer; a warm shutdown sets
``stopped_at``. The health page judges each row alive, late or gone by the age of its last beat.

Why a table and not ``celery inspect ping``: a ping is a broadcast over the broker that waits
for answers (a web request would wait its whole timeout whenever a worker is busy or gone, and
the filesystem transport has no broadcast at all), and it says nothing about a worker that is
already gone. A row per worker answers from the database in one indexed query, on every broker,
and keeps the last beat of a dead worker, which is what an operator needs to see.

Why the worker's timer and not a thread of our own: with prefork (the production pool) the timer
runs in the worker's event loop, so a worker whose loop is stuck stops beating and is shown late,
which is the truth; and no extra thread lives in a process that forks pool children.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any

from celery import bootsteps
from django.conf import settings
from django.db import Error as DatabaseLibraryError
from django.db import connection
from django.utils import timezone

logger = logging.getLogger(__name__)


class WorkerHeartbeatStep(bootsteps.StartStopStep):
    """Record this worker's heartbeat at start, every period, and its stop."""

    requires = ("celery.worker.components:Timer",)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.entry: Any = None
        self.started_at = timezone.now()
        self.failures = 0
        self.quiet_until = 0.0  # time.monotonic() before which no beat is tried

    def start(self, worker: Any) -> None:
        # No database call here: the first beat runs on the timer once the worker is up, so a
        # database that is slow or locked never keeps a worker from starting (a restore drill's
        # worker once waited past its 60 s start-up bound).
        self.started_at = timezone.now()
        period = float(settings.EFFECT_LEDGER["WORKER_HEARTBEAT_SECONDS"])
        worker.timer.call_after(0.5, self.beat, (worker,), priority=10)
        self.entry = worker.timer.call_repeatedly(period, self.beat, (worker,), priority=10)

    def stop(self, worker: Any) -> None:
        if self.entry is not None:
            self.entry.cancel()
            self.entry = None
        from operations.services.health import worker_heartbeat_stopped  # models: apps are ready by now

        try:
            worker_heartbeat_stopped(hostname=worker.hostname)
        except DatabaseLibraryError as exc:  # DatabaseError or InterfaceError: the database is away
            logger.warning("worker stop not recorded", extra={"error": str(exc)[:200]})

    def beat(self, worker: Any) -> None:
        """One heartbeat; a database error is logged, never raised into the worker's loop.

        After a failure the next tries back off (one period, doubling, at most 60 s): with the
        database unreachable, each try can wait its connect timeout in the worker's loop.
        """
        if time.monotonic() < self.quiet_until:
            return
        # Imported here: this module is loaded with the Celery app, before Django's apps are ready.
        from operations.services.health import worker_heartbeat_record

        try:
            worker_heartbeat_record(
                hostname=worker.hostname,
                pid=os.getpid(),
                queues=sorted(worker.app.amqp.queues.consume_from or {}),
                concurrency=int(worker.concurrency or 0),
                started_at=self.started_at,
            )
        except DatabaseLibraryError as exc:  # DatabaseError or InterfaceError (a closed connection)
            self.failures += 1
            period = float(settings.EFFECT_LEDGER["WORKER_HEARTBEAT_SECONDS"])
            self.quiet_until = time.monotonic() + min(60.0, period * 2 ** (self.failures - 1))
            logger.warning("worker heartbeat not recorded", extra={"error": str(exc)[:200]})
            with contextlib.suppress(Exception):  # broken; the next beat opens a new one
                connection.close()
        else:
            self.failures = 0
