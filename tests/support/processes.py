"""Real processes for tests: the sandbox provider (``manage.py sandbox_provider``).

Import the fixtures in ``tests/conftest.py``::

    from tests.support.processes import sandbox_provider  # noqa: F401

``sandbox_provider`` (session scope) starts one provider process on a free port against the
test run's sandbox database (``<test database>_sandbox``) and yields a ``SandboxProvider``; ``sandbox`` (function scope) resets it before
the test and points ``settings.SANDBOX_PROVIDER_URL`` at it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

BASE_DIR = Path(__file__).resolve().parents[2]
READY_PREFIX = "sandbox provider listening on "
START_TIMEOUT_SECONDS = 30.0


class SandboxProvider:
    """A running sandbox provider process and helpers for its control plane.

    Attributes:
        url: ``http://127.0.0.1:PORT``.
        process: the ``subprocess.Popen`` of ``manage.py sandbox_provider``.
        log_path: where the process's stderr goes (shown when startup fails).
    """

    def __init__(self, url: str, process: subprocess.Popen[str], log_path: Path) -> None:
        self.url = url
        self.process = process
        self.log_path = log_path
        self.client = httpx.Client(base_url=url, timeout=10.0)

    def ledger(self, product: str | None = None, *, reference: str | None = None) -> list[dict[str, Any]]:
        """Every effect ever applied (``GET /ledger``), oldest first; filter by product/reference."""
        params = {k: v for k, v in {"product": product, "reference": reference}.items() if v}
        response = self.client.get("/ledger", params=params)
        response.raise_for_status()
        effects: list[dict[str, Any]] = response.json()["effects"]
        return effects

    def inject(
        self,
        mode: str,
        *,
        product: str = "*",
        times: int = 1,
        reference: str | None = None,
        delay_seconds: float | None = None,
    ) -> dict[str, Any]:
        """Queue a fault for the next ``times`` matching POSTs (``POST /_sandbox/faults``).

        Args:
            mode: a ``FaultMode`` value, e.g. ``"crash_after_effect"``.
            product: ``payments``, ``email``, ``reservations`` or ``*``.
            reference: only requests whose body ``reference`` equals it.
            delay_seconds: sleep of ``delay_after_effect`` (default 5) / hold of ``hold_*`` (30).
        """
        body: dict[str, Any] = {"product": product, "mode": mode, "times": times}
        if reference is not None:
            body["match"] = {"reference": reference}
        if delay_seconds is not None:
            body["delay_seconds"] = delay_seconds
        response = self.client.post("/_sandbox/faults", json=body)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def clear_faults(self) -> None:
        """Drop every queued fault (``DELETE /_sandbox/faults``)."""
        self.client.delete("/_sandbox/faults").raise_for_status()

    def reset(self) -> None:
        """Truncate the provider's tables, clear faults, restore startup settings."""
        self.client.post("/_sandbox/reset").raise_for_status()

    def withdraw(self, product: str, item_id: str) -> None:
        """Hide an item: single GET answers 410, lists omit it (``POST /_sandbox/withdraw``)."""
        self.client.post("/_sandbox/withdraw", json={"product": product, "id": item_id}).raise_for_status()

    def configure(self, *, email_lookup_lag_seconds: float) -> None:
        """Change the email lookup lag at runtime (``POST /_sandbox/config``)."""
        response = self.client.post(
            "/_sandbox/config", json={"email_lookup_lag_seconds": email_lookup_lag_seconds}
        )
        response.raise_for_status()

    def event_settings(self, **changes: Any) -> dict[str, Any]:
        """Change the event settings (``POST /_sandbox/events``: ``url``, ``lag_seconds``,
        ``duplicates``, ``reorder``, ``loss``) and return them all."""
        response = self.client.post("/_sandbox/events", json=changes)
        response.raise_for_status()
        result: dict[str, Any] = response.json()["settings"]
        return result

    def events(self, *, source: str | None = None, type: str | None = None) -> list[dict[str, Any]]:  # noqa: A002
        """The events generated since the last reset, oldest first, with their delivery state
        (``GET /_sandbox/events``)."""
        params = {k: v for k, v in {"source": source, "type": type}.items() if v}
        response = self.client.get("/_sandbox/events", params=params)
        response.raise_for_status()
        found: list[dict[str, Any]] = response.json()["events"]
        return found

    def redeliver(self, event_id: str) -> dict[str, Any]:
        """Send one event again now: same id and body, fresh signature
        (``POST /_sandbox/events/redeliver``); returns ``{"id", "status_code"}``."""
        response = self.client.post("/_sandbox/events/redeliver", json={"id": event_id})
        response.raise_for_status()
        result: dict[str, Any] = response.json()["redelivered"]
        return result

    def statement(self, date: str, product: str) -> list[dict[str, Any]]:
        """The statement lines of ``product`` on UTC day ``date`` (``GET /v1/statements``)."""
        response = self.client.get("/v1/statements", params={"date": date, "product": product})
        response.raise_for_status()
        lines: list[dict[str, Any]] = response.json()["lines"]
        return lines

    def omit_from_statement(self, product: str, item_id: str) -> None:
        """Leave an effect out of statements (``POST /_sandbox/statements/omit``)."""
        response = self.client.post("/_sandbox/statements/omit", json={"product": product, "id": item_id})
        response.raise_for_status()

    def statement_amount(self, product: str, item_id: str, amount: int) -> None:
        """Make statements show ``amount`` (minor units) for an effect
        (``POST /_sandbox/statements/amount``)."""
        response = self.client.post(
            "/_sandbox/statements/amount", json={"product": product, "id": item_id, "amount": amount}
        )
        response.raise_for_status()

    def request_count(self, product: str | None = None) -> int:
        """How many product POSTs the provider received since the last reset."""
        params = {"product": product} if product else {}
        response = self.client.get("/_sandbox/requests", params=params)
        response.raise_for_status()
        return len(response.json()["requests"])

    def stop(self) -> None:
        """SIGTERM the process and wait for it (SIGKILL after 10 seconds)."""
        self.client.close()
        stop_process(self.process)


