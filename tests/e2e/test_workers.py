"""The engine with real Celery worker processes, a real broker, the real sandbox process and
PostgreSQL: deliveries repeat and workers die; effects do not repeat and intents are not lost.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from typing import Any

import pytest
from django.db import connection, transaction

from console.celery import app
from operations.models import Attempt, Intent, OutboxMessage
from operations.workers import outbox
from operations.workers.outbox import outbox_relay
from tests.factories import charge_arguments, submit
from tests.support.workers import Cluster, requires_real_broker, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TERMINAL = {"SUCCEEDED", "FAILED", "COMPENSATED", "REJECTED", "EXPIRED", "CANCELLED"}


def submit_charges(count: int, prefix: str) -> list[Intent]:
    return [submit(arguments=charge_arguments(100 + n, reference=f"{prefix}-{n:03d}"), reference=f"{prefix}-{n:03d}")
            for n in range(count)]  # fmt: skip


def provider_requests(sandbox: Any) -> list[dict[str, Any]]:
    """Every payments POST the provider received (its request log)."""
    response = sandbox.client.get("/_sandbox/requests", params={"product": "payments"})
    response.raise_for_status()
    requests: list[dict[str, Any]] = response.json()["requests"]
    return requests


def use_broker(url: str) -> None:
    """Point this process's Celery publisher at ``url``, dropping pooled connections."""
    app.conf.broker_write_url = url
    app.amqp._producer_pool = None
    app._pool = None


def all_terminal(ids: list[Any]) -> bool:
    return not Intent.objects.filter(id__in=ids).exclude(status__in=TERMINAL).exists()


def assert_one_effect_each(sandbox: Any, intents: list[Intent]) -> None:
    effects = sandbox.ledger("payments")
    keys = Counter(e["idempotency_key"] for e in effects)
    assert len(effects) == len(intents), f"{len(effects)} effects for {len(intents)} intents"
    assert set(keys) == {i.idempotency_key for i in intents}
    assert max(keys.values()) == 1
    statuses = Counter(Intent.objects.filter(id__in=[i.id for i in intents]).values_list("status", flat=True))
    assert statuses == {"SUCCEEDED": len(intents)}


def test_200_intents_across_two_workers_one_effect_each(cluster: Cluster, sandbox: Any) -> None:
    # given
    cluster.worker("w1")
    cluster.worker("w2")
    cluster.beat()
    # when
    intents = submit_charges(200, "bulk")
    ids = [i.id for i in intents]
    wait_for(lambda: all_terminal(ids), 120, "200 intents to finish")
    # then
    assert_one_effect_each(sandbox, intents)
    workers = set(Attempt.objects.filter(intent_id__in=ids).values_list("worker", flat=True))
    assert len(workers) >= 2, "both worker processes should have executed intents"


@requires_real_broker
def test_sigkill_right_after_effect_on_every_tenth_intent(cluster: Cluster, sandbox: Any) -> None:
    # given: the provider applies every tenth charge, then holds the connection open; the
    # worker waiting for the answer (deadline 4 s, lease 8 s) is killed with SIGKILL
    cluster.set_timing(lease_seconds=8, provider_timeout_seconds=4.0)
    cluster.worker("w1")
    cluster.worker("w2")
    cluster.beat()
    victims = [f"kill-{n:03d}" for n in range(0, 50, 10)]
    for reference in victims:
        sandbox.inject("hold_after_effect", product="payments", reference=reference, delay_seconds=30)
    # when
    intents = submit_charges(50, "kill")
    by_ref = {i.reference: i for i in intents}
    killed = 0
    for reference in victims:
        wait_for(
            lambda r=reference: bool(sandbox.ledger("payments", reference=r)), 60, f"effect for {reference}"
        )
        intent = Intent.objects.get(id=by_ref[reference].id)
        assert (intent.status, intent.attempt_count) == ("RUNNING", 1), "the worker must still be waiting"
        pid = int(intent.lease_owner.rsplit(":", 1)[1])
        os.kill(pid, signal.SIGKILL)  # the pool process that holds the lease, mid-call
        killed += 1
    ids = [i.id for i in intents]
    wait_for(lambda: all_terminal(ids), 120, "all intents to finish after the kills")
    # then: one effect per intent, the same key on every attempt
    assert killed == 5
    assert_one_effect_each(sandbox, intents)
    for reference in victims:
        intent = by_ref[reference]
        attempts = Attempt.objects.filter(intent=intent).order_by("attempt_no")
        assert attempts.count() >= 2 and attempts[0].result == "abandoned"
        keys = {r["idempotency_key"] for r in provider_requests(sandbox) if r.get("reference") == reference}
        assert keys == {intent.idempotency_key}


