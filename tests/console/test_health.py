"""The health page (issue 16 item 5): worker heartbeats, broker queue depth, the outbox, the
relay's and the reconciler's last runs, provider calls of the last hour, each green, amber or
red by thresholds from settings; it renders whatever the state and never waits long for a broker.
"""

from __future__ import annotations

import json
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test import Client
from django.utils import timezone
from kombu import Connection, Queue

from operations.access.tenants import EVERY_TENANT
from operations.adapters.base import ExecutionResult
from operations.models import Attempt, BeatHeartbeat, Intent, OutboxMessage, PeriodicJobRun, WorkerHeartbeat
from operations.selectors.broker_queues import broker_queue_depths
from operations.selectors.health import periodic_jobs, system_health, worker_heartbeats, workers_signal
from operations.selectors.health_levels import AMBER, GREEN, RED
from operations.selectors.provider_calls import provider_call_stats
from operations.services import (
    intent_claim,
    intent_mark_unknown,
    intent_record_failure,
    intent_record_success,
    periodic_job_record,
    worker_heartbeat_record,
)
from tests.console.test_every_kind import KINDS, serve_every_kind
from tests.factories import UserFactory, submit

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
AMQP = "amqp://guest:guest@127.0.0.1:5672//"


@pytest.fixture
def admin_client(db: Any) -> Client:
    client = Client()
    client.force_login(UserFactory(groups=["admin"]))
    return client


def beat(hostname: str, *, seconds_ago: float = 0.0, queues: list[str] | None = None) -> None:
    """A worker heartbeat recorded through the service, then aged ``seconds_ago``."""
    worker_heartbeat_record(
        hostname=hostname,
        pid=4242,
        queues=queues or ["effect-ledger"],
        concurrency=4,
        started_at=timezone.now(),
    )
    if seconds_ago:
        WorkerHeartbeat.objects.filter(hostname=hostname).update(
            beat_at=Now() - timedelta(seconds=seconds_ago)
        )


def signal_level(body: str, key: str) -> str:
    row = body.split(f'id="signal-{key}"', 1)[1].split("</tr>", 1)[0]
    for level in (GREEN, AMBER, RED):
        if f"level-{level}" in row:
            return level
    raise AssertionError(f"no level in the {key} row: {row}")


# --- any state renders ------------------------------------------------------------------------


def test_i16_5_health_page_renders_on_an_empty_database(admin_client: Client, settings: Any) -> None:
    # given: nothing ever ran (no worker, no job, no call); the zero-setup broker
    settings.CELERY_BROKER_URL = AMQP
    # when
    response = admin_client.get("/health/")
    # then
    body = response.content.decode()
    assert response.status_code == 200
    assert "no worker has ever recorded a heartbeat" in body and signal_level(body, "workers") == RED
    assert "Outbox relay: never ran" in body and signal_level(body, "jobs") == RED
    assert "No provider call in the last hour." in body and signal_level(body, "providers") == GREEN
    assert 'href="/health/" aria-current="page"' in body  # in the nav


def test_i16_5_htmx_refresh_returns_the_signals_fragment_only(admin_client: Client, settings: Any) -> None:
    settings.CELERY_BROKER_URL = AMQP
    response = admin_client.get("/health/", **HTMX)
    body = response.content.decode()
    assert response.status_code == 200 and response["X-Console-Fragment"] == "1"
    assert body.lstrip().startswith('<div id="signals" hx-get="/health/" hx-trigger="every 10s"')
    assert "<html" not in body


