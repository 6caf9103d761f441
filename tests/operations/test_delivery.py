"""Delivery timing against the real broker and PostgreSQL: delays stay in the database and
nothing reaches the broker with a countdown above the bound (C15); a re-dispatch is audited;
the stalled-READY threshold follows the settings; "database unreachable" is told apart from a
failed statement."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection, connections
from django.db.models.functions import Now
from django.db.utils import load_backend
from kombu import Exchange, Queue

from console.celery import app
from operations.engine.protocol import execute_intent
from operations.models import AuditEvent, Intent, OutboxMessage
from operations.selectors import ledger_gauges
from operations.services import intent_cancel, intent_claim, intent_schedule_retry
from operations.workers.delivery import (
    DATABASE_RETRY_MAX_SECONDS,
    MAX_COUNTDOWN_SECONDS,
    bounded_countdown,
    database_retry_countdown,
    database_unavailable,
    stalled_ready_seconds,
)
from operations.workers.outbox import outbox_relay
from tests.factories import submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def broker_queue() -> Iterator[Callable[[], list[Any]]]:
    """Point this process's publisher at a fresh queue on the real broker; yield a function
    that takes every message waiting in it."""
    name = f"unit-{uuid.uuid4().hex[:10]}"
    previous = app.conf.task_default_queue
    app.conf.task_default_queue = name
    queue = Queue(name, Exchange(name), routing_key=name)
    with app.connection_for_write() as conn:
        queue(conn.default_channel).declare()

    def drain() -> list[Any]:
        messages = []
        with app.connection_for_read() as conn:
            bound = queue(conn.default_channel)
            while (message := bound.get(no_ack=True)) is not None:
                messages.append(message)
        return messages

    try:
        yield drain
    finally:
        app.conf.task_default_queue = previous
        with app.connection_for_write() as conn:
            queue(conn.default_channel).delete()


def schedule_retry_after(settings: Any, seconds: float) -> Intent:
    """A READY intent whose first attempt was rescheduled between ``seconds / 2`` and
    ``seconds`` out (a retryable error under a policy with base = cap = ``seconds``; equal jitter)."""
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "payments.charge": {"retry": {"base_seconds": seconds, "cap_seconds": seconds}},
    }
    intent = submit()
    OutboxMessage.objects.filter(intent=intent).update(sent_at=Now())  # the first message went out
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None and intent_schedule_retry(claim=claim, error="provider 503")
    return Intent.objects.get(id=intent.id)


def seconds_until(moment: datetime) -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT EXTRACT(EPOCH FROM %s - statement_timestamp())", [moment])
        return float(cursor.fetchone()[0])


def eta_seconds(message: Any) -> float | None:
    eta = message.headers.get("eta")
    if not eta:
        return None
    return seconds_until(datetime.fromisoformat(eta))


def test_bounded_countdown_never_exceeds_the_bound() -> None:
    # given / when / then
    assert bounded_countdown(3185) == MAX_COUNTDOWN_SECONDS
    assert bounded_countdown(12.5) == 12.5
    assert bounded_countdown(-3) == 0
    assert all(0 < database_retry_countdown(n) <= DATABASE_RETRY_MAX_SECONDS for n in range(20))


def test_c15_relay_publishes_only_within_the_countdown_bound(
    settings: Any, broker_queue: Callable[[], list[Any]]
) -> None:
    # given: one intent due now, one retry due in under 30 s, one retry due in about an hour;
    # the hand-offs after commit of the first two failed (the broker was down)
    now_due = submit()
    soon = schedule_retry_after(settings, 10)
    later = schedule_retry_after(settings, 3600)
    assert 1700 < seconds_until(later.not_before) <= 3600  # type: ignore[arg-type]
    OutboxMessage.objects.filter(acked_at__isnull=True).update(sent_at=None)
    # when
    sent = outbox_relay()
    # then: two messages reach the broker, none with a countdown above the bound
    messages = broker_queue()
    assert sent == 2 and len(messages) == 2
    by_intent = {m.payload[1]["intent_id"]: m for m in messages}
    assert set(by_intent) == {str(now_due.id), str(soon.id)}
    assert eta_seconds(by_intent[str(now_due.id)]) is None
    soon_eta = eta_seconds(by_intent[str(soon.id)])
    assert soon_eta is not None and 0 < soon_eta <= MAX_COUNTDOWN_SECONDS
    # the hour-long delay stays in the database, unpublished and not counted as lag
    waiting = OutboxMessage.objects.get(intent=later, sent_at__isnull=True)
    assert waiting.publish_count == 0 and waiting.due_at == later.not_before
    gauges = ledger_gauges()
    assert (gauges["outbox_pending"], gauges["outbox_scheduled"]) == (0, 1)
    assert gauges["outbox_oldest_pending_seconds"] == 0


def test_c15_the_hand_off_after_commit_keeps_the_same_bound(
    settings: Any, broker_queue: Callable[[], list[Any]], django_capture_on_commit_callbacks: Any
) -> None:
    # given: two intents whose first messages were consumed, under policies retrying 10 s and
    # an hour out
    intents = []
    for seconds in (10, 3600):
        settings.EFFECT_LEDGER_POLICIES = {
            **settings.EFFECT_LEDGER_POLICIES,
            "payments.charge": {"retry": {"base_seconds": seconds, "cap_seconds": seconds}},
        }
        intents.append(submit())
    soon, later = intents
    OutboxMessage.objects.update(acked_at=Now())
    # when: their retries are scheduled and the writes commit
    with django_capture_on_commit_callbacks(execute=True):
        for intent in intents:
            claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
            assert claim is not None and intent_schedule_retry(claim=claim, error="provider 503")
    # then: the first is handed to the broker with a countdown within the bound, the second
    # stays in the database, never handed over
    [message] = broker_queue()
    assert message.payload[1]["intent_id"] == str(soon.id)
    eta = eta_seconds(message)
    assert eta is not None and 0 < eta <= MAX_COUNTDOWN_SECONDS
    waiting = OutboxMessage.objects.get(intent=later, acked_at__isnull=True)
    assert waiting.sent_at is None and waiting.publish_count == 0


def test_c15_a_row_becomes_lag_only_once_it_is_due(
    settings: Any, broker_queue: Callable[[], list[Any]]
) -> None:
    # given: a retry due in an hour, then the hour passes without the relay running
    later = schedule_retry_after(settings, 3600)
    assert ledger_gauges()["outbox_oldest_pending_seconds"] == 0
    OutboxMessage.objects.filter(intent=later, sent_at__isnull=True).update(
        due_at=Now() - timedelta(seconds=100)
    )
    Intent.objects.filter(id=later.id).update(not_before=Now() - timedelta(seconds=100))
    # when
    gauges = ledger_gauges()
    # then: now it is lag, and the relay publishes it without a countdown
    assert (gauges["outbox_pending"], gauges["outbox_scheduled"]) == (1, 0)
    assert 99 < gauges["outbox_oldest_pending_seconds"] < 110
    assert outbox_relay() == 1
    [message] = broker_queue()
    assert message.payload[1]["intent_id"] == str(later.id) and eta_seconds(message) is None


def test_c15_an_early_delivery_is_redispatched_audited_and_kept_until_due(
    settings: Any, broker_queue: Callable[[], list[Any]]
) -> None:
    # given: a retry due in an hour whose message arrives now (an early ETA, clock skew)
    later = schedule_retry_after(settings, 3600)
    OutboxMessage.objects.filter(intent=later).update(sent_at=Now())
    # when
    label = execute_intent(later.id, worker="w9")
    # then: nothing claimed; a fresh message waits in the database until not_before, audited
    assert label == "duplicate"
    event = AuditEvent.objects.filter(intent=later).order_by("-seq").first()
    assert event is not None and event.event == "redispatched" and event.actor == "worker:w9"
    assert "before its not_before" in event.reason
    fresh = OutboxMessage.objects.get(id=event.data["message_id"])
    assert fresh.due_at == later.not_before and fresh.sent_at is None and fresh.acked_at is None
    assert outbox_relay() == 0 and broker_queue() == []


def test_stalled_ready_threshold_follows_the_relay_period_broker_settings_and_lease(settings: Any) -> None:
    # given: the test cluster's timing (relay 0.5 s, lease 3 s) and the broker's publish policy
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "RELAY_PERIOD_SECONDS": 0.5, "LEASE_SECONDS": 3}
    settings.CELERY_BROKER_CONNECTION_TIMEOUT = 4.0
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {"max_retries": 1, "interval_max": 0.5}
    settings.CELERY_WORKER_PREFETCH_MULTIPLIER = 1
    # when / then: relay + publication (4 s x 2 tries + 0.5 s) + 1 x lease + database retry + relay
    assert stalled_ready_seconds() == 0.5 + 8.5 + 3 + DATABASE_RETRY_MAX_SECONDS + 0.5
    settings.CELERY_WORKER_PREFETCH_MULTIPLIER = 4
    assert stalled_ready_seconds() == 0.5 + 8.5 + 4 * 3 + DATABASE_RETRY_MAX_SECONDS + 0.5


def test_stalled_ready_redispatch_waits_for_the_threshold_and_is_audited() -> None:
    from reconciliation.services import redispatch_stalled_ready

    # given: a READY intent whose message was consumed without running (acknowledged by a
    # delivery that died), unmoved for just under the threshold
    threshold = stalled_ready_seconds()
    intent = submit()
    OutboxMessage.objects.filter(intent=intent).update(sent_at=Now(), acked_at=Now())
    Intent.objects.filter(id=intent.id).update(updated_at=Now() - timedelta(seconds=threshold - 5))
    assert redispatch_stalled_ready().moved == 0
    # when: the threshold passes
    Intent.objects.filter(id=intent.id).update(updated_at=Now() - timedelta(seconds=threshold + 1))
    counts = redispatch_stalled_ready()
    # then: one fresh message, and the timeline says why
    assert counts.moved == 1
    event = AuditEvent.objects.filter(intent=intent).order_by("-seq").first()
    assert event is not None and (event.event, event.actor) == ("redispatched", "reconciler")
    assert "presumed lost" in event.reason and (event.from_status, event.to_status) == ("READY", "READY")
    assert OutboxMessage.objects.filter(intent=intent, acked_at__isnull=True).count() == 1


def test_a_handed_over_message_never_consumed_is_published_again_after_the_stalled_bound(
    broker_queue: Callable[[], list[Any]],
) -> None:
    from reconciliation.services import redispatch_stalled_ready

    # given: a READY intent whose message was handed over at commit and then lost (the writer
    # died before publishing, or the broker lost it), just under the stalled bound ago
    threshold = stalled_ready_seconds()
    intent = submit()
    message = OutboxMessage.objects.get(intent=intent)
    OutboxMessage.objects.filter(id=message.id).update(sent_at=Now() - timedelta(seconds=threshold - 5))
    Intent.objects.filter(id=intent.id).update(updated_at=Now() - timedelta(seconds=threshold + 60))
    # then: neither the relay nor the sweep acts yet
    assert outbox_relay() == 0 and redispatch_stalled_ready().moved == 0
    # when: the bound passes
    OutboxMessage.objects.filter(id=message.id).update(sent_at=Now() - timedelta(seconds=threshold + 1))
    # then: the relay publishes the same row again (same id and body), the sweep adds nothing
    assert outbox_relay() == 1 and redispatch_stalled_ready().moved == 0
    [published] = broker_queue()
    assert published.headers["id"] == str(message.id)
    message.refresh_from_db()
    assert message.publish_count == 2 and message.acked_at is None
    # when: a claim consumes it, nothing is published again however long it waits
    assert intent_claim(intent_id=intent.id, worker="w", lease_seconds=30) is not None
    OutboxMessage.objects.filter(id=message.id).update(sent_at=Now() - timedelta(seconds=threshold + 1))
    assert outbox_relay() == 0
    assert OutboxMessage.objects.get(id=message.id).acked_at is not None


def test_a_handed_over_message_is_not_published_again_while_execution_is_paused(
    broker_queue: Callable[[], list[Any]],
) -> None:
    from operations.services.failover import execution_pause, execution_resume

    # given: a message handed over and unconsumed past the stalled bound, execution paused
    intent = submit()
    OutboxMessage.objects.filter(intent=intent).update(
        sent_at=Now() - timedelta(seconds=stalled_ready_seconds() + 1)
    )
    assert execution_pause(reason="database behind", actor="detector:test")
    # then: no claim could consume it; the recovery that resumes re-dispatches READY intents
    assert outbox_relay() == 0 and broker_queue() == []
    # and once execution resumes, the relay publishes it again
    assert execution_resume(actor="user:op")
    assert outbox_relay() == 1 and len(broker_queue()) == 1


def test_the_relay_acknowledges_a_message_whose_intent_left_ready_without_publishing(
    broker_queue: Callable[[], list[Any]],
) -> None:
    # given: an intent cancelled while its message was never handed over
    intent = submit()
    OutboxMessage.objects.filter(intent=intent).update(sent_at=None)
    intent_cancel(intent_id=intent.id, actor="agent:a")
    # when
    sent = outbox_relay()
    # then
    assert sent == 0 and broker_queue() == []
    assert OutboxMessage.objects.get(intent=intent).acked_at is not None


def test_stalled_ready_sweep_wakes_an_intent_whose_only_message_is_due_later(settings: Any) -> None:
    from reconciliation.services import redispatch_stalled_ready

    # given: a retry due in an hour, then its not_before moved back (an operator, a clock fix)
    later = schedule_retry_after(settings, 3600)
    Intent.objects.filter(id=later.id).update(
        not_before=Now() - timedelta(minutes=5), updated_at=Now() - timedelta(minutes=5)
    )
    # when
    counts = redispatch_stalled_ready()
    # then: a message due now, beside the one still waiting for the hour
    assert counts.moved == 1
    pending = OutboxMessage.objects.filter(intent=later, acked_at__isnull=True)
    assert pending.count() == 2 and pending.filter(due_at__lte=Now()).count() == 1


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_database_unavailable_tells_an_unreachable_server_from_a_failed_statement() -> None:
    # given: a Django connection to a port where no server listens
    conf = {**connections["default"].settings_dict, "HOST": "127.0.0.1", "PORT": closed_port()}
    unreachable = load_backend(conf["ENGINE"]).DatabaseWrapper(conf, alias="unreachable")
    # when / then: refused -> unavailable
    with pytest.raises(Exception) as refused:
        unreachable.ensure_connection()
    assert database_unavailable(refused.value)
    # a backend terminated by the server (57P01 or a closed socket) -> unavailable
    dsn = connection.connection.info.dsn  # type: ignore[union-attr]
    with psycopg.connect(dsn, autocommit=True) as victim:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [victim.info.backend_pid])
        with pytest.raises(psycopg.Error) as terminated:
            victim.execute("SELECT 1")
    assert database_unavailable(terminated.value)
    # a statement timeout and a missing table are answers from a live server -> not unavailable
    with psycopg.connect(dsn, autocommit=True) as live:
        with pytest.raises(psycopg.Error) as timeout:
            live.execute("SET statement_timeout = 10; SELECT pg_sleep(1)")
        assert not database_unavailable(timeout.value)
        with pytest.raises(psycopg.Error) as missing:
            live.execute("SELECT * FROM no_such_table")
        assert not database_unavailable(missing.value)


def test_redis_visibility_timeout_must_exceed_the_countdown_bound_and_task_time_limit(settings: Any) -> None:
    from operations.checks import redis_visibility_timeout_check

    # given: a Redis broker whose visibility timeout is shorter than bound + time limit (30 + 90 s)
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:6379/0"
    settings.CELERY_TASK_TIME_LIMIT = 90
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 100}
    # when / then
    assert [message.id for message in redis_visibility_timeout_check()] == ["operations.E001"]
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
    assert redis_visibility_timeout_check() == []
    settings.CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:5672//"
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {}
    assert redis_visibility_timeout_check() == []