def test_c01_warm_shutdown_of_one_worker_mid_batch(cluster: Cluster, sandbox: Any) -> None:
    # given
    w1 = cluster.worker("w1")
    cluster.worker("w2")
    cluster.beat()
    intents = submit_charges(150, "warm")
    ids = [i.id for i in intents]
    wait_for(lambda: Intent.objects.filter(id__in=ids, status="SUCCEEDED").count() >= 30, 60, "30 done")
    # when: warm shutdown (SIGTERM) of one worker while work remains
    w1.stop()
    wait_for(lambda: all_terminal(ids), 120, "the other worker to finish the batch")
    # then
    assert_one_effect_each(sandbox, intents)


@requires_real_broker
def test_c02_sigkill_every_worker_with_acks_late(cluster: Cluster, sandbox: Any) -> None:
    # given: six long intents, two running when every worker process is SIGKILLed
    worker = cluster.worker("w1", concurrency=2, prefetch=2)
    cluster.beat()
    for n in range(6):
        sandbox.inject("delay_after_effect", product="payments", reference=f"long-{n:03d}", delay_seconds=0.8)
    intents = submit_charges(6, "long")
    ids = [i.id for i in intents]
    wait_for(lambda: Intent.objects.filter(id__in=ids, status="RUNNING").count() >= 2, 30, "two running")
    # when
    worker.kill_group()
    restarted = time.monotonic()
    cluster.worker("w2", concurrency=2, prefetch=2)
    wait_for(lambda: all_terminal(ids), 90, "all six to finish")
    # then: well before any broker visibility timeout, each intent has one effect
    assert time.monotonic() - restarted < 90
    assert_one_effect_each(sandbox, intents)


def test_c03_nothing_is_published_before_commit_and_rollback_publishes_nothing(
    cluster: Cluster, sandbox: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: a worker, and every publication of this process (the submitter's hand-off after
    # commit) recorded with whether a transaction was still open, then sent to the real broker
    cluster.worker("w1")
    publish = outbox._publish
    published: list[bool] = []

    def recorded(message: Any, countdown: float) -> None:
        published.append(connection.in_atomic_block)
        publish(message, countdown)

    monkeypatch.setattr(outbox, "_publish", recorded)

    class Rollback(Exception):
        pass

    # when: submit inside a transaction that sleeps and then rolls back
    with pytest.raises(Rollback), transaction.atomic():
        submit(reference="rolled-back")
        time.sleep(1)
        raise Rollback
    # and: submit inside a transaction that sleeps and then commits
    with transaction.atomic():
        kept = submit(reference="kept")
        time.sleep(1)
        assert published == []
    wait_for(lambda: all_terminal([kept.id]), 30, "the committed intent to finish")
    # then: one publication, after the commit; nothing for the rolled-back submission
    assert published == [False]
    assert OutboxMessage.objects.count() == 1
    assert Intent.objects.count() == 1
    assert len(sandbox.ledger("payments")) == 1
    assert Attempt.objects.filter(intent=kept).count() == 1


def test_c04_c11_broker_down_at_commit_then_back(cluster: Cluster, sandbox: Any, approver: Any) -> None:
    # given: the broker is unreachable when intents commit (auto-approved and approved ones)
    from operations.services import intent_approve

    real_broker = app.conf.broker_write_url or app.conf.broker_url
    use_broker("amqp://guest:guest@127.0.0.1:1//")  # nothing listens on port 1
    try:
        auto = submit_charges(3, "down")
        gated = submit(arguments=charge_arguments(50_000), reference="down-approved")
        intent_approve(intent_id=gated.id, user=approver, request_hash=gated.request_hash)
        # then: nothing lost; rows wait in the outbox
        pending = OutboxMessage.objects.filter(sent_at__isnull=True).count()
        assert pending == 4
        assert set(Intent.objects.values_list("status", flat=True)) == {"READY"}
    finally:
        use_broker(real_broker)
    # when: the broker is back and the relay runs
    cluster.worker("w1")
    outbox_relay()  # (a periodic relay task left in the session queue may publish them first)
    wait_for(
        lambda: not OutboxMessage.objects.filter(sent_at__isnull=True).exists(), 30, "the outbox to drain"
    )
    ids = [i.id for i in auto] + [gated.id]
    wait_for(lambda: all_terminal(ids), 60, "all to finish once the broker is back")
    # then: exactly one effect each
    assert_one_effect_each(sandbox, [*auto, gated])