def test_i16_5_healthz_is_still_the_load_balancers_probe(client: Client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200 and response.content == b"ok"


def test_i16_5_health_page_is_read_only(admin_client: Client) -> None:
    assert admin_client.post("/health/").status_code == 405


# --- workers ----------------------------------------------------------------------------------


def test_i16_5_a_stale_heartbeat_turns_amber_then_red(settings: Any) -> None:
    # given: late after 30 s, gone after 120 s
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "HEALTH_WORKER_LATE_SECONDS": 30.0,
        "HEALTH_WORKER_GONE_SECONDS": 120.0,
    }
    beat("w1@host")
    beat("w2@host")
    assert workers_signal(worker_heartbeats()).level == GREEN
    # when: one worker's beats stop for 45 s
    WorkerHeartbeat.objects.filter(hostname="w2@host").update(beat_at=Now() - timedelta(seconds=45))
    # then: it is late, the signal amber (another is alive)
    states = {w.hostname: w.state for w in worker_heartbeats()}
    assert states == {"w1@host": "alive", "w2@host": "late"}
    assert workers_signal(worker_heartbeats()).level == AMBER
    # when: past the gone bound, and the other one late too
    WorkerHeartbeat.objects.filter(hostname="w2@host").update(beat_at=Now() - timedelta(seconds=121))
    WorkerHeartbeat.objects.filter(hostname="w1@host").update(beat_at=Now() - timedelta(seconds=31))
    # then: no worker is alive: red
    states = {w.hostname: w.state for w in worker_heartbeats()}
    assert states == {"w1@host": "late", "w2@host": "gone"}
    assert workers_signal(worker_heartbeats()).level == RED


def test_i16_5_worker_thresholds_come_from_settings(settings: Any) -> None:
    beat("w1@host", seconds_ago=10)
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "HEALTH_WORKER_LATE_SECONDS": 5.0}
    assert worker_heartbeats()[0].state == "late"
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "HEALTH_WORKER_LATE_SECONDS": 15.0}
    assert worker_heartbeats()[0].state == "alive"


@pytest.mark.integration
def test_i16_5_a_real_worker_records_its_heartbeats_and_its_stop(
    cluster: Any, settings: Any, admin_client: Client
) -> None:
    # given: a real worker process beating every 0.5 s
    cluster.env["EFFECT_LEDGER_WORKER_HEARTBEAT_SECONDS"] = "0.5"
    settings.CELERY_BROKER_URL = cluster.env["CELERY_BROKER_URL"]
    # when
    worker = cluster.worker("hb")
    # then: its row appears, with its queue and pool, and its beats advance
    deadline = time.monotonic() + 20
    row = None
    while time.monotonic() < deadline and row is None:
        row = WorkerHeartbeat.objects.filter(hostname__startswith="hb-").first()
        time.sleep(0.2)
    assert row is not None, "the worker recorded no heartbeat"
    assert row.queues == [cluster.queue] and row.concurrency == 1 and row.stopped_at is None
    first = row.beat_at
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and WorkerHeartbeat.objects.get(id=row.id).beat_at == first:
        time.sleep(0.2)
    assert WorkerHeartbeat.objects.get(id=row.id).beat_at > first
    body = admin_client.get("/health/").content.decode()
    assert row.hostname in body and "worker-alive" in body and cluster.queue in body
    # when: a warm shutdown
    worker.stop()
    # then: it says goodbye: stopped, not gone
    assert WorkerHeartbeat.objects.get(id=row.id).stopped_at is not None
    assert "worker-stopped" in admin_client.get("/health/").content.decode()


# --- outbox -----------------------------------------------------------------------------------


def outbox_row(**fields: Any) -> OutboxMessage:
    return OutboxMessage.objects.create(task="operations.execute_intent", body="{}", **fields)


