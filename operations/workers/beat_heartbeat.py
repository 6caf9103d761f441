"""Beat heartbeats: every Celery beat process records itself in the database, so a second beat
(two hosts each started one) is seen on the health page (issue 35, C27).

The beat runs no task of its own: a task runs on a worker, which would record the worker's
identity, not the beat's. So the beat process itself, on Celery's ``beat_init`` signal
(connected in ``console/celery.py``), starts a daemon thread that upserts its row
(``operations.services.beats.beat_heartbeat_record``: host, pid, start time, ``seen_at`` in
database time) at once and then every ``EFFECT_LEDGER["BEAT_HEARTBEAT_SECONDS"]``. The thread
has its own database connection (Django's are per thread) and each beat is one autocommitted
statement, so it holds no session state (PgBouncer transaction mode is fine). A database error
is logged and the thread tries again next period; it never stops the beat.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from typing import Any

from django.conf import settings
from django.db import Error as DatabaseLibraryError
from django.db import connection
from django.utils import timezone

logger = logging.getLogger(__name__)


class BeatHeartbeat(threading.Thread):
    """The daemon thread of one beat process (see the module docstring).

    Args:
        host: the machine's name (``socket.gethostname()``).
        period: seconds between beats (finite, > 0).
    """

    def __init__(self, *, host: str, period: float) -> None:
        super().__init__(name="effect-ledger-beat-heartbeat", daemon=True)
        if not period > 0:
            raise ValueError(f"a beat heartbeat period must be > 0 seconds, not {period!r}")
        self.host, self.period, self.pid = host, period, os.getpid()
        self.started_at = timezone.now()
        self.identity = f"{host}:{self.pid}:{self.started_at.timestamp():.3f}"
        self.stopping = threading.Event()

    def run(self) -> None:
        """Beat until ``stopping`` is set (a daemon thread also ends with the process)."""
        from operations.services.beats import beat_heartbeat_record  # apps are ready by now

        while not self.stopping.is_set():
            try:
                beat_heartbeat_record(
                    identity=self.identity, host=self.host, pid=self.pid, started_at=self.started_at
                )
            except DatabaseLibraryError as exc:
                logger.warning("beat heartbeat not recorded", extra={"error": str(exc)[:200]})
                with contextlib.suppress(Exception):  # broken; the next beat opens a new one
                    connection.close()
            self.stopping.wait(self.period)
        with contextlib.suppress(Exception):
            connection.close()


def beat_heartbeat_start(**_: Any) -> BeatHeartbeat:
    """Start this beat process's heartbeat thread (the ``beat_init`` receiver); returns it."""
    thread = BeatHeartbeat(
        host=socket.gethostname(), period=float(settings.EFFECT_LEDGER["BEAT_HEARTBEAT_SECONDS"])
    )
    thread.start()
    logger.info("beat heartbeat started", extra={"beat": thread.identity})
    return thread
