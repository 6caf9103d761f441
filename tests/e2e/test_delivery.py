"""Delivery with real worker, beat, web and sandbox processes: a database outage loses no
delivery and the API says 503 meanwhile (C17); a long delay waits in PostgreSQL, not in the
broker (C15)."""

from __future__ import annotations

import os
import re
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.db import connection
from django.db.models.functions import Now
from kombu import Exchange, Queue
from kombu.exceptions import ChannelError

from console.celery import app
from console.lab.cluster import Process, database_url
from operations.models import AuditEvent, Intent, OutboxMessage
from operations.workers.outbox import outbox_relay
from tests.factories import charge_arguments, make_agent, submit
from tests.support.tcp_proxy import TcpProxy
from tests.support.workers import Cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

#: A wait between two events of one intent's timeline longer than this (seconds) must be
#: explained by an event (a re-dispatch, a lease takeover, a claim after database retries).
GAP_SECONDS = 2.5


@pytest.fixture
def db_proxy(transactional_db: None) -> Iterator[TcpProxy]:
    """A cuttable TCP proxy in front of the test database's PostgreSQL."""
    conf = connection.settings_dict
    proxy = TcpProxy(str(conf.get("HOST") or "127.0.0.1"), int(conf.get("PORT") or 5432)).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def submit_charges(count: int, prefix: str) -> list[Intent]:
    return [submit(arguments=charge_arguments(100 + n, reference=f"{prefix}-{n:03d}"), reference=f"{prefix}-{n:03d}")
            for n in range(count)]  # fmt: skip


def unexplained_gaps(intent_ids: list[Any]) -> list[str]:
    """Waits longer than ``GAP_SECONDS`` between consecutive audit events that no event explains."""
    found = []
    events = AuditEvent.objects.filter(intent_id__in=intent_ids).order_by("intent_id", "seq")
    previous: AuditEvent | None = None
    for event in events:
        if previous is not None and previous.intent_id == event.intent_id:
            gap = (event.created_at - previous.created_at).total_seconds()
            backoff = (
                float(previous.data.get("backoff_seconds", 0)) if previous.event == "retry_scheduled" else 0
            )
            explained = (
                gap <= GAP_SECONDS + backoff
                or event.event in {"redispatched", "lease_taken_over"}
                or (event.event == "claimed" and event.data.get("delivery_retries", 0) > 0)
            )
            if not explained:
                found.append(f"{event.intent_id}: {gap:.1f} s between {previous.event} and {event.event}")
        previous = event
    return found


def test_c17_database_outage_while_workers_take_messages(
    cluster: Cluster, sandbox: Any, db_proxy: TcpProxy
) -> None:
    # given: workers (and the reconciler and relay they run) reach PostgreSQL through the proxy
    cluster.use_database_url(database_url(host="127.0.0.1", port=db_proxy.port))
    cluster.worker("w1", concurrency=2)
    cluster.worker("w2", concurrency=2)
    cluster.beat()
    before = submit_charges(60, "c17-before")
    wait_for(
        lambda: Intent.objects.filter(id__in=[i.id for i in before], status="SUCCEEDED").count() >= 5,
        60,
        "the first intents to succeed",
    )
    # when: the database goes away for 4 s under load; this process (its own connection)
    # submits and publishes more intents meanwhile, which the workers take during the outage
    db_proxy.cut()
    cut_at = time.monotonic()
    during = submit_charges(20, "c17-during")
    time.sleep(max(0.0, 4.0 - (time.monotonic() - cut_at)))
    db_proxy.restore()
    restored_at = time.monotonic()
    intents = before + during
    ids = [i.id for i in intents]
    wait_for(
        lambda: Intent.objects.filter(id__in=ids, status="SUCCEEDED").count() == len(ids),
        60,
        "every intent to succeed after the restore",
    )
    took = time.monotonic() - restored_at
    # then: every intent ran within seconds of the restore (far below the old 120 s sweep)
    assert took < 10, f"took {took:.1f} s after the restore"
    # exactly one effect per intent at the provider, under the intent's own key
    effects = sandbox.ledger("payments")
    keys = Counter(e["idempotency_key"] for e in effects)
    assert set(keys) == {i.idempotency_key for i in intents} and max(keys.values()) == 1
    # the workers took messages during the outage and retried them instead of dropping them
    retried = AuditEvent.objects.filter(intent_id__in=ids, event="claimed", data__delivery_retries__gt=0)
    assert retried.exists(), "no delivery was retried: the outage did not reach a worker"
    assert all("while the database was unreachable" in e.reason for e in retried)
    # and no timeline has a wait that no event explains
    assert unexplained_gaps(ids) == []


