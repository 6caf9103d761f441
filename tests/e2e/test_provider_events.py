"""Provider events end to end (issue 19, shared/cases C20): the real sandbox provider process
sends signed events to a live server of the ledger; real Celery workers process them.

The sandbox is pointed at the live server at runtime (``POST /_sandbox/events {"url"}``); the
session's provider sends no events otherwise, and its reset restores that.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from typing import Any

import pytest
from django.db.models.functions import Now

from operations.models import AuditEvent, Intent, OutboxMessage, Outcome
from operations.services import intent_claim
from reconciliation.models import (
    DuplicateFinding,
    Evidence,
    ProviderEvent,
    ProviderFinding,
    ReconciliationRun,
)
from reconciliation.resolution import resolve_absent
from reconciliation.services import take_over_expired_leases
from tests.factories import UserFactory, charge_arguments, settled, submit
from tests.support.workers import Cluster, requires_real_broker, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def events_to(sandbox: Any, live_server: Any, **faults: Any) -> None:
    """Have the sandbox send its events to the live ledger, with ``faults`` (lag, duplicates...)."""
    sandbox.event_settings(url=f"{live_server.url}/providers/", **faults)


def all_delivered(sandbox: Any, count: int) -> bool:
    events = sandbox.events()
    return len(events) >= count and all(e["state"] == "delivered" for e in events)


def all_processed() -> bool:
    return not ProviderEvent.objects.filter(result="pending").exists()


def kill_lease_holder(intent: Intent) -> None:
    """SIGKILL the pool process holding ``intent``'s lease (mid-call, after the effect)."""
    intent.refresh_from_db()
    assert intent.status == "RUNNING", "the worker must still be waiting for the provider"
    os.kill(int(intent.lease_owner.rsplit(":", 1)[1]), signal.SIGKILL)


@requires_real_broker
def test_c20_worker_killed_after_effect_is_resolved_by_the_providers_event(
    cluster: Cluster, sandbox: Any, live_server: Any
) -> None:
    # given: the provider applies the charge and holds the answer; its events leave 5 s after
    # the effect (past the worker's 3 s lease); no beat: no reconciler, no lookup
    events_to(sandbox, live_server, lag_seconds=5)
    sandbox.inject("hold_after_effect", product="payments", reference="evt-kill", delay_seconds=60)
    cluster.worker("w1")
    intent = submit(arguments=charge_arguments(reference="evt-kill"), reference="evt-kill")
    wait_for(lambda: bool(sandbox.ledger("payments", reference="evt-kill")), 30, "the effect at the provider")
    # when: the worker dies right after the effect
    kill_lease_holder(intent)
    # then: the provider's signed event ends it SUCCEEDED, before any lookup
    wait_for(lambda: Intent.objects.get(id=intent.id).status == "SUCCEEDED", 60, "the event to resolve it")
    effect = sandbox.ledger("payments", reference="evt-kill")
    outcome = Outcome.objects.get(intent=intent)
    assert (outcome.source, outcome.provider_reference) == ("provider_event", effect[0]["id"])
    assert len(effect) == 1
    assert not Evidence.objects.filter(intent=intent, kind="lookup").exists()
    assert not ReconciliationRun.objects.exists()
    assert not AuditEvent.objects.filter(intent=intent, event="lease_taken_over").exists()
    wait_for(lambda: all_delivered(sandbox, 2) and all_processed(), 30, "both events processed")
    assert dict(ProviderEvent.objects.values_list("event_type", "result")) == {
        "charge.created": "ignored",
        "charge.succeeded": "applied",
    }
    # every outbox message of an event was acknowledged by its task
    wait_for(
        lambda: not OutboxMessage.objects.filter(intent__isnull=True, acked_at__isnull=True).exists(),
        30,
        "the event messages acknowledged",
    )