def test_i16_5_outbox_backlog_and_oldest_pending(admin_client: Client, settings: Any) -> None:
    # given: two rows due and never handed over (the oldest due 90 s ago), one scheduled for
    # later, one handed over and unacknowledged for an hour (stalled), one acknowledged
    settings.CELERY_BROKER_URL = AMQP
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "OUTBOX_LAG_WARNING_SECONDS": 60,
        "HEALTH_OUTBOX_RED_SECONDS": 300.0,
    }
    now = timezone.now()
    outbox_row(due_at=now - timedelta(seconds=90))
    outbox_row(due_at=now - timedelta(seconds=5))
    outbox_row(due_at=now + timedelta(hours=1))
    outbox_row(due_at=now - timedelta(hours=1), sent_at=now - timedelta(hours=1))
    outbox_row(due_at=now - timedelta(hours=2), sent_at=now - timedelta(hours=2), acked_at=now)
    # when
    health = system_health(scope=EVERY_TENANT, system_wide=True)
    body = admin_client.get("/health/").content.decode()
    # then
    outbox = health["outbox"]
    assert (outbox["pending"], outbox["scheduled"], outbox["stalled"]) == (2, 1, 1)
    assert 90 <= outbox["oldest_pending_seconds"] < 120
    assert signal_level(body, "outbox") == AMBER  # past the 60 s warning
    assert 'id="outbox-pending">2<' in body and 'id="outbox-stalled">1<' in body
    # when: the oldest has waited past the red bound
    OutboxMessage.objects.filter(due_at__lte=now - timedelta(seconds=60), sent_at__isnull=True).update(
        due_at=now - timedelta(seconds=400)
    )
    # then
    assert signal_level(admin_client.get("/health/").content.decode(), "outbox") == RED


# --- periodic jobs ----------------------------------------------------------------------------


def test_i16_5_relay_and_reconciler_runs_are_recorded(admin_client: Client, settings: Any) -> None:
    # given
    from operations.tasks import archive, deliver_webhooks, relay_outbox, send_notifications
    from reconciliation.tasks import prune, reconcile

    settings.CELERY_BROKER_URL = AMQP
    # when: the relay and the reconciler run (here in this process)
    relay_outbox()
    reconcile()
    # then: the two senders of issue 15 are named as never run
    body = admin_client.get("/health/").content.decode()
    assert signal_level(body, "jobs") == RED
    assert "Webhook deliveries: never ran" in body and "Notifications: never ran" in body
    # when: they run too
    deliver_webhooks()
    send_notifications()
    prune()  # issue 36
    archive()  # issue 36: nothing is due, so nothing is written
    # (the daily statement run, issue 19, recorded as its task would: it reads the provider)
    periodic_job_record(name="reconciliation.reconcile_statements", started_at=timezone.now(), duration_ms=40)
    # then: one row each, green
    runs = {run.name: run for run in PeriodicJobRun.objects.all()}
    assert set(runs) == {
        "operations.relay_outbox",
        "reconciliation.reconcile",
        "operations.deliver_webhooks",
        "operations.send_notifications",
        "reconciliation.reconcile_statements",
        "reconciliation.prune",
        "operations.archive",
    }
    assert all(run.last_error == "" and run.last_succeeded_at for run in runs.values())
    body = admin_client.get("/health/").content.decode()
    assert signal_level(body, "jobs") == GREEN and "never ran" not in body
    # when: they run again: still one row each (upserted)
    relay_outbox()
    assert PeriodicJobRun.objects.count() == 7


def test_i16_5_a_failed_relay_run_is_recorded_with_its_error(monkeypatch: Any) -> None:
    from operations.tasks import relay_outbox
    from operations.workers import outbox

    def broken() -> int:
        raise RuntimeError("broker said no")

    monkeypatch.setattr(outbox, "outbox_relay", broken)
    with pytest.raises(RuntimeError):
        relay_outbox()
    run = PeriodicJobRun.objects.get(name="operations.relay_outbox")
    assert "broker said no" in run.last_error and run.last_succeeded_at is None
    job = next(job for job in periodic_jobs() if job["name"] == "operations.relay_outbox")
    assert job["level"] == AMBER


def test_i16_5_periodic_job_thresholds_are_periods_of_the_job(settings: Any) -> None:
    # given: the relay every 2 s; amber after 5 periods (10 s), red after 30 (60 s)
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "RELAY_PERIOD_SECONDS": 2.0,
        "HEALTH_JOB_AMBER_PERIODS": 5.0,
        "HEALTH_JOB_RED_PERIODS": 30.0,
    }
    periodic_job_record(name="operations.relay_outbox", started_at=timezone.now(), duration_ms=3)

    def relay_level(seconds_ago: float) -> str:
        PeriodicJobRun.objects.update(last_finished_at=Now() - timedelta(seconds=seconds_ago))
        return next(j["level"] for j in periodic_jobs() if j["name"] == "operations.relay_outbox")

    assert relay_level(1) == GREEN
    assert relay_level(15) == AMBER
    assert relay_level(61) == RED
    # and a job that never ran is red
    assert next(j["level"] for j in periodic_jobs() if j["name"] == "reconciliation.reconcile") == RED