@pytest.fixture
def web_via_proxy(db_proxy: TcpProxy) -> Iterator[str]:
    """A gunicorn process serving the project, reaching PostgreSQL through the proxy."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url(host="127.0.0.1", port=db_proxy.port),
        "DATABASE_CONNECT_TIMEOUT": "2",
        "PYTHONUNBUFFERED": "1",
    }
    command = [sys.executable, "-m", "gunicorn", "console.wsgi:application", "-b", "127.0.0.1:0", "-w", "1"]
    server = Process("web", command, env)
    try:
        wait_for(lambda: "Listening at: " in server.output() or not server.alive(), 30, "gunicorn")
        match = re.search(r"Listening at: (http://127\.0\.0\.1:\d+)", server.output())
        assert match and server.alive(), server.output()[-2000:]
        yield match.group(1)
    finally:
        server.stop(timeout=5)


def test_c17_api_answers_503_with_retry_after_while_the_database_is_unreachable(
    db_proxy: TcpProxy, web_via_proxy: str
) -> None:
    # given: an agent, and a web server that reaches the database through the proxy
    _, token = make_agent()
    client = httpx.Client(base_url=web_via_proxy, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert client.get("/api/v1/intents").status_code == 200
    body = {"action": "payments.charge", "arguments": charge_arguments(), "reference": "c17-api"}
    # when: the database becomes unreachable
    db_proxy.cut()
    submitted = client.post("/api/v1/intents", json=body, headers={"Idempotency-Key": "c17-api-1"})
    read = client.get(f"/api/v1/intents/{uuid.uuid4()}")
    browser = httpx.Client(base_url=web_via_proxy, cookies={"sessionid": "x" * 32}, timeout=10)
    console = browser.get("/")  # a session cookie: the console must read the session
    # then: 503 problem details with Retry-After from the API (authentication included) ...
    for response in (submitted, read):
        assert response.status_code == 503, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert int(response.headers["retry-after"]) > 0
        problem = response.json()
        assert (problem["status"], problem["code"]) == (503, "database-unavailable")
    # ... and a plain 503 page from the console
    assert console.status_code == 503 and console.headers["content-type"].startswith("text/html")
    assert int(console.headers["retry-after"]) > 0 and "database cannot be reached" in console.text
    assert not Intent.objects.filter(reference="c17-api").exists()
    # and once the database is back, the same request is accepted
    db_proxy.restore()
    wait_for(
        lambda: (
            client.post("/api/v1/intents", json=body, headers={"Idempotency-Key": "c17-api-1"}).status_code
            == 201
        ),
        15,
        "the API to accept the submission again",
    )
    assert Intent.objects.filter(reference="c17-api").count() == 1


def queued_messages(queue: str) -> int:
    """Messages waiting in the broker queue (not yet taken by a worker). Redis keeps a queue as
    a list, which disappears when empty: "not found" there means none."""
    with app.connection_for_read() as conn:
        bound = Queue(queue, Exchange(queue), routing_key=queue)(conn.default_channel)
        try:
            return int(bound.queue_declare(passive=True).message_count)
        except ChannelError:
            if conn.transport.driver_type == "redis":
                return 0
            raise


def test_c15_a_retry_due_in_an_hour_waits_in_the_database_not_in_the_broker(
    cluster: Cluster, sandbox: Any, settings: Any
) -> None:
    # given: a policy whose backoff cap is 4,000 s, and a provider that fails the first attempt
    # before its commit point
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "payments.charge": {"retry": {"base_seconds": 4000, "cap_seconds": 4000}},
    }
    worker = cluster.worker("w1")  # beat comes later, so the queue holds only execute messages
    sandbox.inject("error_500_before_effect", product="payments", reference="c15-late")
    intent = submit(arguments=charge_arguments(reference="c15-late"), reference="c15-late")
    wait_for(
        lambda: Intent.objects.filter(id=intent.id, status="READY", attempt_count=1).exists(),
        30,
        "the first attempt to fail and be rescheduled",
    )
    intent.refresh_from_db()
    assert intent.not_before is not None
    with connection.cursor() as cursor:
        cursor.execute("SELECT EXTRACT(EPOCH FROM %s - statement_timestamp())", [intent.not_before])
        assert float(cursor.fetchone()[0]) > 1800  # about an hour out
    # when: the relay runs several times (what beat runs every period)
    for _ in range(4):
        assert outbox_relay() == 0
        time.sleep(0.5)
    # then: the retry's message is in the database, unpublished; nothing waits in the broker
    retry_row = OutboxMessage.objects.get(intent=intent, sent_at__isnull=True)
    assert retry_row.publish_count == 0 and retry_row.due_at == intent.not_before
    assert queued_messages(cluster.queue) == 0
    # and the worker keeps running and serving other intents
    other = submit(arguments=charge_arguments(reference="c15-other"), reference="c15-other")
    wait_for(lambda: Intent.objects.filter(id=other.id, status="SUCCEEDED").exists(), 30, "another intent")
    assert worker.alive()
    # when: the hour has passed (the intent's not_before and its message's due_at, both stored
    # times, move back to just before now)
    Intent.objects.filter(id=intent.id).update(not_before=Now() - timedelta(seconds=1))
    OutboxMessage.objects.filter(id=retry_row.id).update(due_at=Now() - timedelta(seconds=1))
    cluster.beat()
    # then: the periodic relay publishes it, a real worker executes it, once
    wait_for(lambda: Intent.objects.filter(id=intent.id, status="SUCCEEDED").exists(), 30, "the retry to run")
    retry_row.refresh_from_db()
    assert retry_row.publish_count == 1
    assert len(sandbox.ledger("payments", reference="c15-late")) == 1
    assert worker.alive()
