"""The API's rate limit holds across web processes (issue 18, item 7): two real gunicorn
processes share the limit's window (the database's table here, Redis when configured)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import httpx
import pytest

from console.lab.cluster import Process, database_url
from operations.models import RateWindow
from tests.factories import make_agent
from tests.support.workers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PORTS = (8631, 8632)
LIMIT = 6


@pytest.fixture
def two_web_processes(transactional_db: None) -> Iterator[list[str]]:
    """Two gunicorn processes on the test database, limited to ``LIMIT`` requests a minute per agent."""
    RateWindow.objects.all().delete()
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "EFFECT_LEDGER_RATE_AGENT": f"{LIMIT}/min",
        "EFFECT_LEDGER_RATE_TENANT": "off",
        "EFFECT_LEDGER_CACHE_URL": "",  # the database's windows, as a deployment without Redis
        "PYTHONUNBUFFERED": "1",
    }
    servers = []
    try:
        for port in PORTS:
            command = [
                sys.executable,
                "-m",
                "gunicorn",
                "console.wsgi:application",
                "-b",
                f"127.0.0.1:{port}",
                "-w",
                "1",
            ]
            servers.append(Process(f"web-{port}", command, env))
        for server in servers:
            wait_for(lambda s=server: "Listening at: " in s.output() or not s.alive(), 30, "gunicorn")
            assert server.alive(), server.output()[-2000:]
        yield [f"http://127.0.0.1:{port}" for port in PORTS]
    finally:
        for server in servers:
            server.stop(timeout=5)


def test_i18_7_two_web_processes_share_one_agents_limit(two_web_processes: list[str]) -> None:
    # given: an agent, and a client per web process
    _, token = make_agent("flooder")
    headers = {"Authorization": f"Bearer {token}"}
    clients = [httpx.Client(base_url=url, headers=headers, timeout=10) for url in two_web_processes]
    # when: LIMIT + 1 requests alternate between the two processes
    answers = [clients[n % 2].get("/api/v1/intents") for n in range(LIMIT + 1)]
    # then: each process served some of the first LIMIT; the next one is refused by whichever
    # process gets it, because both count in the same window
    assert [a.status_code for a in answers] == [200] * LIMIT + [429], [a.text for a in answers]
    over = answers[-1]
    assert over.headers["content-type"] == "application/problem+json"
    assert 1 <= int(over.headers["retry-after"]) <= 60
    assert over.json()["code"] == "rate-limited"
    # and the other process refuses it too
    assert clients[0].get("/api/v1/intents").status_code == 429
    for client in clients:
        client.close()
