"""Start real Effect Ledger processes on this machine: Celery workers, beat, the sandbox
provider. Used by ``manage.py crashlab`` and ``manage.py bench``; every address is loopback.
Its workers register the product's tasks and the lab's (``--include`` of ``LAB_TASK_MODULES``).

Each process runs in its own session so that a whole worker (main process and pool children)
can be signalled at once, or one pool child alone (``os.kill(pid, SIGKILL)``).
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
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import psutil
from django.conf import settings
from django.db import connection
from kombu import Queue

from console.celery import app
from console.lab import LAB_TASK_MODULES
from console.lab.sandbox_provider.database import prepare_default_database

BASE_DIR = Path(settings.BASE_DIR)


class HarnessError(RuntimeError):
    """A process failed to start or a condition was not reached in time."""


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll ``predicate`` until it is true.

    Raises:
        HarnessError: naming ``what`` after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise HarnessError(f"timed out after {timeout:.0f} s waiting for {what}")


def database_url(*, host: str | None = None, port: int | None = None) -> str:
    """A ``DATABASE_URL`` naming the database this process uses (for child processes).

    Args:
        host, port: reach that database at another TCP address instead (e.g. a test's proxy in
            front of PostgreSQL); the database name and credentials stay the same.
    """
    conf = connection.settings_dict
    user = quote(str(conf.get("USER") or "postgres"))
    password = quote(str(conf.get("PASSWORD") or ""))
    if host is not None or port is not None:
        return f"postgres://{user}:{password}@{host or '127.0.0.1'}:{port or 5432}/{conf['NAME']}"
    host = conf.get("HOST") or ""
    if host and not str(host).startswith("/"):
        return f"postgres://{user}:{password}@{host}:{conf.get('PORT') or 5432}/{conf['NAME']}"
    socket_dir = host or (conf.get("OPTIONS") or {}).get("host", "")
    return f"postgresql://{user}:{password}@/{conf['NAME']}?host={socket_dir}"


def direct_database_url() -> str:
    """A ``DATABASE_LISTEN_URL`` naming the database this process uses, on the server reached
    directly (``console.lab.bench.database.direct_settings_dict``; the pooler bypassed)."""
    from console.lab.bench.database import direct_settings_dict

    conf = direct_settings_dict(str(connection.settings_dict["NAME"]))
    user = quote(str(conf.get("USER") or "postgres"))
    password = quote(str(conf.get("PASSWORD") or ""))
    return f"postgres://{user}:{password}@{conf.get('HOST') or '127.0.0.1'}:{conf.get('PORT') or 5432}/{conf['NAME']}"


class Process:
    """One child process in its own session, output to a log file."""

    def __init__(self, name: str, command: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.log = Path(tempfile.mkstemp(prefix=f"effect-ledger-{name}-", suffix=".log")[1])
        self._log_file = self.log.open("w")
        self.popen = subprocess.Popen(
            command,
            cwd=BASE_DIR,
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        """Everything the process printed so far."""
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        """True while the main process runs."""
        return self.popen.poll() is None

    def kill_group(self) -> None:
        """SIGKILL the main process and all its children at once."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        self._log_file.close()

    def stop(self, timeout: float = 15) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL of the group after ``timeout`` seconds."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=timeout)
        self.kill_group()


def stop_processes(processes: list[Process], *, grace: float) -> None:
    """Stop ``processes`` together: SIGTERM to each main process, then, after at most ``grace``
    seconds in all, SIGKILL to each one's whole process group (``Process.kill_group``), whether or
    not it stopped: one that ignores SIGTERM, or hangs in a warm shutdown, is ended all the same."""
    for process in processes:
        if process.alive():
            with contextlib.suppress(ProcessLookupError):
                process.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        process.kill_group()