# --- provider calls -----------------------------------------------------------------------------


def _claim(intent: Intent) -> Any:
    claim = intent_claim(intent_id=intent.id, worker="test-worker", lease_seconds=30)
    assert claim is not None
    return claim


@pytest.fixture
def every_kind(settings: Any) -> None:
    serve_every_kind(settings)
    settings.EFFECT_LEDGER_POLICIES = {action: {"approval": "never"} for action, _ in KINDS.values()}


def call(kind: str, outcome: str, seconds: float, *, tenant: str = "acme") -> Intent:
    """One intent of ``kind`` executed through the services with ``outcome``; its attempt then
    lasted ``seconds`` (claim to record)."""
    action, arguments = KINDS[kind]
    intent = submit(action=action, arguments=arguments, tenant=tenant)
    claim = _claim(intent)
    if outcome == "succeeded":
        result = ExecutionResult(provider_reference=f"ref-{intent.id.hex[:8]}", response_digest="0" * 64)
        assert intent_record_success(claim=claim, result=result)
    elif outcome == "failed":
        assert intent_record_failure(claim=claim, error="declined by the provider")
    else:
        assert intent_mark_unknown(claim=claim, error="timeout after the request was sent", cause="ambiguous")
    Attempt.objects.filter(intent=intent).update(
        started_at=Now() - timedelta(seconds=seconds + 1), finished_at=Now() - timedelta(seconds=1)
    )
    return intent


def test_i16_5_provider_stats_per_kind_from_real_attempts(
    every_kind: None, admin_client: Client, settings: Any
) -> None:
    # given: every kind called; payments.charge four times (1, 2, 3, 4 s; one failed)
    settings.CELERY_BROKER_URL = AMQP
    for seconds, outcome in ((1, "succeeded"), (2, "succeeded"), (3, "failed"), (4, "succeeded")):
        call("payments.charge", outcome, seconds)
    call("payments.refund", "succeeded", 0.5)
    call("email.send", "unknown", 10)
    call("reservations.create", "succeeded", 0.2)
    call("reservations.cancel", "failed", 0.3)
    call("generic-with-lookup", "succeeded", 0.4)
    call("generic-without-lookup", "unknown", 1.0)
    call("smtp", "unknown", 2.0)
    call("declared-without-keys", "unknown", 1.5)
    call("stripe", "succeeded", 0.6)
    call("stripe.refund", "succeeded", 0.7)
    # an attempt of two hours ago is outside the window
    old = call("payments.charge", "succeeded", 1)
    Attempt.objects.filter(intent=old).update(started_at=Now() - timedelta(hours=2))
    # when
    stats = {row["action"]: row for row in provider_call_stats()}
    body = admin_client.get("/health/").content.decode()
    # then: one row per action, counts by outcome, percentiles of the finished calls
    assert set(stats) == {action for action, _ in KINDS.values()}
    charge = stats["payments.charge"]
    assert (
        charge["calls"] == 4 and charge["by_result"]["succeeded"] == 3 and charge["by_result"]["failed"] == 1
    )
    assert charge["p50_seconds"] == pytest.approx(2.5, abs=0.01)
    assert charge["p95_seconds"] == pytest.approx(3.85, abs=0.01)  # percentile_cont, linear
    assert charge["adapter"] == "SandboxPaymentsAdapter"
    assert (
        stats["email.send"]["by_result"]["unknown"] == 1
        and stats["email.send"]["adapter"] == "SandboxEmailAdapter"
    )
    # a definite refusal (reservation not found) is the provider working: no trouble counted
    assert stats["reservations.cancel"]["by_result"]["failed"] == 1
    assert stats["reservations.cancel"]["failures"] == 0 and stats["reservations.cancel"]["level"] == GREEN
    assert (
        stats["acme.transfer"]["adapter"] == "generic HTTP"
        and stats["acme.notify"]["adapter"] == "generic HTTP"
        and stats["stripe.charge"]["adapter"] == "generic HTTP"
        and stats["mail.notify"]["adapter"] == "SMTP"
    )
    # levels: the charge's 3.85 s p95 is amber (its one definite refusal is not trouble);
    # email's 10 s unknown: red; refund green
    assert charge["failures"] == 0 and charge["level"] == AMBER and stats["email.send"]["level"] == RED
    assert stats["payments.refund"]["level"] == GREEN
    for action, _ in KINDS.values():
        assert f'id="provider-{action.replace(".", "")}"' in body
    assert '<span class="outcome">succeeded 3</span> · <span class="outcome">failed 1</span>' in body
    assert signal_level(body, "providers") == RED


