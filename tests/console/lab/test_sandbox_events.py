"""Issue 19: the sandbox provider's signed events (Standard Webhooks) over real HTTP, from the
real provider process to a real loopback receiver: one per effect kind, durable across a crash
of the handler, fault modes (lag, duplicates, reorder, loss), retries and redelivery."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from console.lab.sandbox_provider.events import DEFAULT_SECRET
from tests.support.processes import SandboxProvider, start_sandbox_provider
from tests.support.webhook_receiver import Received, Receiver

CHARGE = {"amount": 4990, "currency": "EUR", "customer": "cus_42", "reference": "order-ev-1"}


def wait_until(condition: Callable[[], Any], *, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout} s")


def events_base(receiver: Receiver) -> str:
    """The receiver's root as the events base URL (the sandbox appends ``<source>/events``)."""
    return receiver.url.rsplit("/hooks/", 1)[0] + "/providers/"


def charge(provider: SandboxProvider, key: str | None = None, **changes: Any) -> httpx.Response:
    response = httpx.post(
        f"{provider.url}/v1/charges",
        json={**CHARGE, **changes},
        headers={"Idempotency-Key": key or f"key-{uuid.uuid4()}"},
        timeout=10,
    )
    return response


def bodies(receiver: Receiver) -> list[dict[str, Any]]:
    return [json.loads(r.body) for r in list(receiver.received)]


def verify(received: Received, secret: str = DEFAULT_SECRET) -> dict[str, Any]:
    payload: dict[str, Any] = Webhook(secret).verify(received.body, received.headers)
    return payload


@pytest.fixture
def told(sandbox: SandboxProvider, receiver: Receiver) -> SandboxProvider:
    """The session's provider with its events going to the loopback receiver."""
    sandbox.event_settings(url=events_base(receiver))
    return sandbox


def test_i19_every_effect_sends_signed_events_to_its_sources_url(
    told: SandboxProvider, receiver: Receiver
) -> None:
    # given
    key = f"key-{uuid.uuid4()}"
    charged = charge(told, key).json()
    refund_key = f"key-{uuid.uuid4()}"
    refund = httpx.post(
        f"{told.url}/v1/refunds",
        json={"charge": charged["id"], "amount": 4990, "currency": "EUR", "reference": "order-ev-1-refund"},
        headers={"Idempotency-Key": refund_key},
    ).json()
    email = httpx.post(
        f"{told.url}/v1/emails",
        json={"to": "a@example.com", "subject": "Hi", "body": "Hello", "reference": "mail-1"},
        headers={"Message-ID": "<k-1@effect-ledger.local>"},
    ).json()
    booked = httpx.post(
        f"{told.url}/v1/reservations",
        json={"resource": "room-1", "start": "2026-12-24T18:00", "seats": 2, "reference": "booking-1"},
    ).json()
    httpx.post(f"{told.url}/v1/reservations/{booked['id']}/cancel").raise_for_status()

    # when
    wait_until(lambda: len(receiver.received) >= 8)

    # then every request verifies with the secret, carries the event id and reaches its source
    seen = {}
    for received in receiver.received:
        event = verify(received)
        assert received.headers["webhook-id"] == event["id"] and event["id"].startswith("evt_")
        assert event["created"].endswith("Z")
        seen[event["type"]] = (received.path, event["data"])
    assert seen["charge.created"] == (
        "/providers/sandbox-payments/events",
        {
            "object": "charge", "id": charged["id"], "idempotency_key": key, "message_id": None,
            "reference": "order-ev-1", "amount": 4990, "currency": "EUR", "status": "pending",
        },
    )  # fmt: skip
    assert seen["charge.succeeded"][1]["status"] == "succeeded"
    assert seen["refund.succeeded"] == (
        "/providers/sandbox-payments/events",
        {
            "object": "refund", "id": refund["id"], "idempotency_key": refund_key, "message_id": None,
            "reference": "order-ev-1-refund", "amount": 4990, "currency": "EUR", "status": "succeeded",
        },
    )  # fmt: skip
    assert seen["charge.refunded"][1] | {"status": "?"} == seen["charge.succeeded"][1] | {"status": "?"}
    assert seen["charge.refunded"][1]["status"] == "refunded"
    assert seen["email.sent"] == (
        "/providers/sandbox-email/events",
        {
            "object": "email", "id": email["id"], "idempotency_key": None,
            "message_id": "<k-1@effect-ledger.local>", "reference": "mail-1", "amount": None,
            "currency": None, "status": "sent",
        },
    )  # fmt: skip
    assert seen["email.delivered"][1]["status"] == "delivered"
    assert seen["reservation.created"][0] == "/providers/sandbox-reservations/events"
    assert seen["reservation.created"][1]["id"] == booked["id"]
    assert seen["reservation.cancelled"][1]["status"] == "cancelled"
    # in the natural order of each effect
    types = [b["type"] for b in bodies(receiver)]
    assert types.index("charge.created") < types.index("charge.succeeded")
    assert types.index("email.sent") < types.index("email.delivered")
    listed = wait_until(lambda: (e := told.events()) and all(x["state"] == "delivered" for x in e) and e)
    assert len(listed) == 8
    assert sorted(e["id"] for e in listed) == sorted(b["id"] for b in bodies(receiver))


