"""Provider events (issue 19, shared/cases C20): the signed inbox, and what an event proves.

The inbox is exercised over HTTP (Django's test client) with events signed by the
``standardwebhooks`` package, as the sandbox provider signs them; processing is called the way
the outbox task calls it. End-to-end tests with the real sandbox process and real workers are
in ``tests/e2e/test_provider_events.py``.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db.models.functions import Now
from django.test import Client
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from operations.adapters.base import ExecutionResult
from operations.adapters.events import EventFacts
from operations.exceptions import ResolutionRefused
from operations.models import Intent, OutboxMessage, Outcome
from operations.services import intent_claim, intent_mark_unknown, intent_record_success
from reconciliation.event_matching import match_intent
from reconciliation.events import process_provider_event
from reconciliation.models import DuplicateFinding, Evidence, ProviderEvent, ProviderFinding
from reconciliation.resolution import resolve_absent
from reconciliation.services import reconcile_pass
from reconciliation.tasks import process_provider_event as process_task
from tests.factories import UserFactory, charge_arguments, settled, submit

pytestmark = pytest.mark.django_db

WRONG_SECRET = "whsec_" + "Zm9yZ2VkLXNlY3JldC1vZi1hbi1hdHRhY2tlcg=="


def sign(
    event: dict[str, Any], *, secret: str | None = None, at: datetime | None = None
) -> tuple[bytes, dict[str, str]]:
    """The body and Standard Webhooks headers the sandbox would send for ``event``."""
    body = json.dumps(event).encode()
    moment = at or timezone.now()
    signature = Webhook(secret or settings.SANDBOX_EVENTS_SECRET).sign(event["id"], moment, body.decode())
    headers = {
        "webhook-id": event["id"],
        "webhook-timestamp": str(int(moment.timestamp())),
        "webhook-signature": signature,
    }
    return body, headers


def post(client: Client, source: str, body: bytes, headers: dict[str, str]) -> Any:
    return client.post(
        f"/providers/{source}/events", data=body, content_type="application/json", headers=headers
    )


def deliver(client: Client, source: str, event: dict[str, Any], **options: Any) -> Any:
    body, headers = sign(event, **options)
    return post(client, source, body, headers)


def charge_event(
    intent: Intent | None,
    kind: str,
    *,
    ref: str = "ch_1",
    event_id: str | None = None,
    key: str | None = None,
) -> dict[str, Any]:
    return {
        "id": event_id or f"evt_{uuid.uuid4().hex[:12]}",
        "type": kind,
        "created": timezone.now().isoformat().replace("+00:00", "Z"),
        "data": {
            "object": "charge",
            "id": ref,
            "idempotency_key": key if key is not None else (intent.idempotency_key if intent else ""),
            "reference": intent.reference if intent else "",
            "amount": 4990,
            "currency": "EUR",
            "status": "succeeded",
        },
    }


def email_event(intent: Intent, kind: str, *, ref: str, event_id: str | None = None) -> dict[str, Any]:
    return {
        "id": event_id or f"evt_{uuid.uuid4().hex[:12]}",
        "type": kind,
        "created": timezone.now().isoformat(),
        "data": {
            "object": "email",
            "id": ref,
            "message_id": f"<{intent.idempotency_key}@effect-ledger.local>",
            "reference": intent.arguments.get("reference", ""),
            "amount": None,
            "currency": None,
            "status": kind.split(".")[1],
        },
    }


def unknown(intent: Intent) -> Intent:
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None
    assert intent_mark_unknown(claim=claim, error="response lost", cause="ambiguous")
    intent.refresh_from_db()
    return intent


def process_all() -> list[str]:
    return [
        process_provider_event(event_pk=pk)
        for pk in ProviderEvent.objects.order_by("id").values_list("id", flat=True)
    ]


def counts() -> tuple[int, int]:
    return ProviderEvent.objects.count(), OutboxMessage.objects.count()


# --- refusals: nothing stored ------------------------------------------------------------


@pytest.mark.parametrize(
    "how",
    ["forged", "stale", "future", "missing", "tampered"],
)
def test_c20_bad_signature_is_refused_with_nothing_stored(client: Client, how: str) -> None:
    # given: a real intent the event would prove
    intent = unknown(submit())
    event = charge_event(intent, "charge.succeeded")
    before = counts()
    # when
    if how == "forged":
        response = deliver(client, "sandbox-payments", event, secret=WRONG_SECRET)
    elif how == "stale":
        response = deliver(client, "sandbox-payments", event, at=timezone.now() - timedelta(minutes=6))
    elif how == "future":
        response = deliver(client, "sandbox-payments", event, at=timezone.now() + timedelta(minutes=6))
    elif how == "missing":
        response = post(client, "sandbox-payments", json.dumps(event).encode(), {})
    else:  # a valid signature over another body
        body, headers = sign(event)
        response = post(client, "sandbox-payments", body.replace(b"4990", b"4999"), headers)
    # then
    assert response.status_code == 401
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "event-signature-invalid"
    assert counts() == before
    intent.refresh_from_db()
    assert intent.status == "UNKNOWN"


def test_c20_unknown_source_is_404_problem(client: Client) -> None:
    before = counts()
    response = deliver(client, "acme-nowhere", charge_event(None, "charge.succeeded", key="k"))
    assert response.status_code == 404
    assert response.json()["code"] == "unknown-event-source"
    assert counts() == before


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1, 2]",
        b'{"type": "charge.succeeded", "data": {}}',
        b'{"id": "evt_other", "type": "charge.succeeded", "data": {}}',
        b'{"id": "evt_x", "type": "charge.succeeded", "data": {"amount": 1.5}}',
        b'{"id": "evt_x", "type": "charge.succeeded", "data": "charge"}',
    ],
)
def test_c20_signed_body_that_is_not_an_event_is_400(client: Client, body: bytes) -> None:
    # given: a valid signature (webhook-id evt_x) over a body that is not an event
    moment = timezone.now()
    headers = {
        "webhook-id": "evt_x",
        "webhook-timestamp": str(int(moment.timestamp())),
        "webhook-signature": Webhook(settings.SANDBOX_EVENTS_SECRET).sign("evt_x", moment, body.decode()),
    }
    before = counts()
    # when
    response = post(client, "sandbox-payments", body, headers)
    # then
    assert response.status_code == 400
    assert response.json()["code"] == "event-invalid"
    assert counts() == before


# --- once per event id; order does not matter --------------------------------------------


def test_c20_same_event_three_times_is_stored_once(client: Client) -> None:
    # given
    intent = unknown(submit())
    event = charge_event(intent, "charge.succeeded")
    before_events, before_messages = counts()
    # when: the provider delivers it three times (each freshly signed)
    answers = [deliver(client, "sandbox-payments", event) for _ in range(3)]
    # then: one row, one outbox message; the redeliveries answer 200 and change nothing
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a.json()["stored"] for a in answers] == [True, False, False]
    assert counts() == (before_events + 1, before_messages + 1)
    assert process_all() == ["applied"]
    assert process_all() == ["applied"]
    intent.refresh_from_db()
    assert intent.status == "SUCCEEDED"
    assert list(Outcome.objects.filter(intent=intent).values_list("source", "provider_reference")) == [
        ("provider_event", "ch_1")
    ]


@pytest.mark.parametrize(
    "order", [("charge.created", "charge.succeeded"), ("charge.succeeded", "charge.created")]
)
def test_c20_events_in_either_order_end_the_same(client: Client, order: tuple[str, str]) -> None:
    # given: an UNKNOWN charge, and its two events in one order or the other, each sent 3 times
    intent = unknown(submit())
    events = {kind: charge_event(intent, kind) for kind in order}
    # when
    for kind in order:
        for _ in range(3):
            assert deliver(client, "sandbox-payments", events[kind]).status_code == 200
        process_all()
    # then: the same end whatever the order
    intent.refresh_from_db()
    assert ProviderEvent.objects.count() == 2
    assert intent.status == "SUCCEEDED"
    assert list(Outcome.objects.filter(intent=intent).values_list("source", "provider_reference")) == [
        ("provider_event", "ch_1")
    ]
    assert dict(ProviderEvent.objects.values_list("event_type", "result")) == {
        "charge.created": "ignored",
        "charge.succeeded": "applied",
    }
    assert not DuplicateFinding.objects.exists() and not ProviderFinding.objects.exists()
    assert not Evidence.objects.filter(intent=intent, kind="lookup").exists()


def test_c20_task_acknowledges_its_outbox_row(client: Client) -> None:
    # given: a stored event and its outbox message (no intent)
    intent = unknown(submit())
    deliver(client, "sandbox-payments", charge_event(intent, "charge.succeeded"))
    message = OutboxMessage.objects.get(intent__isnull=True, task="reconciliation.process_provider_event")
    kwargs = json.loads(message.body)
    kwargs.pop("task")
    # when: the task runs as a worker would (kwargs from the frozen body)
    assert process_task.run(**kwargs) == "applied"
    # then
    message.refresh_from_db()
    assert message.acked_at is not None
    intent.refresh_from_db()
    assert intent.status == "SUCCEEDED"


# --- what events prove ---------------------------------------------------------------------


def test_c20_orphan_event_makes_one_orphan_finding(client: Client) -> None:
    # given: events for a charge no intent made (created, succeeded, succeeded again)
    key = f"outside-{uuid.uuid4().hex[:8]}"
    for kind in ("charge.created", "charge.succeeded"):
        deliver(client, "sandbox-payments", charge_event(None, kind, ref="ch_orphan", key=key))
    # when
    results = process_all() + process_all()
    # then
    assert results[:2] == ["orphan", "orphan"]
    finding = ProviderFinding.objects.get()
    assert (finding.kind, finding.fingerprint, finding.provider_reference, finding.amount) == (
        "orphan_event",
        "extra:sandbox-payments:ch_orphan",
        "ch_orphan",
        4990,
    )


def test_c20_email_resolved_absent_resent_then_first_late_event_is_a_duplicate(client: Client) -> None:
    # given: an email whose send was lost (UNKNOWN), resolved absent by an operator and re-sent
    # (same key, same Message-ID), the re-send recorded as em_2
    operator = UserFactory(username="olga", groups=["operator"])
    intent = unknown(
        submit(
            action="email.send",
            arguments={"to": "a@example.test", "subject": "Receipt", "body": "Thanks", "reference": "mail-1"},
        )
    )
    resolve_absent(
        intent_id=intent.id, user=operator, reason="provider shows nothing", accept_duplicate_risk=True
    )
    settled(intent)
    claim = intent_claim(intent_id=intent.id, worker="w2", lease_seconds=30)
    assert claim is not None
    assert intent_record_success(
        claim=claim, result=ExecutionResult(provider_reference="em_2", response_digest="0")
    )
    # when: the second email's events, then the first email's late events, arrive
    for ref in ("em_2", "em_1"):
        for kind in ("email.delivered", "email.sent"):
            assert deliver(client, "sandbox-email", email_event(intent, kind, ref=ref)).status_code == 200
    results = process_all()
    process_all()
    # then: exactly one duplicate finding, for em_1, open for an operator (emails have no undo)
    assert results == ["recorded", "recorded", "duplicate", "duplicate"]  # sent and delivered each prove it
    finding = DuplicateFinding.objects.get()
    assert (finding.intent_id, finding.provider_reference, finding.kept_reference, finding.state) == (
        intent.id,
        "em_1",
        "em_2",
        "open",
    )
    intent.refresh_from_db()
    assert intent.status == "SUCCEEDED"


def test_c20_event_while_running_is_applied_by_the_reconciler_before_any_lookup(client: Client) -> None:
    # given: a worker holds the lease (it is sending); the provider's event arrives meanwhile
    intent = submit()
    assert intent_claim(intent_id=intent.id, worker="w", lease_seconds=30) is not None
    deliver(client, "sandbox-payments", charge_event(intent, "charge.succeeded"))
    assert process_all() == ["recorded"]
    event = ProviderEvent.objects.get()
    assert event.processed_at is None and event.detail["deferred"] is True
    intent.refresh_from_db()
    assert intent.status == "RUNNING"
    # when: the worker dies; its lease expires; the reconciler runs
    Intent.objects.filter(id=intent.id).update(lease_expires_at=Now() - timedelta(seconds=1))
    reconcile_pass()
    # then: the stored event settled it, before any lease take-over or lookup
    intent.refresh_from_db()
    assert intent.status == "SUCCEEDED"
    assert Outcome.objects.get(intent=intent).source == "provider_event"
    assert not Evidence.objects.filter(intent=intent, kind="lookup").exists()
    assert not intent.audit_events.filter(event="lease_taken_over").exists()
    assert intent.attempts.get().result == "abandoned"
    event.refresh_from_db()
    assert (event.result, event.processed_at is not None) == ("applied", True)


def test_c20_event_after_lease_expired_applies_at_once(client: Client) -> None:
    intent = submit()
    assert intent_claim(intent_id=intent.id, worker="w", lease_seconds=30) is not None
    Intent.objects.filter(id=intent.id).update(lease_expires_at=Now() - timedelta(seconds=1))
    deliver(client, "sandbox-payments", charge_event(intent, "charge.succeeded"))
    assert process_all() == ["applied"]
    intent.refresh_from_db()
    assert (intent.status, intent.lease_owner, intent.lease_expires_at) == ("SUCCEEDED", "", None)


def test_c20_event_while_running_then_worker_records_same_effect_is_recorded(client: Client) -> None:
    intent = submit()
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None
    deliver(client, "sandbox-payments", charge_event(intent, "charge.succeeded"))
    process_all()
    assert intent_record_success(
        claim=claim, result=ExecutionResult(provider_reference="ch_1", response_digest="0")
    )
    reconcile_pass()
    event = ProviderEvent.objects.get()
    assert (event.result, event.processed_at is not None) == ("recorded", True)
    assert not DuplicateFinding.objects.exists()


# --- matching ------------------------------------------------------------------------------


def facts(**fields: Any) -> EventFacts:
    base: dict[str, Any] = {
        "event_id": "evt_1",
        "event_type": "charge.succeeded",
        "occurred_at": None,
        "idempotency_key": "",
        "reference": "",
        "provider_reference": "",
        "amount": None,
        "currency": "",
        "object_kind": "charge",
        "proves_action": "payments.charge",
    }
    return EventFacts(**{**base, **fields})


ACTIONS = ("payments.charge", "payments.refund")


def test_match_by_key_first() -> None:
    a = submit(reference="order-1")
    b = submit(reference="order-1")
    assert (
        match_intent(facts=facts(idempotency_key=b.idempotency_key, reference="order-1"), actions=ACTIONS)
        == b
    )
    assert match_intent(facts=facts(idempotency_key=a.idempotency_key), actions=ACTIONS) == a


def test_match_by_reference_prefers_the_recorded_effect_then_the_newest() -> None:
    first = submit(reference="order-2")
    second = submit(reference="order-2")
    assert match_intent(facts=facts(reference="order-2"), actions=ACTIONS) == second
    Outcome.objects.create(intent=first, source="provider", provider_reference="ch_9")
    assert match_intent(facts=facts(reference="order-2", provider_reference="ch_9"), actions=ACTIONS) == first


def test_match_by_provider_reference_last() -> None:
    intent = submit()
    Outcome.objects.create(intent=intent, source="provider", provider_reference="ch_77")
    assert match_intent(facts=facts(provider_reference="ch_77"), actions=ACTIONS) == intent
    assert match_intent(facts=facts(provider_reference="ch_78"), actions=ACTIONS) is None


def test_a_proving_event_matches_only_its_action() -> None:
    charge = submit(reference="order-3")
    refund_facts = facts(reference="order-3", event_type="refund.succeeded", proves_action="payments.refund")
    assert match_intent(facts=refund_facts, actions=ACTIONS) is None
    assert match_intent(facts=facts(reference="order-3"), actions=ACTIONS) == charge


# --- console and metrics -------------------------------------------------------------------


def test_provider_events_page_and_timeline_show_events(client: Client) -> None:
    intent = unknown(submit(arguments=charge_arguments()))
    deliver(client, "sandbox-payments", charge_event(intent, "charge.succeeded", event_id="evt_page_1"))
    process_all()
    client.force_login(UserFactory(username="otto", groups=["operator"], tenants=["acme"]))
    page = client.get("/provider-events/")
    assert page.status_code == 200
    assert b"evt_page_1" in page.content and b"Resolved the intent" in page.content
    detail = client.get(f"/intents/{intent.id}/")
    assert b"provider event charge.succeeded" in detail.content


def test_provider_event_metrics(client: Client) -> None:
    intent = unknown(submit())
    event = charge_event(intent, "charge.succeeded")
    deliver(client, "sandbox-payments", event)
    deliver(client, "sandbox-payments", event, secret=WRONG_SECRET)
    process_all()
    text = client.get("/metrics").content.decode()
    assert 'effect_ledger_provider_events_received_total{delivery="new",source="sandbox-payments"}' in text
    assert 'effect_ledger_provider_events_refused_total{reason="signature"}' in text
    assert 'effect_ledger_provider_events_processed_total{result="applied"}' in text


def test_absent_is_refused_while_a_signed_event_proving_the_effect_waits(client: Client) -> None:
    # given: the event arrived while the worker held the lease; the worker then recorded UNKNOWN
    operator = UserFactory(username="olga", groups=["operator"])
    intent = submit(
        action="email.send",
        arguments={"to": "a@example.test", "subject": "Receipt", "body": "Thanks", "reference": "mail-2"},
    )
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None
    deliver(client, "sandbox-email", email_event(intent, "email.sent", ref="em_1"))
    assert process_all() == ["recorded"]
    assert intent_mark_unknown(claim=claim, error="response lost", cause="ambiguous")
    # when / then: the operator's "absent" is refused with the event
    with pytest.raises(ResolutionRefused, match="signed event"):
        resolve_absent(intent_id=intent.id, user=operator, reason="nothing there", accept_duplicate_risk=True)
    reconcile_pass()
    intent.refresh_from_db()
    assert intent.status == "SUCCEEDED"
    assert Outcome.objects.get(intent=intent).provider_reference == "em_1"


def test_c20_event_message_is_relayed_until_its_task_acknowledges_it(
    client: Client, monkeypatch: Any
) -> None:
    # given: an event whose hand-off after commit never happened (the row is unsent)
    from operations.workers import outbox

    intent = unknown(submit())
    deliver(client, "sandbox-payments", charge_event(intent, "charge.succeeded"))
    message = OutboxMessage.objects.get(intent__isnull=True)
    OutboxMessage.objects.filter(id=message.id).update(sent_at=None)
    published: list[str] = []
    monkeypatch.setattr(outbox, "_publish", lambda handoff, countdown: published.append(handoff.task))
    # when: the relay runs (a row with no intent is live, never obsolete)
    outbox.outbox_relay()
    # then: published, not acknowledged until the task ran
    message.refresh_from_db()
    assert published == ["reconciliation.process_provider_event"]
    assert message.sent_at is not None and message.acked_at is None
    kwargs = json.loads(message.body)
    kwargs.pop("task")
    process_task.run(**kwargs)
    message.refresh_from_db()
    assert message.acked_at is not None


# --- fixes after review (issue 19): the key decides, money must agree, refusals ------------


def signed_raw(body: bytes, event_id: str) -> dict[str, str]:
    moment = timezone.now()
    return {
        "webhook-id": event_id,
        "webhook-timestamp": str(int(moment.timestamp())),
        "webhook-signature": Webhook(settings.SANDBOX_EVENTS_SECRET).sign(event_id, moment, body.decode()),
    }


def assert_refused(response: Any, before: tuple[int, int], *, words: str = "") -> None:
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "event-invalid"
    assert words in response.json()["detail"]
    assert counts() == before


def test_c20_event_under_another_key_never_settles_the_intent_whose_reference_it_names(
    client: Client,
) -> None:
    # given: a charge RUNNING whose worker was killed (lease expired), with a business reference
    intent = submit(reference=f"order-{uuid.uuid4().hex[:8]}")
    assert intent_claim(intent_id=intent.id, worker="w", lease_seconds=30) is not None
    Intent.objects.filter(id=intent.id).update(lease_expires_at=Now() - timedelta(seconds=1))
    # when: a signed charge.succeeded made under another key names that reference
    event = charge_event(intent, "charge.succeeded", ref="ch_OUTSIDE", key="el_not_ours")
    assert deliver(client, "sandbox-payments", event).status_code == 200
    # then: not this intent's effect: an orphan; the intent is untouched
    assert process_all() == ["orphan"]
    intent.refresh_from_db()
    assert intent.status == "RUNNING"
    assert not Outcome.objects.filter(intent=intent).exists()
    # one stray effect, one finding: the fingerprint a statement's extra line would have too
    finding = ProviderFinding.objects.get()
    assert (finding.kind, finding.fingerprint) == ("orphan_event", "extra:sandbox-payments:ch_OUTSIDE")
    assert ProviderEvent.objects.get().intent_id is None


def test_c20_match_key_is_decisive_over_reference_and_provider_reference() -> None:
    intent = submit(reference="order-c20")
    Outcome.objects.create(intent=intent, source="provider", provider_reference="ch_c20")
    other_key = "el_not_ours"
    assert (
        match_intent(facts=facts(idempotency_key=other_key, reference="order-c20"), actions=ACTIONS) is None
    )
    assert (
        match_intent(facts=facts(idempotency_key=other_key, provider_reference="ch_c20"), actions=ACTIONS)
        is None
    )
    # without a key, reference and provider reference still match
    assert match_intent(facts=facts(reference="order-c20"), actions=ACTIONS) == intent
    assert match_intent(facts=facts(provider_reference="ch_c20"), actions=ACTIONS) == intent


@pytest.mark.parametrize("money", [(9999, "EUR"), (4990, "USD")])
def test_c20_proving_event_with_another_amount_is_not_applied(client: Client, money: tuple[int, str]) -> None:
    # given: an UNKNOWN charge of 4990 EUR
    intent = unknown(submit(arguments=charge_arguments(4990)))
    event = charge_event(intent, "charge.succeeded", ref="ch_money")
    event["data"]["amount"], event["data"]["currency"] = money
    # when: its signed event (our key) shows another amount or currency, processed twice
    assert deliver(client, "sandbox-payments", event).status_code == 200
    assert process_all() == ["recorded"]
    assert process_all() == ["recorded"]
    # then: the intent stays for the reconciler/an operator; one amount_mismatch finding
    intent.refresh_from_db()
    assert intent.status == "UNKNOWN"
    assert not Outcome.objects.filter(intent=intent).exists()
    stored = ProviderEvent.objects.get()
    assert f"{money[0]} {money[1]}" in stored.detail["contradicts"]
    assert "4990 EUR" in stored.detail["contradicts"]
    finding = ProviderFinding.objects.get()
    assert (
        finding.kind,
        finding.fingerprint,
        finding.intent_id,
        finding.amount,
        finding.currency,
        finding.expected_amount,
        finding.expected_currency,
    ) == (
        "amount_mismatch",
        f"mismatch:sandbox-payments:{intent.id}:ch_money",
        intent.id,
        money[0],
        money[1],
        4990,
        "EUR",
    )


@pytest.mark.parametrize(
    "created",
    [
        "0001-01-01T00:00:00+05:00",
        "9999-12-31T23:59:59-05:00",
        "1999-12-31T23:59:59Z",
        "2100-01-01T04:00:00+03:00",
    ],
)
def test_c20_created_outside_2000_to_2100_utc_is_400(client: Client, created: str) -> None:
    intent = unknown(submit())
    event = {**charge_event(intent, "charge.succeeded"), "created": created}
    before = counts()
    assert_refused(deliver(client, "sandbox-payments", event), before, words="created")
    client.force_login(UserFactory(username="otto", groups=["operator"], tenants=["acme"]))
    assert client.get("/provider-events/").status_code == 200


def test_c20_created_near_the_bounds_is_compared_in_utc(client: Client) -> None:
    # 2100-01-01T02:00+05:00 is 2099-12-31T21:00Z: inside
    intent = unknown(submit())
    event = {**charge_event(intent, "charge.succeeded"), "created": "2100-01-01T02:00:00+05:00"}
    assert deliver(client, "sandbox-payments", event).status_code == 200
    assert ProviderEvent.objects.get().occurred_at.year == 2099


@pytest.mark.parametrize(
    "source,kind,obj",
    [
        ("sandbox-email", "charge.succeeded", "charge"),
        ("sandbox-payments", "charge.exploded", "charge"),
        ("sandbox-reservations", "email.sent", "email"),
        ("sandbox-payments", "charge.succeeded", "refund"),
        ("sandbox-payments", "refund.succeeded", "charge"),
    ],
)
def test_c20_type_or_object_the_source_never_sends_is_400(
    client: Client, source: str, kind: str, obj: str
) -> None:
    intent = unknown(submit())
    event = charge_event(intent, kind)
    event["data"]["object"] = obj
    before = counts()
    response = deliver(client, source, event)
    assert_refused(response, before)
    assert kind in response.json()["detail"]
    assert not ProviderFinding.objects.exists()


@pytest.mark.parametrize(
    "extra",
    [
        b'"note": "a\\u0000b"',
        b'"note": "\\ud800"',
        b'"a\\u0000": 1',
        b'"deep": [{"x": ["\\udfff"]}]',
    ],
)
def test_c20_nul_or_lone_surrogate_anywhere_is_400(client: Client, extra: bytes) -> None:
    intent = unknown(submit())
    event = charge_event(intent, "charge.succeeded")
    body = json.dumps(event).encode()
    body = body[:-1] + b", " + extra + b"}"
    before = counts()
    response = post(client, "sandbox-payments", body, signed_raw(body, event["id"]))
    assert_refused(response, before)


def test_c20_negative_amount_is_400(client: Client) -> None:
    intent = unknown(submit())
    event = charge_event(intent, "charge.succeeded")
    event["data"]["amount"] = -4990
    before = counts()
    assert_refused(deliver(client, "sandbox-payments", event), before, words="negative")


@pytest.mark.parametrize("method", ["get", "put", "delete"])
def test_c20_inbox_answers_other_methods_405_problem(client: Client, method: str) -> None:
    response = getattr(client, method)("/providers/sandbox-payments/events")
    assert response.status_code == 405
    assert response["Content-Type"] == "application/problem+json"
    assert response["Allow"] == "POST"
    assert (response.json()["status"], response.json()["code"]) == (405, "method-not-allowed")


@pytest.mark.parametrize("missing", [None, ""])
def test_c20_a_proving_event_without_the_effects_id_is_400(client: Client, missing: str | None) -> None:
    # a "succeeded" that does not say which charge proves nothing, and would be an unworkable orphan
    intent = unknown(submit())
    event = charge_event(intent, "charge.succeeded")
    event["data"]["id"] = missing
    before = counts()
    assert_refused(deliver(client, "sandbox-payments", event), before, words="data.id")
    intent.refresh_from_db()
    assert intent.status == "UNKNOWN"


def test_c20_a_reference_held_in_two_tenants_settles_neither_intent(client: Client) -> None:
    # given: two tenants' UNKNOWN charges with one business reference (a provider account serves
    # both; the reference is each caller's own)
    ours = unknown(submit(tenant="acme", reference="res-3"))
    theirs = unknown(submit(tenant="globex", reference="res-3"))
    # when: an event without our key names that reference
    event = charge_event(ours, "charge.succeeded", ref="ch_which", key="")
    assert match_intent(facts=facts(reference="res-3"), actions=ACTIONS) is None
    assert deliver(client, "sandbox-payments", event).status_code == 200
    # then: applied to neither; one orphan finding that says why, for an operator to link
    assert process_all() == ["orphan"]
    assert set(Intent.objects.filter(id__in=[ours.id, theirs.id]).values_list("status", flat=True)) == {
        "UNKNOWN"
    }
    finding = ProviderFinding.objects.get()
    assert "acme, globex" in finding.detail["ambiguous"]
    # one tenant's intents alone still match by reference (the newest)
    assert match_intent(facts=facts(reference="order-solo"), actions=ACTIONS) is None
    solo = submit(tenant="acme", reference="order-solo")
    assert match_intent(facts=facts(reference="order-solo"), actions=ACTIONS) == solo


def test_c20_an_event_after_the_statement_line_joins_the_lines_finding(client: Client) -> None:
    # given: a statement line no intent has (an extra at the provider)
    from operations.adapters.base import StatementEntry
    from reconciliation.statements import run

    run(
        source="sandbox-payments",
        day=timezone.now().date(),
        entries=[StatementEntry("ch_stray", "", "stray", 123, "EUR")],
        origin="api",
    )
    finding = ProviderFinding.objects.get()
    assert finding.event_id is None
    # when: the provider's event for that charge arrives late
    event = charge_event(None, "charge.succeeded", ref="ch_stray", key="")
    assert deliver(client, "sandbox-payments", event).status_code == 200
    assert process_all() == ["orphan"]
    # then: still one finding, now with its event too
    finding = ProviderFinding.objects.get()
    assert finding.event_id == ProviderEvent.objects.get().id and finding.line_id is not None
