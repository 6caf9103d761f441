"""The ``?wait=`` listener: one LISTEN connection per web process (``operations.api.waiting``
explains the protocol; this module holds the connection and the thread).

Where it connects: ``DATABASE_LISTEN_URL`` when set, else Django's default database. A pooler in
transaction mode (``DATABASE_POOL_MODE=transaction``) hands each transaction any server
connection and drops notifications, so LISTEN must reach PostgreSQL directly; without
``DATABASE_LISTEN_URL`` there the listener is not started (``listener_fallback_reason``) and
waits re-read the status once a second, as they do whenever the listener is down. Its
connection never prepares statements (``prepare_threshold=None``): a pooler in between would
answer its periodic ``SELECT 1`` with ``DuplicatePreparedStatement`` (issue 35).

A listener that connects somewhere notifications never come from would make every wait last
its full time, silently: ``DATABASE_LISTEN_URL`` naming the pooler, or another database, or a
pooler in ``DATABASE_URL`` with ``DATABASE_POOL_MODE`` unset. So each new connection proves
itself before waiters rely on it (``StatusListener._verify``): its backend pid must be the
server's own (a pooler answers with a pid of its own making), and a probe notification sent
through Django's connection (``DATABASE_URL``, the path the trigger's notifications take) must
arrive on it within ``PROBE_SECONDS``. Until then, and when either fails (a warning naming the
variables; tried again after ``MISROUTED_RETRY_SECONDS``), waits re-read once a second.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import dj_database_url
import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections

from operations.engine.backoff import backoff_seconds

logger = logging.getLogger("operations.api.waiting")

#: The notification channel of migration 0028's trigger; the payload is the intent's id.
CHANNEL = "effect_ledger_intent_status"
#: The listener checks its connection with ``SELECT 1`` after this many seconds without traffic.
LISTENER_PING_SECONDS = 15.0
#: Reconnection backoff of the listener: base and cap of ``backoff_seconds`` (seconds).
RECONNECT_BASE_SECONDS = 0.5
RECONNECT_CAP_SECONDS = 10.0
#: How long a new listener connection waits for its own probe notification (seconds).
PROBE_SECONDS = 5.0
#: After a connection failed its proof, the listener tries again this much later (seconds).
MISROUTED_RETRY_SECONDS = 60.0
#: Payload prefix of a probe notification (intent ids never start with it).
PROBE_PREFIX = "probe:"


class ListenerMisrouted(Exception):
    """The listener's connection does not hear the database's notifications (see the module)."""


def probe_through_django(payload: str) -> None:
    """Send ``pg_notify(CHANNEL, payload)`` through Django's default connection of this thread
    (``DATABASE_URL``, pooled or not; autocommit, so it is delivered at once) and close it."""
    connection = connections[DEFAULT_DB_ALIAS]
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, payload])
    finally:
        connection.close()


def listener_fallback_reason() -> str | None:
    """Why this process runs no listener (``?wait=`` re-reads once a second), or None when it
    listens: ``DATABASE_POOL_MODE=transaction`` without ``DATABASE_LISTEN_URL``."""
    if getattr(settings, "DATABASE_POOL_MODE", "direct") == "transaction" and not getattr(
        settings, "DATABASE_LISTEN_URL", ""
    ):
        return (
            "DATABASE_POOL_MODE=transaction and no DATABASE_LISTEN_URL: a pooler drops notifications, "
            "so ?wait= re-reads the status once a second (set DATABASE_LISTEN_URL to a direct URL)"
        )
    return None


def _direct_params(url: str) -> dict[str, Any]:
    """psycopg keywords for the libpq URL ``url`` (Django's parser: host, port, name, user,
    password and ``?option=`` query values such as ``sslmode``)."""
    parsed = dj_database_url.parse(url)
    params: dict[str, Any] = {
        key: value
        for key, value in (
            ("host", parsed.get("HOST")),
            ("port", parsed.get("PORT")),
            ("dbname", parsed.get("NAME")),
            ("user", parsed.get("USER")),
            ("password", parsed.get("PASSWORD")),
        )
        if value
    }
    params.update(parsed.get("OPTIONS", {}))
    return params


def listener_connection_params() -> dict[str, Any]:
    """psycopg connection keyword arguments for the listener: ``DATABASE_LISTEN_URL``'s when set,
    else Django's own for the default database (host, port, name, user, password, OPTIONS)
    without Django's cursor factory and adapters; never preparing statements
    (``prepare_threshold=None``); plus TCP keepalives so a silently dropped connection is
    noticed (libpq docs, "Parameter Key Words"; ignored over a Unix socket)."""
    listen_url = getattr(settings, "DATABASE_LISTEN_URL", "")
    if listen_url:
        params = _direct_params(listen_url)
    else:
        params = dict(connections[DEFAULT_DB_ALIAS].get_connection_params())
        for django_only in ("context", "cursor_factory", "prepare_threshold"):
            params.pop(django_only, None)
    params["prepare_threshold"] = None
    params.setdefault("application_name", "effect-ledger-listener")
    params.setdefault("keepalives", 1)
    params.setdefault("keepalives_idle", 10)
    params.setdefault("keepalives_interval", 5)
    params.setdefault("keepalives_count", 3)
    return params


class StatusListener:
    """The process's LISTEN connection and the requests waiting for a notification.

    ``waiter(intent_id)`` registers a ``threading.Event`` that is set when a notification for
    that intent arrives, and also (for every waiter) whenever the listener connects or loses its
    connection, since notifications sent while nobody listened are gone: a woken waiter re-reads
    the row, so a spurious wake-up costs one read and a missed one cannot happen.

    Args:
        connect: opens the listener's connection (autocommit); by default
            ``psycopg.connect(**listener_connection_params(), autocommit=True)``.
        probe: sends a probe notification with the given payload the way the database's own
            notifications travel; by default ``probe_through_django``.
    """

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]] | None = None,
        probe: Callable[[str], None] | None = None,
    ) -> None:
        self._connect = connect or (lambda: psycopg.connect(**listener_connection_params(), autocommit=True))
        self._probe = probe or probe_through_django
        self._lock = threading.Lock()
        self._waiters: dict[str, set[threading.Event]] = {}
        self._listening = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        #: The PostgreSQL backend pid of the current connection (None when not connected).
        self.backend_pid: int | None = None

    @property
    def listening(self) -> bool:
        """True while the LISTEN connection is up: notifications reach the waiters."""
        return self._listening.is_set()

    def start(self) -> None:
        """Start the listener thread unless it runs already (idempotent, thread-safe)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name="effect-ledger-listener", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and close its connection (tests; a web process just exits)."""
        self._stopping.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    @contextmanager
    def waiter(self, intent_id: uuid.UUID) -> Iterator[threading.Event]:
        """An event set when ``intent_id``'s status may have changed; registered for the block."""
        key, event = str(intent_id), threading.Event()
        with self._lock:
            self._waiters.setdefault(key, set()).add(event)
        try:
            yield event
        finally:
            with self._lock:
                events = self._waiters.get(key, set())
                events.discard(event)
                if not events:
                    self._waiters.pop(key, None)

    def waiting(self) -> int:
        """How many requests are registered (tests, diagnostics)."""
        with self._lock:
            return sum(len(events) for events in self._waiters.values())

    def _wake(self, intent_id: str) -> None:
        with self._lock:
            events = list(self._waiters.get(intent_id, ()))
        for event in events:
            event.set()

    def _wake_all(self) -> None:
        with self._lock:
            events = [event for events in self._waiters.values() for event in events]
        for event in events:
            event.set()

    def _run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            misrouted = False
            try:
                with self._connect() as conn:
                    self._verify(conn)
                    self.backend_pid = conn.info.backend_pid
                    self._listening.set()
                    failures = 0
                    logger.info("listening on %s (backend %s)", CHANNEL, self.backend_pid)
                    # Changes committed while nobody listened were never heard: re-read them all.
                    self._wake_all()
                    self._listen(conn)
            except ListenerMisrouted as exc:
                misrouted = True
                logger.warning("status listener not used: %s; waiters re-read every second", exc)
            except Exception:  # any failure: fall back and reconnect, never let the thread die
                logger.warning(
                    "status listener could not connect or lost its connection (to DATABASE_LISTEN_URL, "
                    "else DATABASE_URL); waiters re-read every second",
                    exc_info=True,
                )
            finally:
                self._listening.clear()
                self.backend_pid = None
                self._wake_all()  # they switch to re-reading once a second
            if self._stopping.is_set():
                break
            failures += 1
            self._stopping.wait(
                MISROUTED_RETRY_SECONDS
                if misrouted
                else backoff_seconds(
                    attempt_no=failures, base=RECONNECT_BASE_SECONDS, cap=RECONNECT_CAP_SECONDS
                )
            )

    def _verify(self, conn: psycopg.Connection[Any]) -> None:
        """LISTEN on ``conn`` and prove that it hears the database's notifications.

        Raises:
            ListenerMisrouted: its backend pid is not the server's (a pooler), or the probe sent
                through ``probe`` did not arrive within ``PROBE_SECONDS`` (another database or
                server). Notifications that arrive meanwhile wake their waiters as usual.
        """
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        if not row or row[0] != conn.info.backend_pid:
            raise ListenerMisrouted(
                "its connection goes through a connection pooler (the server's backend pid differs from "
                "the one the connection was given): point DATABASE_LISTEN_URL at PostgreSQL itself"
            )
        conn.execute(f"LISTEN {CHANNEL}")
        payload = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
        self._probe(payload)
        deadline = time.monotonic() + PROBE_SECONDS
        while (left := deadline - time.monotonic()) > 0:
            for notify in conn.notifies(timeout=left, stop_after=1):
                if notify.payload == payload:
                    return
                self._wake(notify.payload)
        raise ListenerMisrouted(
            f"a probe notification sent through DATABASE_URL did not arrive within {PROBE_SECONDS:g} s: "
            "DATABASE_LISTEN_URL must name the same database as DATABASE_URL, reached directly"
        )

    def _listen(self, conn: psycopg.Connection[Any]) -> None:
        quiet_since = time.monotonic()
        while not self._stopping.is_set():
            # At most one second per round, so stop() is honoured promptly; a killed backend or a
            # closed socket raises psycopg.OperationalError here at once.
            for notify in conn.notifies(timeout=1.0):
                self._wake(notify.payload)
                quiet_since = time.monotonic()
            if time.monotonic() - quiet_since >= LISTENER_PING_SECONDS:
                conn.execute("SELECT 1")
                quiet_since = time.monotonic()