def stop_process(process: subprocess.Popen[Any]) -> None:
    """SIGTERM ``process`` and wait for it; SIGKILL after 10 seconds."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def _drain(stream: Any, lines: list[str], ready: threading.Event) -> None:
    for line in stream:
        lines.append(line)
        if line.startswith(READY_PREFIX):
            ready.set()
    ready.set()  # EOF: the process ended; the caller checks which


def start_sandbox_provider(
    dsn: str,
    *,
    email_lag_seconds: float = 0.0,
    events_url: str = "",
    events_secret: str | None = None,
) -> SandboxProvider:
    """Start ``manage.py sandbox_provider --port 0 --dsn DSN`` and wait until it is ready.

    ``events_url`` / ``events_secret`` are passed as ``--events-url`` / ``--events-secret``;
    the URL is always passed, so ``SANDBOX_EVENTS_URL`` in the environment never applies and the
    session's provider sends no events unless a test sets a URL through
    ``SandboxProvider.event_settings(url=...)``.

    ``--port 0`` lets the kernel pick a free port (no race between choosing and binding); the
    real URL is read from the readiness line.

    Raises:
        RuntimeError: the process exited or did not announce itself within 30 seconds; the
            message carries its stderr.
    """
    log = tempfile.NamedTemporaryFile(prefix="sandbox-provider-", suffix=".log", delete=False)  # noqa: SIM115
    command = [
        sys.executable,
        str(BASE_DIR / "manage.py"),
        "sandbox_provider",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--dsn",
        dsn,
        "--email-lag-seconds",
        str(email_lag_seconds),
        "--events-url",
        events_url,
        *(["--events-secret", events_secret] if events_secret is not None else []),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, cwd=BASE_DIR, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    lines: list[str] = []
    ready = threading.Event()
    threading.Thread(target=_drain, args=(process.stdout, lines, ready), daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not ready.wait(0.1) and time.monotonic() < deadline:
        pass
    url = next((line[len(READY_PREFIX) :].strip() for line in lines if line.startswith(READY_PREFIX)), None)
    if url is None:
        process.kill()
        process.wait(timeout=5)
        log.close()
        stderr = Path(log.name).read_text()[-4000:]
        raise RuntimeError(f"sandbox provider did not start (exit {process.returncode}):\n{stderr}")
    return SandboxProvider(url, process, Path(log.name))


@pytest.fixture(scope="session")
def sandbox_provider(django_db_setup: None) -> Iterator[SandboxProvider]:
    """One real sandbox provider process for the session, on the test run's sandbox database.

    The DSN is built from ``django.db.connection.settings_dict`` after ``django_db_setup``, so
    it names ``<test database>_sandbox``: a database of the test run's own, outside the ledger's
    (created here, dropped with the test database by ``django_db_setup`` in conftest).
    """
    from django.db import connection

    from console.lab.sandbox_provider.database import prepare_default_database

    name = str(connection.settings_dict["NAME"])
    if name != (connection.settings_dict.get("TEST") or {}).get("NAME") and not name.startswith("test_"):
        # pytest-django only creates the test database when a collected test needs it.
        pytest.fail(
            f"sandbox_provider would use the non-test database {name!r}: request it through a test "
            "that uses the database (the `sandbox` fixture, `db`, or @pytest.mark.django_db)"
        )
    provider = start_sandbox_provider(prepare_default_database(connection.settings_dict))
    try:
        yield provider
    finally:
        provider.stop()


@pytest.fixture
def sandbox(db: None, sandbox_provider: SandboxProvider, settings: Any) -> SandboxProvider:
    """The session's provider, reset for this test, with ``settings.SANDBOX_PROVIDER_URL`` on it.

    It requests ``db`` so pytest-django creates the test database the provider runs on.
    """
    sandbox_provider.reset()
    settings.SANDBOX_PROVIDER_URL = sandbox_provider.url
    return sandbox_provider