def test_i19_a_forged_signature_does_not_verify(told: SandboxProvider, receiver: Receiver) -> None:
    # given
    charge(told)
    received = wait_until(lambda: receiver.received and receiver.received[0])

    # when / then: another secret does not verify the sandbox's signature
    with pytest.raises(WebhookVerificationError):
        verify(received, "whsec_" + "b3RoZXItc2VjcmV0LW90aGVyLXNlY3JldA==")


def test_i19_no_events_url_means_no_events(sandbox: SandboxProvider, receiver: Receiver) -> None:
    # given: the session's provider, started without an events URL

    # when
    assert charge(sandbox).status_code == 200

    # then
    assert sandbox.event_settings()["url"] is None
    assert sandbox.events() == []


def test_i19_an_effect_whose_handler_crashed_still_sends_its_events(
    told: SandboxProvider, receiver: Receiver
) -> None:
    # given
    told.inject("crash_after_effect", product="payments")

    # when
    with pytest.raises(httpx.HTTPError):
        charge(told, reference="crashed-order")

    # then
    assert [e["reference"] for e in told.ledger("payments")] == ["crashed-order"]
    wait_until(lambda: {b["type"] for b in bodies(receiver)} == {"charge.created", "charge.succeeded"})
    assert {b["data"]["reference"] for b in bodies(receiver)} == {"crashed-order"}


def test_i19_duplicates_send_each_event_that_many_more_times(
    told: SandboxProvider, receiver: Receiver
) -> None:
    # given
    told.event_settings(duplicates=2)

    # when
    charge(told)

    # then: each event three times, same id and same body, each signed
    wait_until(lambda: len(receiver.received) >= 6)
    by_id: dict[str, set[bytes]] = {}
    for received in receiver.received:
        verify(received)
        by_id.setdefault(received.headers["webhook-id"], set()).add(received.body)
    assert len(by_id) == 2
    assert all(len(bodies_) == 1 for bodies_ in by_id.values())
    assert [b["id"] for b in bodies(receiver)].count(next(iter(by_id))) == 3
    wait_until(lambda: all(e["state"] == "delivered" and e["delivered"] == 3 for e in told.events()))


def test_i19_reorder_sends_an_effects_events_newest_first(told: SandboxProvider, receiver: Receiver) -> None:
    # given
    told.event_settings(reorder=True)

    # when
    charge(told)
    httpx.post(
        f"{told.url}/v1/emails", json={"to": "a@example.com", "subject": "s", "body": "b"}
    ).raise_for_status()

    # then
    wait_until(lambda: len(receiver.received) >= 4)
    types = [b["type"] for b in bodies(receiver)]
    assert types.index("charge.succeeded") < types.index("charge.created")
    assert types.index("email.delivered") < types.index("email.sent")


def test_i19_lost_events_are_never_sent_but_can_be_redelivered(
    told: SandboxProvider, receiver: Receiver
) -> None:
    # given
    told.event_settings(loss=1.0)
    lost_reference = "lost-order"
    charge(told, reference=lost_reference)
    told.event_settings(loss=0.0)
    # a later effect's events arriving shows the sender has passed the lost ones
    charge(told, reference="kept-order")

    # when
    wait_until(lambda: len(receiver.received) >= 2)

    # then
    assert {b["data"]["reference"] for b in bodies(receiver)} == {"kept-order"}
    lost = [e for e in told.events() if e["body"]["data"]["reference"] == lost_reference]
    assert [e["state"] for e in lost] == ["lost", "lost"]

    # when: redelivered by hand
    answer = told.redeliver(lost[1]["id"])

    # then: the same id and body, freshly signed
    assert answer == {"id": lost[1]["id"], "status_code": 200}
    resent = receiver.received[-1]
    assert verify(resent) == lost[1]["body"]
    assert resent.headers["webhook-id"] == lost[1]["id"]
    assert [e["state"] for e in told.events() if e["id"] == lost[1]["id"]] == ["delivered"]


def test_i19_lag_holds_events_back(told: SandboxProvider, receiver: Receiver) -> None:
    # given
    lag = 1.5
    told.event_settings(lag_seconds=lag)
    started = time.monotonic()

    # when
    charge(told)

    # then
    assert [e["state"] for e in told.events()] == ["pending", "pending"]
    wait_until(lambda: len(receiver.received) >= 2)
    assert time.monotonic() - started >= lag


