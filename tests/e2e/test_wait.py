"""Waiting without polling in a real web process (issue 15, part 2): gunicorn run with the
project's configuration (``gthread`` workers) serves other requests while one waits, and the
waiting request answers when a status change is committed elsewhere (here: this test's process,
through the service), through the worker's own LISTEN connection."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.db import connection

from console.lab.cluster import Process, database_url
from operations.services import intent_cancel
from tests.factories import make_agent, submit
from tests.support.workers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def web(transactional_db: None) -> Iterator[str]:
    """One gunicorn worker process (``console.gunicorn_conf``: gthread, 4 threads) on the test database."""
    port = _free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "EFFECT_LEDGER_WEB_THREADS": "4",
        "EFFECT_LEDGER_RATE_AGENT": "off",
        "EFFECT_LEDGER_RATE_TENANT": "off",
        "PYTHONUNBUFFERED": "1",
    }
    command = [sys.executable, "-m", "gunicorn", "-c", "python:console.gunicorn_conf", "console.wsgi:application",
               "-b", f"127.0.0.1:{port}", "-w", "1", "--no-control-socket"]  # fmt: skip
    server = Process(f"web-{port}", command, env)
    try:
        wait_for(lambda: "Listening at: " in server.output() or not server.alive(), 30, "gunicorn")
        assert server.alive(), server.output()[-2000:]
        assert "Using worker: gthread" in server.output(), server.output()[-2000:]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop(timeout=10)


def test_a_gthread_worker_serves_others_while_a_request_waits_and_wakes_it_on_commit(web: str) -> None:
    # given: an agent's intent, and a request waiting up to 25 s for it to change
    _, token = make_agent()
    intent = submit()
    client = httpx.Client(base_url=web, headers={"Authorization": f"Bearer {token}"}, timeout=40)
    answer: dict[str, Any] = {}

    def wait() -> None:
        started = time.monotonic()
        answer["response"] = client.get(f"/api/v1/intents/{intent.id}", params={"wait": "25"})
        answer["elapsed"] = time.monotonic() - started

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    wait_for(lambda: _listener_connected(), 20, "the web process's LISTEN connection")
    # when: meanwhile, another request to the same single worker process
    started = time.monotonic()
    plain = client.get(f"/api/v1/intents/{intent.id}")
    plain_elapsed = time.monotonic() - started
    # then: answered while the other one still waits
    assert plain.status_code == 200 and "effect-ledger-wait" not in plain.headers
    assert plain_elapsed < 10, plain_elapsed
    assert waiter.is_alive()
    # when: the intent is cancelled in this process (a committed transaction elsewhere)
    intent_cancel(intent_id=intent.id, actor="agent:agent-1", reason="no longer needed")
    waiter.join(40)
    # then: the waiting request answered with the change, well before its 25 s
    response = answer["response"]
    assert response.status_code == 200, response.text
    assert (response.json()["status"], response.headers["effect-ledger-wait"]) == ("CANCELLED", "changed")
    assert answer["elapsed"] < 20, answer["elapsed"]
    client.close()


def _listener_connected() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'effect-ledger-listener'"
        )
        row = cursor.fetchone()
    return bool(row and row[0] >= 1)
