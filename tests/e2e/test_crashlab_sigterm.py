"""SIGTERM to ``manage.py crashlab`` tears down what the run started (issue 35): the command is
started as a real subprocess, every process it starts is recorded while it runs (its descendants:
sandbox provider, workers, beat, ``socat`` forwarders), then it gets SIGTERM; within 30 s it
has exited 143 and none of them, nor its network namespaces nor its broker queue, is left.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from kombu import Queue

from console.celery import app
from console.lab.cluster import BASE_DIR, database_url, wait_until
from console.lab.crashlab.partition_drill import unavailable_reason
from console.lab.models import DrillRun
from tests.support.workers import requires_real_broker

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True), requires_real_broker]

#: How long the command may take to tear down after SIGTERM, seconds.
TEARDOWN_SECONDS = 30


class Run:
    """``manage.py crashlab ARGS`` in a session of its own, and every descendant it ever had
    (pid -> (start time, command line)), recorded by ``record``."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        env = {**os.environ, "DATABASE_URL": database_url()}
        with log.open("w") as out:
            self.popen = subprocess.Popen(  # noqa: S603 - our own command
                [sys.executable, str(BASE_DIR / "manage.py"), "crashlab", *args],
                cwd=BASE_DIR, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.seen: dict[int, tuple[float, str]] = {}

    def record(self) -> dict[int, tuple[float, str]]:
        """Add the command's current descendants to ``seen``; return ``seen``."""
        with contextlib.suppress(psutil.NoSuchProcess):
            for child in psutil.Process(self.popen.pid).children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    self.seen.setdefault(child.pid, (child.create_time(), " ".join(child.cmdline())))
        return self.seen

    def left(self) -> list[str]:
        """The recorded descendants still running (same pid and start time, not a zombie)."""
        running = []
        for pid, (started, cmdline) in self.seen.items():
            with contextlib.suppress(psutil.NoSuchProcess):
                process = psutil.Process(pid)
                if process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE:
                    running.append(f"{pid}: {cmdline}")
        return running

    def queue(self) -> str:
        """The run's Celery queue, from its workers' ``-Q`` option ("" before one started)."""
        for _, cmdline in self.seen.values():
            found = re.search(r" -Q (lab-[0-9a-f]+)", cmdline)
            if found:
                return found.group(1)
        return ""

    def terminate(self) -> int:
        """SIGTERM to the command alone; its exit status (waits ``TEARDOWN_SECONDS`` at most)."""
        self.record()
        self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout=TEARDOWN_SECONDS)

    def clean_up(self) -> None:
        """Whatever the command left (a failing run): SIGKILL it and its recorded descendants."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)
        for line in self.left():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split(":")[0]), signal.SIGKILL)


def queue_exists(name: str) -> bool:
    """Whether the broker still has queue ``name`` (a passive declare)."""
    with app.connection_for_write() as conn:
        try:
            Queue(name, channel=conn.default_channel).queue_declare(passive=True)
        except conn.channel_errors:
            return False
    return True


def delete_queue(name: str) -> None:
    """Delete queue ``name`` (a failing run's leftover)."""
    with app.connection_for_write() as conn, contextlib.suppress(*conn.channel_errors):
        Queue(name, channel=conn.default_channel).delete()


def has_children(pid: int) -> bool:
    """Whether process ``pid`` has children (a prefork worker: its pool is up)."""
    try:
        return bool(psutil.Process(pid).children())
    except psutil.NoSuchProcess:
        return False


def namespace_of(pid: int) -> str:
    """The named network namespace process ``pid`` runs in ("" for the host's)."""
    done = subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True, check=False)  # noqa: S603, S607
    return done.stdout.strip()


def namespaces(prefix: str) -> list[str]:
    """Named network namespaces whose name starts with ``prefix``."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout  # noqa: S603, S607
    return [line.split()[0] for line in listed.splitlines() if line.startswith(prefix)]


@pytest.fixture
def crashlab(tmp_path: Path) -> Iterator[Callable[[list[str]], Run]]:
    """Start ``manage.py crashlab ARGS`` runs; whatever a run leaves is removed after the test."""
    runs: list[Run] = []

    def start(args: list[str]) -> Run:
        runs.append(Run(args, tmp_path / f"crashlab-{len(runs)}.log"))
        return runs[-1]

    yield start
    for run in runs:
        run.clean_up()
        if run.queue():
            delete_queue(run.queue())


def test_i35_sigterm_tears_the_partition_drill_down(crashlab: Callable[[list[str]], Run]) -> None:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    # given: a partition drill whose two workers run in its network namespaces
    run = crashlab(["--partition"])
    tags: set[str] = set()

    def namespaced_workers() -> bool:
        assert run.popen.poll() is None, run.log.read_text()[-3000:]
        for pid, (_, cmdline) in run.record().items():
            name = namespace_of(pid) if "celery" in cmdline else ""
            if name.startswith("elp-"):
                tags.add(name.rsplit("-", 1)[0] + "-")
        workers = [
            pid for pid, (_, cmdline) in run.seen.items() if " worker " in cmdline and namespace_of(pid)
        ]
        return len(workers) >= 2

    wait_until(namespaced_workers, 90, "the drill's workers in their namespaces", 0.2)
    forwarders = [cmdline for _, cmdline in run.seen.values() if cmdline.startswith("socat")]
    try:
        # when
        status = run.terminate()
        # then: exited 143; no process of it, no namespace of it, no queue of it is left
        assert forwarders and tags and run.queue()
        assert run.left() == []
        assert [ns for tag in tags for ns in namespaces(tag)] == []
        assert not queue_exists(run.queue())
        assert status == 128 + signal.SIGTERM, run.log.read_text()[-3000:]
    finally:
        for tag in tags:
            for name in namespaces(tag):
                subprocess.run(["ip", "netns", "del", name], check=False)  # noqa: S603, S607


def test_i35_sigterm_tears_the_crash_matrix_down(crashlab: Callable[[list[str]], Run]) -> None:
    # given: a one-cell crash matrix whose workers are up (their pool processes started)
    run = crashlab(["--ops", "10", "--boundaries", "none", "--strategies", "ledger", "--no-variants"])

    def workers_up() -> bool:
        assert run.popen.poll() is None, run.log.read_text()[-3000:]
        return any(" worker " in cmdline and has_children(pid) for pid, (_, cmdline) in run.record().items())

    wait_until(workers_up, 60, "the crash lab's workers", 0.2)
    # when
    status = run.terminate()
    # then: exited 143, nothing of it left, and its run recorded as ended
    assert run.queue() and any("sandbox_provider" in cmdline for _, cmdline in run.seen.values())
    assert run.left() == []
    assert not queue_exists(run.queue())
    assert status == 128 + signal.SIGTERM, run.log.read_text()[-3000:]
    drill = DrillRun.objects.get(kind=DrillRun.Kind.CRASHLAB)
    assert drill.finished_at is not None and drill.passed is False and "SystemExit" in drill.error
