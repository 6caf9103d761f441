"""Pruning (issue 36): acknowledged outbox rows, settled webhook deliveries and old provider
event bodies leave once past their retention; what is still owed or still being decided stays.
The pass is ``reconciliation.pruning.prune_pass`` (task ``reconciliation.prune``)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from django.db.models.functions import Now
from django.test import Client
from django.utils import timezone

from operations.models import Intent, OutboxMessage, PeriodicJobRun, WebhookDelivery
from operations.services.pruning import outbox_prune, webhook_deliveries_prune
from reconciliation import tasks
from reconciliation.events import process_provider_event
from reconciliation.models import ProviderEvent, ProviderFinding
from reconciliation.pruning import provider_event_bodies_prune, prune_pass
from tests.factories import UserFactory, charge_arguments, make_agent, submit
from tests.reconciliation.test_provider_events import charge_event, deliver, unknown

pytestmark = pytest.mark.django_db

BASE_DIR = Path(__file__).resolve().parents[2]


def _ago(**delta: float) -> Any:
    return Now() - timedelta(**delta)


# --- outbox ---------------------------------------------------------------------------------


def _outbox_row(*, acked: timedelta | None, created: timedelta) -> uuid.UUID:
    """An intent's outbox row (as submitted), written ``created`` ago and acknowledged
    ``acked`` ago (None: not acknowledged)."""
    intent = submit()
    row = OutboxMessage.objects.get(intent=intent)
    OutboxMessage.objects.filter(id=row.id).update(
        created_at=Now() - created, acked_at=None if acked is None else Now() - acked
    )
    return row.id


def test_i36_acked_outbox_rows_past_the_window_are_deleted_unacked_and_recent_ones_kept() -> None:
    # given: the window is an hour; one row consumed 2 h ago, one 10 min ago, one never consumed
    # (written 2 days ago: the relay still owes it a publication)
    old = _outbox_row(acked=timedelta(hours=2), created=timedelta(hours=3))
    recent = _outbox_row(acked=timedelta(minutes=10), created=timedelta(hours=3))
    owed = _outbox_row(acked=None, created=timedelta(days=2))

    # when
    deleted = outbox_prune(batch=100)

    # then: only the old consumed row is gone
    assert deleted == 1
    assert set(OutboxMessage.objects.values_list("id", flat=True)) == {recent, owed}
    assert not OutboxMessage.objects.filter(id=old).exists()
    # and its intent, and the intent's audit chain, are untouched
    assert Intent.objects.count() == 3


def test_i36_outbox_window_is_the_setting(settings: Any) -> None:
    # given: a row consumed 10 minutes ago, kept by the default window of an hour
    row = _outbox_row(acked=timedelta(minutes=10), created=timedelta(minutes=11))
    assert outbox_prune(batch=10) == 0

    # when: the window is 5 minutes
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "OUTBOX_RETENTION_SECONDS": 300.0}

    # then
    assert outbox_prune(batch=10) == 1
    assert not OutboxMessage.objects.filter(id=row).exists()


def test_i36_a_pruned_outbox_row_does_not_stop_the_intent_from_running() -> None:
    # given: an intent claimed (its row consumed), the row pruned
    intent = submit()
    from operations.services import intent_claim

    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None
    OutboxMessage.objects.filter(intent=intent).update(acked_at=_ago(hours=2))
    assert outbox_prune(batch=10) == 1

    # when: a duplicate delivery of the same message arrives (the broker sent it twice)
    from operations.engine import protocol

    result = protocol.execute_intent(intent.id)

    # then: the claim's compare-and-swap absorbs it, as it did with the row
    intent.refresh_from_db()
    assert intent.status == Intent.Status.RUNNING and "duplicate" in str(result).lower()


@pytest.mark.parametrize("batch", [0, -1, 1.5, True, "10"])
def test_i36_a_bad_batch_is_refused_and_nothing_deleted(batch: Any) -> None:
    _outbox_row(acked=timedelta(hours=2), created=timedelta(hours=3))
    for prune in (outbox_prune, webhook_deliveries_prune, provider_event_bodies_prune):
        with pytest.raises(ValueError, match="pruning batch"):
            prune(batch=batch)
    with pytest.raises(ValueError, match="pruning batch"):
        prune_pass(batch=batch)
    assert OutboxMessage.objects.count() == 1


# --- webhook deliveries ------------------------------------------------------------------------


def _delivery(intent: Intent, agent: Any, seq: int, *, state: str, age: timedelta, last: timedelta) -> int:
    """A delivery created ``age`` ago whose last attempt was ``last`` ago, in ``state``."""
    at = (timezone.now() - last).isoformat().replace("+00:00", "Z")
    row = WebhookDelivery.objects.create(
        message_id=f"msg_{uuid.uuid4().hex}",
        intent=intent,
        agent=agent,
        tenant=intent.tenant,
        event_type="intent.succeeded",
        status="SUCCEEDED",
        audit_seq=seq,
        event_at=timezone.now() - age,
        body="{}",
        state=state,
        attempts=1,
        history=[{"at": at, "attempt": 1, "status_code": 200 if state == "delivered" else 500}],
        delivered_at=timezone.now() - last if state == "delivered" else None,
    )
    WebhookDelivery.objects.filter(id=row.id).update(created_at=Now() - age)
    return row.id


def test_i36_settled_webhook_deliveries_past_retention_are_pruned_pending_ones_kept() -> None:
    # given: the retention is 7 days
    agent, _ = make_agent()
    intent = submit()
    delivered_old = _delivery(
        intent, agent, 1, state="delivered", age=timedelta(days=9), last=timedelta(days=8)
    )
    failed_old = _delivery(intent, agent, 2, state="failed", age=timedelta(days=10), last=timedelta(days=9))
    pending_old = _delivery(intent, agent, 3, state="pending", age=timedelta(days=30), last=timedelta(days=9))
    delivered_recent = _delivery(
        intent, agent, 4, state="delivered", age=timedelta(days=1), last=timedelta(days=1)
    )
    # failed again 2 days ago after an operator's re-send of a 10-day-old delivery: its last
    # attempt counts, not its creation
    failed_resent = _delivery(
        intent, agent, 5, state="failed", age=timedelta(days=10), last=timedelta(days=2)
    )

    # when
    deleted = webhook_deliveries_prune(batch=100)

    # then
    assert deleted == 2
    kept = set(WebhookDelivery.objects.values_list("id", flat=True))
    assert kept == {pending_old, delivered_recent, failed_resent}
    assert delivered_old not in kept and failed_old not in kept


def test_i36_webhook_batches_are_bounded() -> None:
    agent, _ = make_agent()
    intent = submit()
    for seq in range(1, 4):
        _delivery(intent, agent, seq, state="delivered", age=timedelta(days=9), last=timedelta(days=8))
    assert webhook_deliveries_prune(batch=2) == 2
    assert webhook_deliveries_prune(batch=2) == 1
    assert webhook_deliveries_prune(batch=2) == 0


# --- provider event bodies ---------------------------------------------------------------------


def _processed_event(client: Client, intent: Intent | None, event_id: str, **options: Any) -> ProviderEvent:
    deliver(
        client, "sandbox-payments", charge_event(intent, "charge.succeeded", event_id=event_id, **options)
    )
    event = ProviderEvent.objects.get(event_id=event_id)
    process_provider_event(event_pk=event.id)
    event.refresh_from_db()
    return event


def test_i36_raw_bodies_are_cleared_after_retention_and_the_pages_still_render(client: Client) -> None:
    # given: an intent settled by a provider event processed 31 days ago (retention: 30 days)
    intent = unknown(submit(arguments=charge_arguments()))
    event = _processed_event(client, intent, "evt_old_body")
    assert event.processed_at is not None and event.payload["id"] == "evt_old_body"
    body = event.payload
    ProviderEvent.objects.filter(id=event.id).update(processed_at=_ago(days=31))
    # and: one processed yesterday, and one old but never processed
    recent = _processed_event(client, unknown(submit(arguments=charge_arguments())), "evt_recent_body")
    deliver(client, "sandbox-payments", charge_event(None, "charge.succeeded", event_id="evt_unprocessed"))
    ProviderEvent.objects.filter(event_id="evt_unprocessed").update(received_at=_ago(days=40))

    # when
    cleared = provider_event_bodies_prune(batch=100)

    # then: only the old processed event lost its body; its digest, fields and row stay
    assert cleared == 1
    event.refresh_from_db()
    assert event.payload == {} and event.body_removed_at is not None
    assert event.body_sha256 == hashlib.sha256(rfc8785.dumps(body)).hexdigest()
    assert (event.event_type, event.provider_reference, event.amount, event.result, event.intent_id) == (
        "charge.succeeded",
        "ch_1",
        4990,
        "applied",
        intent.id,
    )
    recent.refresh_from_db()
    assert recent.payload["id"] == "evt_recent_body" and recent.body_removed_at is None
    assert ProviderEvent.objects.get(event_id="evt_unprocessed").payload["id"] == "evt_unprocessed"
    # and: a second pass has nothing left to do
    assert provider_event_bodies_prune(batch=100) == 0

    # when: an operator opens the provider events page and the intent's page
    client.force_login(UserFactory(username="otto", groups=["operator"], tenants=["acme"]))
    listing = client.get("/provider-events/")
    detail = client.get(f"/intents/{intent.id}/")

    # then: both render and say the body was removed by retention
    assert listing.status_code == 200 and detail.status_code == 200
    assert b"body removed after 30 days (retention)" in listing.content
    assert b"body removed after 30 days (retention)" in detail.content
    assert event.body_sha256.encode() in detail.content


def test_i36_an_event_with_an_open_finding_keeps_its_body(client: Client) -> None:
    # given: an orphan event (no intent: an open orphan finding), processed 40 days ago
    key = f"outside-{uuid.uuid4().hex[:8]}"
    event = _processed_event(client, None, "evt_orphan_body", ref="ch_orphan", key=key)
    assert event.result == "orphan"
    finding = ProviderFinding.objects.get(event=event)
    assert finding.state == ProviderFinding.State.OPEN
    ProviderEvent.objects.filter(id=event.id).update(processed_at=_ago(days=40))

    # when / then: kept while an operator decides
    assert provider_event_bodies_prune(batch=100) == 0
    # and cleared once the finding is resolved
    ProviderFinding.objects.filter(id=finding.id).update(state=ProviderFinding.State.RESOLVED)
    assert provider_event_bodies_prune(batch=100) == 1
    event.refresh_from_db()
    assert event.payload == {} and len(event.body_sha256) == 64


# --- the pass and its task ---------------------------------------------------------------------


def test_i36_a_pass_repeats_batches_until_done() -> None:
    for _ in range(3):
        _outbox_row(acked=timedelta(hours=2), created=timedelta(hours=3))
    assert prune_pass(batch=1) == {"outbox": 3, "webhook_deliveries": 0, "provider_event_bodies": 0}
    assert not OutboxMessage.objects.exists()


def test_i36_the_beat_run_of_the_prune_claims_its_period() -> None:
    # given: the beat's run of this period pruned a row
    _outbox_row(acked=timedelta(hours=2), created=timedelta(hours=3))
    first = tasks.prune(claim_period=3600)
    assert first["outbox"] == 1
    # and is recorded for the health page
    assert PeriodicJobRun.objects.get(name="reconciliation.prune").last_error == ""

    # when: a second beat's run of the same period arrives, with a row to prune
    _outbox_row(acked=timedelta(hours=2), created=timedelta(hours=3))
    second = tasks.prune(claim_period=3600)

    # then: it does nothing; a run without a claim (a command, a kick) still prunes
    assert second == {} and OutboxMessage.objects.count() == 1
    assert tasks.prune()["outbox"] == 1


def test_i36_the_beat_schedules_the_prune_with_its_period() -> None:
    from console.celery import app

    entry = app.conf.beat_schedule["prune"]
    assert entry["task"] == "reconciliation.prune"
    assert entry["schedule"] == 3600.0 and entry["kwargs"] == {"claim_period": 3600.0}


# --- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "environ",
    [
        {"EFFECT_LEDGER_OUTBOX_RETENTION_SECONDS": "-1"},
        {"EFFECT_LEDGER_OUTBOX_RETENTION_SECONDS": "nan"},
        {"EFFECT_LEDGER_OUTBOX_RETENTION_SECONDS": "10"},  # under the minimum of 60 s
        {"EFFECT_LEDGER_WEBHOOK_DELIVERY_RETENTION_DAYS": "-7"},
        {"EFFECT_LEDGER_WEBHOOK_DELIVERY_RETENTION_DAYS": "inf"},
        {"EFFECT_LEDGER_RAW_BODY_RETENTION_DAYS": "nan"},
        {"EFFECT_LEDGER_RAW_BODY_RETENTION_DAYS": "0"},
        {"EFFECT_LEDGER_PRUNE_PERIOD_SECONDS": "0"},
        {"EFFECT_LEDGER_PRUNE_BATCH": "0"},
    ],
)
def test_i36_bad_retention_settings_stop_the_process_at_start_up(environ: dict[str, str]) -> None:
    (name,) = environ
    child = subprocess.run(  # noqa: S603 - this interpreter, fixed code
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=BASE_DIR,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings", **environ},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode != 0 and f"environment variable {name} must" in child.stderr, child.stderr[-500:]


def test_i36_retention_defaults() -> None:
    from django.conf import settings

    conf = settings.EFFECT_LEDGER
    assert (
        conf["OUTBOX_RETENTION_SECONDS"],
        conf["WEBHOOK_DELIVERY_RETENTION_DAYS"],
        conf["RAW_BODY_RETENTION_DAYS"],
        conf["PRUNE_PERIOD_SECONDS"],
        conf["PRUNE_BATCH"],
    ) == (3600.0, 7.0, 30.0, 3600.0, 1000)