def test_c20_duplicated_and_reordered_events_change_nothing_more(
    cluster: Cluster, sandbox: Any, live_server: Any
) -> None:
    # given: every event sent three times, in reverse order (succeeded before created)
    events_to(sandbox, live_server, duplicates=2, reorder=True)
    cluster.worker("w1")
    intents = [
        submit(arguments=charge_arguments(100 + n, reference=f"evt-dup-{n}"), reference=f"evt-dup-{n}")
        for n in range(4)
    ]
    ids = [i.id for i in intents]
    wait_for(lambda: Intent.objects.filter(id__in=ids, status="SUCCEEDED").count() == 4, 60, "4 charges")
    wait_for(lambda: all_delivered(sandbox, 8) and all_processed(), 60, "every event delivered and processed")
    before = (
        sorted(
            Outcome.objects.filter(intent_id__in=ids).values_list("intent_id", "source", "provider_reference")
        ),
        AuditEvent.objects.count(),
    )
    # when: each event is delivered once more (same id and body, fresh signature)
    for event in sandbox.events():
        assert sandbox.redeliver(event["id"])["status_code"] == 200
    wait_for(all_processed, 30, "the redeliveries")
    # then: one stored event per id, nothing moved, no finding
    sent = {e["id"] for e in sandbox.events()}
    assert set(ProviderEvent.objects.values_list("event_id", flat=True)) == sent
    assert ProviderEvent.objects.count() == len(sent) == 8
    assert Counter(ProviderEvent.objects.values_list("result", flat=True)) == {"recorded": 4, "ignored": 4}
    after = (
        sorted(
            Outcome.objects.filter(intent_id__in=ids).values_list("intent_id", "source", "provider_reference")
        ),
        AuditEvent.objects.count(),
    )
    assert after == before
    assert {source for _, source, _ in after[0]} == {"provider"}
    assert not DuplicateFinding.objects.exists() and not ProviderFinding.objects.exists()


@requires_real_broker
def test_c20_email_resolved_absent_and_resent_then_the_first_emails_late_event_is_a_duplicate(
    cluster: Cluster, sandbox: Any, live_server: Any
) -> None:
    # given: an email is sent, the worker dies before hearing back; its events come 20 s late
    events_to(sandbox, live_server, lag_seconds=20)
    sandbox.inject("hold_after_effect", product="email", reference="evt-mail", delay_seconds=60)
    cluster.worker("w1")
    arguments = {"to": "a@example.test", "subject": "Receipt", "body": "Thanks", "reference": "evt-mail"}
    intent = submit(action="email.send", arguments=arguments, reference="evt-mail")
    wait_for(lambda: bool(sandbox.ledger("email", reference="evt-mail")), 30, "the first email")
    kill_lease_holder(intent)
    Intent.objects.filter(id=intent.id).update(lease_expires_at=Now())
    wait_for(lambda: take_over_expired_leases().moved == 1, 10, "the lease taken over")
    # when: an operator says it was not sent; it is re-sent (a second email)
    operator = UserFactory(username="olga", groups=["operator"])
    resolve_absent(
        intent_id=intent.id, user=operator, reason="the inbox shows nothing", accept_duplicate_risk=True
    )
    settled(intent)
    wait_for(lambda: Intent.objects.get(id=intent.id).status == "SUCCEEDED", 60, "the re-send")
    # then: once the late events arrive, the first email is one duplicate finding
    emails = sandbox.ledger("email", reference="evt-mail")
    assert len(emails) == 2
    kept = Outcome.objects.get(intent=intent).provider_reference
    first = next(e["id"] for e in emails if e["id"] != kept)
    wait_for(lambda: all_delivered(sandbox, 4) and all_processed(), 60, "the late events")
    finding = DuplicateFinding.objects.get()
    assert (finding.intent_id, finding.provider_reference, finding.kept_reference, finding.state) == (
        intent.id,
        first,
        kept,
        "open",
    )
    assert intent_claim(intent_id=intent.id, worker="x", lease_seconds=5) is None
