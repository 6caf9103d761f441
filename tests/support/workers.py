"""Real Celery worker and beat processes for integration tests.

Each test session gets its own queue name, so stray messages from other runs on the same broker
never reach these workers. The broker is ``CELERY_BROKER_URL`` when set (RabbitMQ in CI), else
the filesystem transport under the data folder.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

BASE_DIR = Path(__file__).resolve().parents[2]
QUEUE = f"test-{uuid.uuid4().hex[:10]}"


def database_url(settings_dict: dict[str, Any]) -> str:
    """A ``DATABASE_URL`` for child processes naming the same (test) database."""
    user = quote(str(settings_dict.get("USER") or "postgres"))
    password = quote(str(settings_dict.get("PASSWORD") or ""))
    name = settings_dict["NAME"]
    host = settings_dict.get("HOST") or ""
    if host and not str(host).startswith("/"):
        return f"postgres://{user}:{password}@{host}:{settings_dict.get('PORT') or 5432}/{name}"
    socket_dir = host or (settings_dict.get("OPTIONS") or {}).get("host", "")
    return f"postgresql://{user}:{password}@/{name}?host={socket_dir}"


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
    """Poll ``predicate`` until true; fail the test naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


class ProcessGroup:
    """A child process in its own session, so the whole group (pool children too) can be
    signalled at once."""

    def __init__(self, name: str, command: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.log = Path(tempfile.mkstemp(prefix=f"{name}-", suffix=".log")[1])
        self._log_file = self.log.open("w")
        self.process = subprocess.Popen(
            command,
            cwd=BASE_DIR,
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        """What the process printed so far."""
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        """True while the main process runs."""
        return self.process.poll() is None

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the main process and all its children."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    def stop(self, timeout: float = 20) -> None:
        """Warm shutdown (SIGTERM to the main process), SIGKILL to the group after ``timeout``."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                self.process.wait(timeout=10)
        self.signal_group(signal.SIGKILL)  # any orphaned pool child
        self._log_file.close()

    def kill(self) -> None:
        """SIGKILL the main process and every pool child at once."""
        self.signal_group(signal.SIGKILL)
        self.process.wait(timeout=10)
        self._log_file.close()


class Cluster:
    """Starts workers and beat against the test database, the sandbox, and the session queue."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.groups: list[ProcessGroup] = []

    def set_timing(self, *, lease_seconds: int, provider_timeout_seconds: float) -> None:
        """Change the lease and provider deadline of workers started from now on."""
        self.env["EFFECT_LEDGER_LEASE_SECONDS"] = str(lease_seconds)
        self.env["EFFECT_LEDGER_PROVIDER_TIMEOUT_SECONDS"] = str(provider_timeout_seconds)

    def worker(self, name: str, concurrency: int = 1, prefetch: int = 1) -> ProcessGroup:
        """Start ``celery worker`` and wait until it reports ready."""
        command = [
            sys.executable, "-m", "celery", "-A", "console", "worker", "-l", "INFO", "-P", "prefork",
            "-c", str(concurrency), "-n", f"{name}-{uuid.uuid4().hex[:6]}@%h", "-Q", QUEUE,
            "--prefetch-multiplier", str(prefetch), "--without-gossip", "--without-mingle",
        ]  # fmt: skip
        group = ProcessGroup(name, command, self.env)
        self.groups.append(group)
        wait_for(lambda: " ready." in group.output() or not group.alive(), 60, f"worker {name} to start")
        if not group.alive():
            pytest.fail(f"worker {name} exited:\n{group.output()[-3000:]}")
        return group

    def beat(self) -> ProcessGroup:
        """Start ``celery beat`` (outbox relay and reconciler on short periods)."""
        schedule = tempfile.mkdtemp(prefix="beat-")
        command = [
            sys.executable, "-m", "celery", "-A", "console", "beat", "-l", "INFO",
            "-s", f"{schedule}/schedule",
        ]  # fmt: skip
        group = ProcessGroup("beat", command, self.env)
        self.groups.append(group)
        return group

    def stop_all(self) -> None:
        """Stop every process this cluster started."""
        for group in self.groups:
            if group.alive():
                group.kill()


#: For tests that SIGKILL pool processes: kombu's filesystem transport (the zero-setup default)
#: cannot survive that, so they need RabbitMQ or Redis (``.ci/run`` provides RabbitMQ).
requires_real_broker = pytest.mark.skipif(
    os.environ.get("CELERY_BROKER_URL", "filesystem://").startswith("filesystem://"),
    reason="kills worker processes mid-task: set CELERY_BROKER_URL to RabbitMQ or Redis",
)


@pytest.fixture
def cluster(transactional_db: None, sandbox: Any, settings: Any) -> Iterator[Cluster]:
    """A factory for real worker and beat processes on the test database and the sandbox.

    Short leases (3 s) and periods (relay 0.5 s, reconciler 1 s) keep the tests quick. The
    test process publishes to the same session queue.
    """
    from django.db import connection

    from console.celery import app

    lease = 3
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "LEASE_SECONDS": lease,
        "PROVIDER_TIMEOUT_SECONDS": 1.0,
    }
    app.conf.task_default_queue = QUEUE
    env = {
        **os.environ,
        "DATABASE_URL": database_url(connection.settings_dict),
        "SANDBOX_PROVIDER_URL": sandbox.url,
        "EFFECT_LEDGER_QUEUE": QUEUE,
        "EFFECT_LEDGER_LEASE_SECONDS": str(lease),
        "EFFECT_LEDGER_PROVIDER_TIMEOUT_SECONDS": "1.0",
        "EFFECT_LEDGER_RELAY_PERIOD_SECONDS": "0.5",
        "EFFECT_LEDGER_RECONCILE_PERIOD_SECONDS": "1.0",
        "PYTHONUNBUFFERED": "1",
        "LOG_LEVEL": "WARNING",
    }
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        env["PROMETHEUS_MULTIPROC_DIR"] = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    cluster = Cluster(env)
    try:
        yield cluster
    finally:
        cluster.stop_all()