def test_i16_5_declined_cards_are_not_provider_trouble_but_no_answer_is(every_kind: None) -> None:
    # given: a healthy provider that declined 3 of 5 charges (the reviewer saw it red at 38 %)
    for outcome in ("failed", "failed", "failed", "succeeded", "succeeded"):
        call("payments.charge", outcome, 0.2)
    # then: green, with the refusals still among the outcomes
    (charge,) = provider_call_stats()
    assert charge["level"] == GREEN and charge["failures"] == 0 and charge["by_result"]["failed"] == 3
    # and when calls end without a definite answer (timeouts after sending), it turns red
    call("payments.charge", "unknown", 0.2)
    call("payments.charge", "unknown", 0.2)
    (charge,) = provider_call_stats()
    assert charge["failures"] == 2 and charge["level"] == RED  # 2 of 7: over 25 %


def test_i16_5_provider_thresholds_come_from_settings(every_kind: None, settings: Any) -> None:
    call("payments.refund", "succeeded", 3.0)
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "HEALTH_PROVIDER_P95_AMBER_SECONDS": 2.0}
    assert provider_call_stats()[0]["level"] == AMBER
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "HEALTH_PROVIDER_P95_AMBER_SECONDS": 5.0}
    assert provider_call_stats()[0]["level"] == GREEN


def test_i16_5_a_tenant_reader_sees_its_provider_calls_only_and_no_system_signals(
    every_kind: None, settings: Any
) -> None:
    # given: calls of two tenants, workers and an outbox, and a viewer of acme only
    settings.CELERY_BROKER_URL = AMQP
    call("payments.charge", "succeeded", 1, tenant="acme")
    call("email.send", "failed", 1, tenant="globex")
    beat("w1@secret-host")
    client = Client()
    client.force_login(UserFactory(groups=["viewer"], tenants=["acme"]))
    # when
    response = client.get("/health/")
    # then: acme's action only; no worker, broker, outbox or job section
    body = response.content.decode()
    assert response.status_code == 200
    assert 'id="provider-paymentscharge"' in body and 'id="provider-emailsend"' not in body
    assert (
        "secret-host" not in body and 'id="signal-workers"' not in body and 'id="outbox-pending"' not in body
    )
    assert "shown to a role on every tenant" in body
    # and the level on top is not called the system's summary (the reviewer saw "Summary:
    # green" for a tenant account on a system with no worker)
    assert "Summary:" not in body and 'id="summary-partial"' in body


# --- broker -------------------------------------------------------------------------------------


def test_i16_5_broker_unreachable_is_unknown_not_500(admin_client: Client, settings: Any) -> None:
    # given: nothing listens on the broker's port
    settings.CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:1//"
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "HEALTH_BROKER_TIMEOUT_SECONDS": 1.0}
    # when
    started = time.monotonic()
    response = admin_client.get("/health/")
    elapsed = time.monotonic() - started
    # then
    body = response.content.decode()
    assert response.status_code == 200 and elapsed < 5
    assert 'id="broker-unknown"' in body and "Depth unknown (" in body
    assert signal_level(body, "broker") == RED and "unknown (" in body


