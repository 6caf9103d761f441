"""Real Celery worker and beat processes for integration tests, on the product's own lab
harness (``console.lab.cluster``).

Each test session gets its own queue name, so stray messages from other runs on the same broker
never reach these workers. The broker is ``CELERY_BROKER_URL`` when set (RabbitMQ in CI), else
the filesystem transport under the data folder.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from console.lab.cluster import HarnessError, LocalCluster, Process

QUEUE = f"test-{uuid.uuid4().hex[:10]}"

#: For tests that SIGKILL pool processes: kombu's filesystem transport (the zero-setup default)
#: cannot survive that, so they need RabbitMQ or Redis (``.ci/run`` provides RabbitMQ).
requires_real_broker = pytest.mark.skipif(
    os.environ.get("CELERY_BROKER_URL", "filesystem://").startswith("filesystem://"),
    reason="kills worker processes mid-task: set CELERY_BROKER_URL to RabbitMQ or Redis",
)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
    """Poll ``predicate`` until true; fail the test naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


class Cluster(LocalCluster):
    """``LocalCluster`` with test-friendly failures (a process that cannot start fails the test)."""

    def set_timing(self, *, lease_seconds: int, provider_timeout_seconds: float) -> None:
        """Change the lease and provider deadline of workers started from now on."""
        self.env["EFFECT_LEDGER_LEASE_SECONDS"] = str(lease_seconds)
        self.env["EFFECT_LEDGER_PROVIDER_TIMEOUT_SECONDS"] = str(provider_timeout_seconds)

    def use_database_url(self, url: str) -> None:
        """Give processes started from now on this ``DATABASE_URL`` (e.g. through a proxy that
        the test can cut); this process keeps its own connection."""
        self.env["DATABASE_URL"] = url

    def worker(self, name: str, concurrency: int = 1, prefetch: int = 1) -> Process:
        """Start a worker on the session queue and wait until it is ready."""
        try:
            return self.start_worker(name, concurrency=concurrency, prefetch=prefetch)
        except HarnessError as exc:
            pytest.fail(str(exc))

    def beat(self) -> Process:
        """Start beat (outbox relay every 0.5 s, reconciler every 1 s)."""
        return self.start_beat()


@pytest.fixture
def cluster(transactional_db: None, sandbox: Any, settings: Any) -> Iterator[Cluster]:
    """A factory for real worker and beat processes on the test database and the sandbox.

    Short leases (3 s) and periods (relay 0.5 s, reconciler 1 s) keep the tests quick. The
    test process publishes to the same session queue.
    """
    lease = 3
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "LEASE_SECONDS": lease,
        "PROVIDER_TIMEOUT_SECONDS": 1.0,
    }
    cluster = Cluster(
        sandbox_url=sandbox.url,
        lease_seconds=lease,
        provider_timeout_seconds=1.0,
        relay_period=0.5,
        reconcile_period=1.0,
        queue=QUEUE,
    )
    cluster.use_queue_here()
    try:
        yield cluster
    finally:
        cluster.stop()
