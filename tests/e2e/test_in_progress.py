"""Case C32 and issue 38, items 4 and 6, through a real Celery worker and beat, the real broker,
the real sandbox provider process and PostgreSQL.

C32: "A client treated a processor's 'request in progress' answers as failures, used up its
retries while the first request was still being processed, and gave up on a payment the
customer wanted." Here the in-progress answers are waited out (Retry-After, the policy's
patience) without spending the attempt budget, and nobody is paged.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from operations.models import Attempt, AuditEvent, Intent, Outcome
from operations.services.budget import attempts_spent
from tests.factories import charge_arguments, submit
from tests.support.workers import Cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SETTLING = ("READY", "RUNNING")


def payments_requests(sandbox: Any, reference: str) -> list[dict[str, Any]]:
    """Every charge POST the sandbox received for ``reference`` (its request log), oldest first."""
    response = sandbox.client.get("/_sandbox/requests", params={"product": "payments"})
    response.raise_for_status()
    return [r for r in response.json()["requests"] if r["reference"] == reference]


def settled(intent: Intent) -> bool:
    return Intent.objects.filter(id=intent.id).exclude(status__in=SETTLING).exists()


def test_c32_five_in_progress_answers_then_one_charge_through_a_real_worker(
    cluster: Cluster, sandbox: Any
) -> None:
    # given: the sandbox answers 409 request_in_progress to the first five charge requests (the
    # whole default budget of 5 attempts), then charges; one worker, beat relaying the retries
    cluster.worker("w1")
    cluster.beat()
    reference = "c32-order-1"
    sandbox.inject("in_progress", product="payments", times=5, reference=reference)
    intent = submit(arguments=charge_arguments(reference=reference), reference=reference)
    # when
    wait_for(lambda: settled(intent), 90, "the C32 charge to settle")
    # then: SUCCEEDED with the provider's receipt, one charge, under the intent's key
    intent.refresh_from_db()
    assert intent.status == Intent.Status.SUCCEEDED, intent.last_error
    (charge,) = sandbox.ledger("payments", reference=reference)
    assert charge["idempotency_key"] == intent.idempotency_key
    outcome = Outcome.objects.get(intent=intent)
    assert (outcome.source, outcome.provider_reference) == (Outcome.Source.PROVIDER, charge["id"])
    # six requests, all with the same key: five answered "in progress", the sixth charged
    requests = payments_requests(sandbox, reference)
    assert [r["fault"] for r in requests] == ["in_progress"] * 5 + [None]
    assert {r["idempotency_key"] for r in requests} == {intent.idempotency_key}
    # the waits did not spend the budget: one attempt counted
    assert (intent.attempt_count, intent.in_progress_waits, attempts_spent(intent)) == (6, 5, 1)
    # each in-progress answer waited at least what the provider asked (no Retry-After: 1 s)
    retries = list(AuditEvent.objects.filter(intent=intent, event="retry_scheduled").order_by("seq"))
    assert len(retries) == 5
    for event in retries:
        assert event.data["in_progress_wait"] is True and event.data["code"] == "request_in_progress"
        assert event.data["backoff_seconds"] >= event.data["provider_asked_seconds"] == 1.0
    # nobody was paged: never UNKNOWN, never escalated
    assert intent.escalated_at is None
    assert not AuditEvent.objects.filter(intent=intent, event__in=["outcome_unknown", "escalated"]).exists()
    # and every attempt was made by the worker process, none by this one
    workers = list(Attempt.objects.filter(intent=intent).values_list("worker", flat=True))
    assert len(workers) == 6 and not any(w.split(":")[1].split("/")[0] == str(os.getpid()) for w in workers)


def test_i38_4_6_a_timeout_then_in_progress_answers_end_with_one_charge(
    cluster: Cluster, sandbox: Any
) -> None:
    # given: the sandbox takes 6 s over the first charge (its key "processing" meanwhile); the
    # workers give up after 1 s, so the retries meet the first request still being processed
    cluster.worker("w1")
    cluster.beat()
    reference = "c32-order-2"
    sandbox.inject("delay_after_effect", product="payments", reference=reference, delay_seconds=6.0)
    intent = submit(arguments=charge_arguments(reference=reference), reference=reference)
    # when
    wait_for(lambda: settled(intent), 90, "the slow charge to settle")
    # then: SUCCEEDED by a worker, one charge (the sandbox fences the first request out once a
    # retry with a higher fence has arrived; a later same-key attempt charges)
    intent.refresh_from_db()
    assert intent.status == Intent.Status.SUCCEEDED, intent.last_error
    (charge,) = sandbox.ledger("payments", reference=reference)
    outcome = Outcome.objects.get(intent=intent)
    assert (outcome.source, outcome.provider_reference) == (Outcome.Source.PROVIDER, charge["id"])
    assert {r["idempotency_key"] for r in payments_requests(sandbox, reference)} == {intent.idempotency_key}
    # the timeout's retry waited at least the 1 s deadline (item 6)
    first = AuditEvent.objects.filter(intent=intent, event="retry_scheduled").order_by("seq").first()
    assert first is not None and first.data["code"] == "deadline_exceeded"
    assert first.data["backoff_seconds"] >= first.data["not_sooner_than_seconds"] == 1.0
    # only the timeout and the final replay spent the budget; the 409s in between did not
    assert intent.in_progress_waits >= 1, "the retries should have met the first request in progress"
    assert attempts_spent(intent) == 2
    assert not AuditEvent.objects.filter(intent=intent, event__in=["outcome_unknown", "escalated"]).exists()