def test_i19_a_receiver_answering_500_gets_the_event_again(told: SandboxProvider, receiver: Receiver) -> None:
    # given: the first request is refused, every later one accepted
    receiver.statuses = [500, 200]

    # when
    charge(told)

    # then: the refused event comes again and everything ends delivered
    wait_until(lambda: all(e["state"] == "delivered" for e in told.events()) and len(receiver.received) >= 3)
    ids = [r.headers["webhook-id"] for r in receiver.received]
    refused = ids[0]
    assert ids.count(refused) == 2
    event = next(e for e in told.events() if e["id"] == refused)
    assert (event["attempts"], event["delivered"], event["last_status"]) == (2, 1, 200)
    for received in receiver.received:
        verify(received)


def test_i19_an_unreachable_receiver_is_retried(sandbox: SandboxProvider, receiver: Receiver) -> None:
    # given: nothing listens on this port
    sandbox.event_settings(url="http://127.0.0.1:9/providers/")
    charge(sandbox)

    # when
    failed = wait_until(lambda: (e := sandbox.events()) and all(x["attempts"] >= 2 for x in e) and e)

    # then
    assert all(e["state"] == "pending" and e["last_status"] is None and e["last_error"] for e in failed)

    # when: the receiver comes up
    sandbox.event_settings(url=events_base(receiver))

    # then
    wait_until(lambda: all(e["state"] == "delivered" for e in sandbox.events()))
    assert len(receiver.received) == 2


@pytest.mark.parametrize(
    "body",
    [
        {"loss": 1.5},
        {"loss": "x"},
        {"duplicates": -1},
        {"duplicates": 1.5},
        {"duplicates": 100},
        {"reorder": "yes"},
        {"lag_seconds": -1},
        {"url": "ftp://x"},
        {"losss": 0.5},
    ],
)
def test_i19_bad_event_settings_are_400_and_change_nothing(
    sandbox: SandboxProvider, body: dict[str, Any]
) -> None:
    # given
    before = sandbox.event_settings()

    # when
    response = sandbox.client.post("/_sandbox/events", json=body)

    # then
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    assert sandbox.event_settings() == before


def test_i19_redelivering_an_unknown_event_is_404(told: SandboxProvider) -> None:
    response = told.client.post("/_sandbox/events/redeliver", json={"id": "evt_nope"})

    assert response.status_code == 404


def test_i19_reset_clears_events_and_event_settings(told: SandboxProvider, receiver: Receiver) -> None:
    # given
    told.event_settings(duplicates=1, reorder=True, loss=0.5, lag_seconds=2.0)
    charge(told)

    # when
    told.reset()

    # then
    assert told.events() == []
    assert told.event_settings() == {
        "url": None, "lag_seconds": 0.0, "duplicates": 0, "reorder": False, "loss": 0.0,
    }  # fmt: skip


def test_i19_events_url_and_secret_options_of_the_command(
    sandbox: SandboxProvider, receiver: Receiver
) -> None:
    # given: a second provider process on the same database, started with the options
    from django.db import connection

    from console.lab.sandbox_provider.database import default_dsn

    secret = "whsec_" + "Y29tbWFuZC1saW5lLXNlY3JldC1vZi10aGUtc2FuZGJveA=="
    provider = start_sandbox_provider(
        default_dsn(connection.settings_dict), events_url=events_base(receiver), events_secret=secret
    )
    try:
        # when
        charge(provider)

        # then
        wait_until(lambda: len(receiver.received) >= 2)
        assert {verify(r, secret)["type"] for r in receiver.received} == {
            "charge.created",
            "charge.succeeded",
        }
        assert provider.event_settings()["url"] == events_base(receiver)
    finally:
        provider.stop()


def test_i19_events_survive_a_killed_provider_and_are_sent_by_the_next_one(
    sandbox: SandboxProvider, receiver: Receiver
) -> None:
    # given: a provider of its own on the session's database, its events held back 3 s
    from django.db import connection

    from console.lab.sandbox_provider.database import default_dsn

    dsn = default_dsn(connection.settings_dict)
    first = start_sandbox_provider(dsn, events_url=events_base(receiver))
    first.event_settings(lag_seconds=3.0)
    charge(first, reference="killed-provider")

    # when: SIGKILLed before sending anything, then another provider starts on its database
    first.process.kill()
    first.process.wait(timeout=10)
    first.client.close()
    assert receiver.received == []
    second = start_sandbox_provider(dsn, events_url=events_base(receiver))
    try:
        # then: the stored events are sent by the new process
        wait_until(lambda: len(receiver.received) >= 2)
        assert {verify(r)["data"]["reference"] for r in receiver.received} == {"killed-provider"}
    finally:
        second.stop()