class LocalCluster:
    """Workers, beat and (optionally) a sandbox provider on the current database.

    Args:
        sandbox_url: use this running sandbox instead of starting one.
        lease_seconds, provider_timeout_seconds: the workers' lease and provider deadline.
        relay_period, reconcile_period: beat periods in seconds.
        queue: the Celery queue (a fresh one by default, so no stray message interferes).
    """

    def __init__(
        self,
        *,
        sandbox_url: str | None = None,
        lease_seconds: int = 30,
        provider_timeout_seconds: float = 10.0,
        relay_period: float = 2.0,
        reconcile_period: float = 5.0,
        queue: str | None = None,
    ) -> None:
        self.queue = queue or f"lab-{uuid.uuid4().hex[:8]}"
        self.processes: list[Process] = []
        self.sandbox_url = sandbox_url or ""
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "EFFECT_LEDGER_QUEUE": self.queue,
            "EFFECT_LEDGER_LEASE_SECONDS": str(lease_seconds),
            "EFFECT_LEDGER_PROVIDER_TIMEOUT_SECONDS": str(provider_timeout_seconds),
            "EFFECT_LEDGER_RELAY_PERIOD_SECONDS": str(relay_period),
            "EFFECT_LEDGER_RECONCILE_PERIOD_SECONDS": str(reconcile_period),
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            # The children compare their database with the checkpoint file this process uses
            # (under pytest, the test's own): never another database's file, which would look
            # like a restore and pause them (operations.restore.check).
            "EFFECT_LEDGER_AUDIT_CHECKPOINT_FILE": str(settings.EFFECT_LEDGER["AUDIT_CHECKPOINT_FILE"]),
            "PYTHONUNBUFFERED": "1",
            "LOG_LEVEL": "WARNING",
            # The lab drives the sandbox provider's actions (issue 33 item 6).
            "EFFECT_LEDGER_SANDBOX": "1",
            # The lab's web processes (the benchmark's gunicorn) measure the ledger, not the API's
            # rate limits (operations/api/throttling.py).
            "EFFECT_LEDGER_RATE_AGENT": "off",
            "EFFECT_LEDGER_RATE_TENANT": "off",
        }
        if sandbox_url:
            self.env["SANDBOX_PROVIDER_URL"] = sandbox_url
        if getattr(settings, "DATABASE_LISTEN_URL", ""):
            # Behind a pooler: the children's direct URL names the database they use (a drill's
            # scratch database), not the one this process was started on.
            self.env["DATABASE_LISTEN_URL"] = direct_database_url()

    def start_sandbox(self, *, dsn: str | None = None) -> str:
        """Start ``manage.py sandbox_provider`` on a free loopback port; return its URL.

        Args:
            dsn: the provider's database; by default ``<this process's database>_sandbox``
                (created when missing; under pytest the test database's, so per test run),
                never ``SANDBOX_DATABASE_URL``: the lab empties its provider at will.
        """
        dsn = dsn or prepare_default_database(connection.settings_dict)
        process = Process(
            "sandbox",
            [
                sys.executable,
                str(BASE_DIR / "manage.py"),
                "sandbox_provider",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--dsn",
                dsn,
            ],
            self.env,
        )
        self.processes.append(process)
        marker = "sandbox provider listening on "
        wait_until(lambda: marker in process.output() or not process.alive(), 30, "the sandbox provider")
        if not process.alive():
            raise HarnessError(f"sandbox provider exited:\n{process.output()[-2000:]}")
        line = next(line for line in process.output().splitlines() if marker in line)
        self.sandbox_url = line.split(marker, 1)[1].strip()
        self.env["SANDBOX_PROVIDER_URL"] = self.sandbox_url
        return self.sandbox_url

    def start_worker(
        self,
        name: str,
        *,
        concurrency: int = 1,
        prefetch: int = 1,
        pool: str = "prefork",
        queue: str = "",
        wrap: Callable[[list[str]], list[str]] | None = None,
        env: dict[str, str] | None = None,
    ) -> Process:
        """Start ``celery worker -P <pool>`` (prefork, threads or solo) on ``queue`` (default the
        cluster's), with the lab's tasks, and wait until it is ready.

        Args:
            wrap: turns the command into the one run (e.g. inside a network namespace,
                ``console.lab.crashlab.partition_drill.PartitionNet.command``).
            env: variables set for this worker only, over the cluster's (e.g. the addresses it
                reaches the database, broker and provider at).
        """
        command = [
            sys.executable, "-m", "celery", "-A", "console", "worker", "-l", "INFO", "-P", pool,
            "--include", ",".join(LAB_TASK_MODULES),
            "-c", str(concurrency), "-n", f"{name}-{uuid.uuid4().hex[:6]}@%h", "-Q", queue or self.queue,
            "--prefetch-multiplier", str(prefetch), "--without-gossip", "--without-mingle",
        ]  # fmt: skip
        process = Process(name, wrap(command) if wrap else command, {**self.env, **(env or {})})
        self.processes.append(process)
        wait_until(lambda: " ready." in process.output() or not process.alive(), 60, f"worker {name}")
        if not process.alive():
            raise HarnessError(f"worker {name} exited:\n{process.output()[-2000:]}")
        return process

    def start_beat(self, *, name: str = "beat", env: dict[str, str] | None = None) -> Process:
        """Start ``celery beat`` (every periodic job); ``env`` overrides the cluster's
        environment for this process. Run exactly one in production (docs/how-to/deploy.md);
        the lab starts two to prove the jobs are safe when it is not so (issue 35, C27)."""
        schedule = tempfile.mkdtemp(prefix="effect-ledger-beat-")
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "console",
            "beat",
            "-l",
            "WARNING",
            "-s",
            f"{schedule}/s",
        ]
        process = Process(name, command, {**self.env, **(env or {})})
        self.processes.append(process)
        return process

    def use_queue_here(self) -> None:
        """Make this process publish to the cluster's queue (the outbox relay runs here too)."""
        app.conf.task_default_queue = self.queue

    def pids(self) -> list[int]:
        """Every live pid of the cluster (main processes and their children)."""
        found: list[int] = []
        for process in self.processes:
            if process.alive():
                with contextlib.suppress(psutil.NoSuchProcess):
                    parent = psutil.Process(process.popen.pid)
                    found.append(parent.pid)
                    found.extend(child.pid for child in parent.children(recursive=True))
        return found

    def stop(self) -> None:
        """Stop every process (SIGKILL; nothing here needs a graceful end) and delete the
        cluster's queue from the broker, so runs leave nothing behind."""
        for process in self.processes:
            if process.alive():
                process.kill_group()
        try:
            with app.connection_for_write() as conn:
                Queue(self.queue, channel=conn.default_channel).delete()
        except Exception:  # noqa: BLE001 - best effort: a broker that is gone keeps nothing
            pass


def require_real_broker(what: str) -> None:
    """Refuse to kill worker processes on kombu's filesystem transport.

    A pool process killed mid-task can leave the prefork pool's shared queue lock held on the
    filesystem transport (it has no asynchronous consumer), freezing its sibling processes;
    RabbitMQ and Redis do not have the problem.

    Raises:
        HarnessError: naming ``what`` and how to point it at a real broker.
    """
    if settings.CELERY_BROKER_URL.startswith("filesystem://"):
        raise HarnessError(
            f"{what} kills worker processes mid-task, which kombu's filesystem transport does not survive; "
            "set CELERY_BROKER_URL to RabbitMQ (amqp://...) or Redis (redis://...)"
        )