@pytest.fixture
def silent_broker() -> Iterator[int]:
    """A TCP port that accepts connections and never answers (a hung broker, a firewall)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    server.close()


def test_i16_5_a_broker_that_never_answers_costs_the_page_its_timeout_only(
    admin_client: Client, settings: Any, silent_broker: int
) -> None:
    settings.CELERY_BROKER_URL = f"amqp://guest:guest@127.0.0.1:{silent_broker}//"
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "HEALTH_BROKER_TIMEOUT_SECONDS": 1.0}
    started = time.monotonic()
    response = admin_client.get("/health/")
    elapsed = time.monotonic() - started
    assert response.status_code == 200 and elapsed < 3
    assert "Depth unknown (" in response.content.decode()


def test_i16_5_queue_depth_on_rabbitmq(settings: Any) -> None:
    # given: three messages in a fresh queue of the real broker
    settings.CELERY_BROKER_URL = AMQP
    name = f"health-{time.monotonic_ns()}"
    with Connection(AMQP) as conn:
        queue = Queue(name, channel=conn.default_channel, auto_delete=False)
        queue.declare()
        producer = conn.Producer()
        for n in range(3):
            producer.publish({"n": n}, routing_key=name)
        try:
            # when
            report = broker_queue_depths([name, f"{name}-never-declared"])
        finally:
            queue.delete()
    # then
    depths = {q.name: q for q in report.queues}
    assert report.unreachable == "" and report.transport == "amqp"
    assert depths[name].messages == 3
    assert depths[f"{name}-never-declared"].messages is None
    assert "not declared" in depths[f"{name}-never-declared"].reason


def test_i16_5_queue_depth_on_the_filesystem_broker(settings: Any) -> None:
    # given: quickstart's broker (kombu's filesystem transport), two messages in its folder
    folder = tempfile.mkdtemp(prefix="health-broker-")
    options = {"data_folder_in": folder, "data_folder_out": folder, "processed_folder": folder}
    settings.CELERY_BROKER_URL = "filesystem://"
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = options
    with Connection("filesystem://", transport_options=options) as conn:
        producer = conn.Producer()
        for n in range(2):
            producer.publish({"n": n}, routing_key="effect-ledger", declare=[Queue("effect-ledger")])
    # when
    report = broker_queue_depths(["effect-ledger"])
    # then
    assert report.unreachable == "" and report.transport == "filesystem"
    assert [(q.name, q.messages) for q in report.queues] == [("effect-ledger", 2)]


def redis_available() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.mark.skipif(not redis_available(), reason="no Redis on 127.0.0.1:6379")
def test_i16_5_queue_depth_on_redis(settings: Any) -> None:
    url = "redis://127.0.0.1:6379/15"
    settings.CELERY_BROKER_URL = url
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {}
    name = f"health-{time.monotonic_ns()}"
    with Connection(url) as conn:
        producer = conn.Producer()
        for n in range(4):
            producer.publish(json.dumps({"n": n}), routing_key=name, declare=[Queue(name)])
        try:
            report = broker_queue_depths([name, f"{name}-empty"])
        finally:
            Queue(name, channel=conn.default_channel).delete()
    depths = {q.name: q.messages for q in report.queues}
    assert report.unreachable == "" and depths == {name: 4, f"{name}-empty": 0}


def test_i16_5_queue_depth_thresholds(settings: Any) -> None:
    settings.CELERY_BROKER_URL = AMQP
    name = f"health-{time.monotonic_ns()}"
    with Connection(AMQP) as conn:
        queue = Queue(name, channel=conn.default_channel, auto_delete=False)
        queue.declare()
        for n in range(5):
            conn.Producer().publish({"n": n}, routing_key=name)
        try:
            settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "HEALTH_QUEUE_DEPTH_AMBER": 5,
                                      "HEALTH_QUEUE_DEPTH_RED": 10}  # fmt: skip
            assert broker_queue_depths([name]).queues[0].level == AMBER
            settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "HEALTH_QUEUE_DEPTH_RED": 5}
            assert broker_queue_depths([name]).queues[0].level == RED
            settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "HEALTH_QUEUE_DEPTH_AMBER": 6,
                                      "HEALTH_QUEUE_DEPTH_RED": 10}  # fmt: skip
            assert broker_queue_depths([name]).queues[0].level == GREEN
        finally:
            queue.delete()


def test_i16_5_attempts_of_the_last_hour_are_read_through_an_index() -> None:
    # The aggregate reads a range of attempt_started, not the whole table.
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        cursor.execute(
            "EXPLAIN SELECT count(*) FROM operations_attempt WHERE started_at >= now() - interval '1 hour'"
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("SET enable_seqscan = on")
    assert "attempt_started" in plan


def test_i16_5_metrics_expose_worker_states_and_job_ages(client: Client) -> None:
    # given
    beat("w1@host")
    beat("w2@host", seconds_ago=600)
    periodic_job_record(name="operations.relay_outbox", started_at=timezone.now(), duration_ms=5)
    # when
    body = client.get("/metrics").content.decode()
    # then
    assert 'effect_ledger_workers{state="alive"} 1.0' in body
    assert 'effect_ledger_workers{state="gone"} 1.0' in body
    assert 'effect_ledger_periodic_job_age_seconds{job="operations.relay_outbox"}' in body
    assert 'job="reconciliation.reconcile"' not in body  # never ran: absent, not 0


def test_i36_a_job_the_running_beat_has_not_had_time_to_run_is_not_due_yet(admin_client: Client) -> None:
    """A job added by an upgrade (the archive, pruning: hourly) or a fresh install's daily
    statement run has never run an hour after the beat started: not due yet, green; the same job
    with a beat up longer than its red threshold never ran: red."""
    from operations.services.beats import beat_heartbeat_record
    from operations.tasks import deliver_webhooks, relay_outbox, send_notifications
    from reconciliation.tasks import reconcile

    for job in (relay_outbox, reconcile, deliver_webhooks, send_notifications):
        job()
    beat_heartbeat_record(
        identity="beat-1", host="host-a", pid=7, started_at=timezone.now() - timedelta(minutes=5)
    )
    body = admin_client.get("/health/").content.decode()
    assert "Archive: not due yet" in body and "Pruning: not due yet" in body
    assert "Statement reconciliation: not due yet" in body
    assert signal_level(body, "jobs") != RED
    # when: the beat has been up for days and the archive still never ran
    BeatHeartbeat.objects.update(started_at=Now() - timedelta(days=30))
    body = admin_client.get("/health/").content.decode()
    assert "Archive: never ran" in body and signal_level(body, "jobs") == RED


def test_i39_1_a_job_that_never_ran_is_due_one_period_after_the_beat_started(admin_client: Client) -> None:
    """A daily job that never runs is not green for a month (main: not due for 30 periods, the
    red threshold): green for one period and the start-up grace, amber one period more, then red."""
    from operations.selectors.health import NOT_DUE_GRACE_SECONDS
    from operations.services.beats import beat_heartbeat_record

    def statement_job(beat_up: timedelta) -> dict[str, Any]:
        BeatHeartbeat.objects.all().delete()
        beat_heartbeat_record(identity="beat-1", host="host-a", pid=7, started_at=timezone.now() - beat_up)
        return next(j for j in periodic_jobs() if j["name"] == "reconciliation.reconcile_statements")

    grace = timedelta(seconds=NOT_DUE_GRACE_SECONDS)
    # given / then: a fresh install, and one whose beat has been up a little under a day
    assert statement_job(timedelta(minutes=5))["level"] == GREEN
    assert statement_job(timedelta(days=1))["level"] == GREEN
    # a day and the grace later the daily run is due and never came: amber, then red a day later
    assert statement_job(timedelta(days=1) + grace + timedelta(minutes=5))["level"] == AMBER
    assert statement_job(timedelta(days=2) + grace + timedelta(minutes=5))["level"] == RED
    # and the page says which
    body = admin_client.get("/health/").content.decode()
    assert (
        "Statement reconciliation: never ran" in body
        and "never ran, due 24 h 1 min after the beat started" in body
    )
