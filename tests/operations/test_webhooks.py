"""Signed webhooks to agents: one delivery per terminal state (and escalation), written in the
transition's transaction, POSTed with the same message id and body on every attempt, signed per
Standard Webhooks and verified here with the ``standardwebhooks`` package; retries with backoff;
the callback API's refusals."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now
from django.utils import timezone
from rest_framework.test import APIClient
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from operations.adapters.base import ExecutionResult
from operations.models import Agent, Intent, WebhookDelivery
from operations.notifications.webhook_sender import new_secret
from operations.services import (
    agent_callback_clear,
    agent_callback_set,
    intent_cancel,
    intent_claim,
    intent_escalate,
    intent_expire_approval,
    intent_mark_unknown,
    intent_record_failure,
    intent_record_success,
    intent_reject,
    transition,
    webhooks_deliver_due,
)
from tests.factories import charge_arguments, make_agent, submit
from tests.support.webhook_receiver import Receiver

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _loopback_allowed(settings: Any) -> None:
    """Callbacks may reach 127.0.0.0/8 (only loopback targets in tests); short timeouts."""
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "WEBHOOK_ALLOWED_NETWORKS": ["127.0.0.0/8"],
        "WEBHOOK_CONNECT_TIMEOUT_SECONDS": 1.0,
        "WEBHOOK_TIMEOUT_SECONDS": 2.0,
    }


def agent_with_callback(url: str, name: str = "agent-1", tenant: str = "acme") -> tuple[Agent, str]:
    """An agent (made through ``agent_create``) that registered ``url``; returns it and its secret."""
    agent, _ = make_agent(name=name, tenant=tenant)
    result = agent_callback_set(agent=agent, url=url)
    return result.agent, result.new_secret


def due_now() -> None:
    """Skip the backoff wait of every pending delivery (the test is not about the clock)."""
    WebhookDelivery.objects.filter(state="pending").update(next_attempt_at=Now())


def claimed(intent: Intent) -> Any:
    claim = intent_claim(intent_id=intent.id, worker="test-worker", lease_seconds=30)
    assert claim is not None
    return claim


def gated() -> Intent:
    intent = submit(arguments=charge_arguments(25_000))
    assert intent.status == Intent.Status.AWAITING_APPROVAL
    return intent


# --- each terminal state, and escalation, is announced once ----------------------------------


def _succeed(approver: Any) -> Intent:
    intent = submit()
    assert intent_record_success(claim=claimed(intent), result=ExecutionResult("ch_1", "d" * 64))
    return intent


def _fail(approver: Any) -> Intent:
    intent = submit()
    assert intent_record_failure(claim=claimed(intent), error="card_declined")
    return intent


def _reject(approver: Any) -> Intent:
    intent = gated()
    intent_reject(intent_id=intent.id, user=approver, request_hash=intent.request_hash, reason="not this one")
    return intent


def _expire(approver: Any) -> Intent:
    intent = gated()
    Intent.objects.filter(id=intent.id).update(approval_expires_at=Now())
    assert intent_expire_approval(intent_id=intent.id)
    return intent


def _cancel(approver: Any) -> Intent:
    intent = submit()
    intent_cancel(intent_id=intent.id, actor="agent:agent-1", reason="changed my mind")
    return intent


def _compensate(approver: Any) -> Intent:
    # COMPENSATING -> COMPENSATED is the compensation's success recorded on the original; driven
    # through ``transition`` (the one place every status change goes through).
    intent = _succeed(approver)
    assert transition(intent_id=intent.id, from_status="SUCCEEDED", to_status="COMPENSATING",
                      actor="user:otto", event="compensation_started")  # fmt: skip
    assert transition(intent_id=intent.id, from_status="COMPENSATING", to_status="COMPENSATED",
                      actor="reconciler", event="compensated")  # fmt: skip
    return intent


def _escalate(approver: Any) -> Intent:
    intent = submit()
    assert intent_mark_unknown(claim=claimed(intent), error="timeout after sending", cause="ambiguous")
    assert intent_escalate(intent_id=intent.id, reason="lookups found nothing")
    return intent


PATHS: dict[str, tuple[Callable[[Any], Intent], list[str]]] = {
    "succeeded": (_succeed, ["intent.succeeded"]),
    "failed": (_fail, ["intent.failed"]),
    "rejected": (_reject, ["intent.rejected"]),
    "expired": (_expire, ["intent.expired"]),
    "cancelled": (_cancel, ["intent.cancelled"]),
    "compensated": (_compensate, ["intent.succeeded", "intent.compensated"]),
    "escalated": (_escalate, ["intent.escalated"]),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_each_terminal_state_and_escalation_enqueues_one_delivery_of_its_event_type(
    path: str, approver: Any
) -> None:
    # given
    agent, _ = agent_with_callback("http://127.0.0.1:9/hooks")
    make, expected = PATHS[path]
    # when
    intent = make(approver)
    # then
    rows = list(WebhookDelivery.objects.filter(intent=intent).order_by("id"))
    assert [r.event_type for r in rows] == expected
    last = rows[-1]
    assert (last.agent_id, last.tenant, last.state, last.attempts) == (agent.id, "acme", "pending", 0)
    assert last.message_id.startswith("msg_") and len(last.message_id) == 36
    final = Intent.objects.get(id=intent.id)
    event = final.audit_events.get(seq=last.audit_seq)
    assert last.event_at == event.created_at
    assert last.status == (event.to_status or final.status)


def test_no_callback_url_no_delivery() -> None:
    # given: an agent without a callback URL
    make_agent()
    # when
    intent = submit()
    intent_cancel(intent_id=intent.id, actor="agent:agent-1")
    # then
    assert Intent.objects.get(id=intent.id).status == "CANCELLED"
    assert not WebhookDelivery.objects.exists()


def test_a_console_users_intent_is_announced_to_nobody() -> None:
    agent_with_callback("http://127.0.0.1:9/hooks")
    intent = submit(principal="user:otto")
    intent_cancel(intent_id=intent.id, actor="user:otto")
    assert not WebhookDelivery.objects.exists()


def test_non_terminal_transitions_enqueue_nothing() -> None:
    agent_with_callback("http://127.0.0.1:9/hooks")
    intent = submit()
    claim = claimed(intent)  # READY -> RUNNING
    assert intent_mark_unknown(claim=claim, error="timeout", cause="ambiguous")  # RUNNING -> UNKNOWN
    assert not WebhookDelivery.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_transition_enqueues_nothing() -> None:
    # given
    agent_with_callback("http://127.0.0.1:9/hooks")
    intent = submit()
    # when: the cancel's transaction rolls back after the transition
    with pytest.raises(RuntimeError), transaction.atomic():
        intent_cancel(intent_id=intent.id, actor="agent:agent-1")
        assert WebhookDelivery.objects.count() == 1  # written in the same transaction
        raise RuntimeError("rolled back")
    # then
    assert Intent.objects.get(id=intent.id).status == "READY"
    assert not WebhookDelivery.objects.exists()


# --- delivery ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_one_pass_at_a_time_posts_a_slow_receivers_rows_together(receiver: Receiver) -> None:
    # given: a receiver that holds every answer 1.5 s, and four intents of its agent settled
    receiver.delay = 1.5
    agent_with_callback(receiver.url)
    for n in range(4):
        intent_cancel(intent_id=submit(reference=f"order-{n}").id, actor="agent:agent-1")
    results: list[dict[str, int]] = []
    # when: a pass runs, and a second pass starts while the first is POSTing
    started = time.monotonic()
    first = threading.Thread(target=lambda: results.append(webhooks_deliver_due()))
    first.start()
    time.sleep(0.5)
    second = webhooks_deliver_due()
    first.join(30)
    elapsed = time.monotonic() - started
    # then: the second pass returned at once, leaving the rows to the running one (so slow
    # receivers hold one worker process, never the pool); the four POSTs ran together
    assert second == {}
    assert results == [{"delivered": 4}]
    assert len(receiver.received) == 4
    assert elapsed < 4 * 1.5, elapsed
    assert set(WebhookDelivery.objects.values_list("attempts", flat=True)) == {1}


def test_receiver_answering_500_then_200_gets_the_same_id_and_body_signed_each_time(
    receiver: Receiver,
) -> None:
    # given: a receiver that fails the first attempt
    receiver.statuses = [500, 200]
    agent, secret = agent_with_callback(receiver.url)
    intent = submit(reference="order-1001")
    intent_cancel(intent_id=intent.id, actor="agent:agent-1", reason="no longer needed")
    # when
    first = webhooks_deliver_due()
    due_now()
    second = webhooks_deliver_due()
    # then: two attempts, one message
    assert (first, second) == ({"retry": 1}, {"delivered": 1})
    assert len(receiver.received) == 2
    a, b = receiver.received
    assert a.headers["webhook-id"] == b.headers["webhook-id"]
    assert a.body == b.body
    for request in (a, b):
        payload = Webhook(secret).verify(request.body, request.headers)
        assert payload["type"] == "intent.cancelled"
    data = json.loads(a.body)["data"]
    assert data == {
        "intent_id": str(intent.id),
        "status": "CANCELLED",
        "action": "payments.charge",
        "action_version": 1,
        "reference": "order-1001",
        "url": f"/api/v1/intents/{intent.id}",
    }, "no arguments: the agent has them"
    delivery = WebhookDelivery.objects.get()
    assert (delivery.state, delivery.attempts, delivery.last_status_code) == ("delivered", 2, 200)
    assert delivery.message_id == a.headers["webhook-id"] and delivery.body.encode() == a.body
    assert [h["status_code"] for h in delivery.history] == [500, 200]
    assert delivery.history[0]["error"].startswith("HTTP 500")


def test_a_forged_secret_fails_verification(receiver: Receiver) -> None:
    # given
    agent_with_callback(receiver.url)
    intent = submit()
    intent_cancel(intent_id=intent.id, actor="agent:agent-1")
    # when
    webhooks_deliver_due()
    # then
    (request,) = receiver.received
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(request.body, request.headers)
    tampered = request.body.replace(b"CANCELLED", b"SUCCEEDED")
    with pytest.raises(WebhookVerificationError):
        Webhook(Agent.objects.get().callback_secret).verify(tampered, request.headers)


def test_success_body_carries_the_provider_reference(receiver: Receiver, approver: Any) -> None:
    agent_with_callback(receiver.url)
    _succeed(approver)
    assert webhooks_deliver_due() == {"delivered": 1}
    body = json.loads(receiver.received[0].body)
    assert body["type"] == "intent.succeeded"
    assert body["data"]["outcome"] == {"provider_reference": "ch_1", "source": "provider"}


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_refused_connections_are_retried_with_backoff_then_failed(settings: Any) -> None:
    # given: nothing listens; three attempts at most, 10 s base backoff
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "WEBHOOK_MAX_ATTEMPTS": 3,
                              "WEBHOOK_BACKOFF_BASE_SECONDS": 10.0}  # fmt: skip
    agent_with_callback(f"http://127.0.0.1:{closed_port()}/hooks")
    intent = submit()
    intent_cancel(intent_id=intent.id, actor="agent:agent-1")
    # when: the first attempt
    before = timezone.now()
    assert webhooks_deliver_due() == {"retry": 1}
    # then: due again after the backoff (equal jitter: between 5 and 10 s), not before
    delivery = WebhookDelivery.objects.get()
    assert delivery.next_attempt_at is not None
    wait = (delivery.next_attempt_at - before).total_seconds()
    assert 5 - 1 <= wait <= 10 + 1
    assert webhooks_deliver_due() == {}, "not due yet"
    assert "ConnectError" in delivery.last_error and delivery.last_status_code is None
    # when: the second and third attempts
    due_now()
    assert webhooks_deliver_due() == {"retry": 1}
    due_now()
    assert webhooks_deliver_due() == {"failed": 1}
    # then
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.next_attempt_at) == ("failed", 3, None)
    assert len(delivery.history) == 3
    due_now()
    assert webhooks_deliver_due() == {}, "a failed delivery is not sent again by itself"


def test_a_claim_holds_the_row_as_a_lease(receiver: Receiver) -> None:
    # given
    from operations.services.webhook_delivery import webhook_attempt, webhooks_claim_due

    agent_with_callback(receiver.url)
    intent = submit()
    intent_cancel(intent_id=intent.id, actor="agent:agent-1")
    # when: one pass claims it (and has not posted yet)
    (claim,) = webhooks_claim_due()
    # then: another pass finds nothing due; the first records its attempt
    assert webhooks_claim_due() == []
    assert webhook_attempt(claim) == "delivered"
    # a stale claim (its lease lapsed, somebody re-claimed) records nothing
    assert webhook_attempt(claim) == "stale"
    assert len(receiver.received) == 2 and WebhookDelivery.objects.get().attempts == 1


def test_the_ssrf_guard_refuses_loopback_unless_allowed(settings: Any, receiver: Receiver) -> None:
    # given: loopback not allowed (the default with DATABASE_URL set)
    agent_with_callback(receiver.url.replace("127.0.0.1", "localhost"))
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "WEBHOOK_ALLOWED_NETWORKS": []}
    intent = submit()
    intent_cancel(intent_id=intent.id, actor="agent:agent-1")
    # when
    assert webhooks_deliver_due() == {"retry": 1}
    # then
    assert receiver.received == []
    assert "not a public address" in WebhookDelivery.objects.get().last_error


# --- the callback API --------------------------------------------------------------------------


def test_callback_api_registers_shows_rotates_and_removes(api: APIClient) -> None:
    # when: registered
    response = api.put("/api/v1/callback", {"url": "https://hooks.example.test/ledger"}, format="json")
    # then: the secret is answered once
    assert response.status_code == 200, response.content
    secret = response.json()["secret"]
    assert secret.startswith("whsec_") and len(Webhook(secret)._whsecret) == 32
    assert api.get("/api/v1/callback").json() == {
        "url": "https://hooks.example.test/ledger",
        "secret_hint": f"whsec_…{secret[-4:]}",
        "secret": None,
    }
    # a new URL keeps the secret; rotate_secret makes a new one
    moved = api.put("/api/v1/callback", {"url": "https://hooks.example.test/v2"}, format="json").json()
    assert moved["secret"] is None and Agent.objects.get().callback_secret == secret
    rotated = api.put("/api/v1/callback", {"url": "https://hooks.example.test/v2", "rotate_secret": True},
                      format="json").json()  # fmt: skip
    assert (
        rotated["secret"] not in (None, secret) and Agent.objects.get().callback_secret == rotated["secret"]
    )
    # removed
    assert api.delete("/api/v1/callback").status_code == 204
    assert (Agent.objects.get().callback_url, Agent.objects.get().callback_secret) == ("", "")


@pytest.mark.parametrize(
    "url, why",
    [
        ("ftp://hooks.example.test/x", "https://"),
        ("javascript:alert(1)", "https://"),
        ("hooks.example.test/x", "https://"),
        ("https:///path-only", "no host"),
        ("https://user:pw@hooks.example.test/x", "credentials"),
        ("https://token@hooks.example.test/x", "credentials"),
        ("https://hooks.example.test/x#frag", "fragment"),
        ("https://hooks.example.test/" + "a" * 2000, "2000"),
        ("https://hooks.example.test/a b", "whitespace"),
        ("https://hooks.example.test:99999/x", "malformed"),
        ("http://10.0.0.7/x", "not a public address"),
        ("http://169.254.169.254/latest/meta-data", "not a public address"),
        ("http://[::ffff:10.0.0.1]/x", "not a public address"),
        # IPv6 forms carrying the metadata address (third reviewer): NAT64, 6to4, translated
        ("http://[64:ff9b::a9fe:a9fe]/x", "not a public address"),
        ("http://[2002:a9fe:a9fe::]/x", "not a public address"),
        ("http://[::ffff:0:a9fe:a9fe]/x", "not a public address"),
        ("http://[::a9fe:a9fe]/x", "not a public address"),
        ("http://%31%32%37.0.0.1/x", "percent-encoded"),
        ("http://127.0.0.1%2509/x", "percent-encoded"),
        # legacy IPv4 forms (inet_aton's: hexadecimal, octal, fewer than four parts, one number)
        ("http://0x0a000001/h", "not a public address"),
        ("http://10.1/h", "not a public address"),
        ("http://167772161/h", "not a public address"),
        ("http://012.0.0.1/h", "not a public address"),
        ("http://0177.1/h", "in dotted-decimal form: 127.0.0.1"),  # loopback is allowed here
        ("http://0/h", "not a public address"),
        ("http://10.0.0.1./h", "not a public address"),
        ("http://\uff11\uff10.\uff10.\uff10.\uff11/h", "not a public address"),
        ("http://0x08080808/h", "in dotted-decimal form: 8.8.8.8"),
        ("", "blank"),
    ],
)
def test_callback_api_refuses_bad_urls_and_stores_nothing(api: APIClient, url: str, why: str) -> None:
    # given: a registered URL
    api.put("/api/v1/callback", {"url": "https://hooks.example.test/ok"}, format="json")
    before = Agent.objects.values("callback_url", "callback_secret").get()
    # when
    response = api.put("/api/v1/callback", {"url": url, "rotate_secret": True}, format="json")
    # then
    assert response.status_code == 422, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert why in response.json()["detail"]
    assert Agent.objects.values("callback_url", "callback_secret").get() == before


@pytest.mark.parametrize(
    "url",
    [
        "https://8.8.8.8/h",
        "https://cafe.example.test/h",
        "https://0x10.example.test/h",
        "https://10.example/h",
        "https://xn--bcher-kva.example/h",
    ],
)
def test_callback_api_accepts_public_addresses_and_names_that_only_look_numeric(
    api: APIClient, url: str
) -> None:
    response = api.put("/api/v1/callback", {"url": url}, format="json")
    assert response.status_code == 200, response.content
    assert Agent.objects.get().callback_url == url


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"url": 5},
        {"url": "https://h.example.test/", "rotate_secret": "true"},
        {"url": "https://h.example.test/", "x": 1},
    ],
)
def test_callback_api_refuses_malformed_bodies(api: APIClient, body: dict[str, Any]) -> None:
    response = api.put("/api/v1/callback", body, format="json")
    assert response.status_code == 422
    assert Agent.objects.get().callback_url == ""


def test_callback_api_needs_a_token() -> None:
    assert APIClient().get("/api/v1/callback").status_code == 401


def test_an_agent_sees_only_its_own_callback(api: APIClient) -> None:
    # given: a colleague's registration
    colleague, _ = agent_with_callback("https://hooks.example.test/colleague", name="agent-2")
    # when / then
    assert api.get("/api/v1/callback").json()["url"] == ""
    api.put("/api/v1/callback", {"url": "https://hooks.example.test/mine"}, format="json")
    colleague.refresh_from_db()
    assert colleague.callback_url == "https://hooks.example.test/colleague"


@pytest.mark.django_db(transaction=True)
def test_two_first_registrations_at_once_make_exactly_one_secret_the_stored_one() -> None:
    # given: two requests of one agent, each with the Agent read at authentication (no secret yet)
    make_agent()
    stale = [Agent.objects.get(), Agent.objects.get()]
    barrier = threading.Barrier(len(stale))

    def register(args: tuple[int, Agent]) -> Any:
        n, agent = args
        barrier.wait()
        try:
            return agent_callback_set(agent=agent, url=f"https://hooks.example.test/{n}")
        finally:
            connection.close()

    # when: both register their first URL at the same moment
    with ThreadPoolExecutor(max_workers=len(stale)) as pool:
        results = list(pool.map(register, enumerate(stale)))
    # then: one of them made the secret, and it is the one stored; both answers show the stored one
    stored = Agent.objects.get()
    made = [r.new_secret for r in results if r.new_secret]
    assert made == [stored.callback_secret], "exactly one secret, shown once, the one that signs"
    assert stored.callback_url in {r.agent.callback_url for r in results}
    assert all(r.agent.callback_secret == stored.callback_secret for r in results)


def test_registering_after_a_removal_with_a_stale_agent_makes_a_new_secret() -> None:
    # given: the Agent of a request authenticated before the URL was removed (another process)
    agent, old = agent_with_callback("https://hooks.example.test/a")
    agent_callback_clear(agent=Agent.objects.get(id=agent.id))
    assert agent.callback_secret == old, "stale: still carries the removed secret"
    # when
    result = agent_callback_set(agent=agent, url="https://hooks.example.test/b")
    # then: a new secret, stored, answered once
    stored = Agent.objects.get()
    assert result.new_secret not in ("", old)
    assert (stored.callback_url, stored.callback_secret) == (
        "https://hooks.example.test/b",
        result.new_secret,
    )
    assert (result.agent.callback_url, result.agent.callback_secret) == (
        stored.callback_url,
        stored.callback_secret,
    )


def test_callback_api_put_after_a_removal_elsewhere_answers_the_new_stored_secret(api: APIClient) -> None:
    # given: a URL registered, this process's token cache holding the agent with its secret, and
    # the URL removed by another process (a fresh Agent object: this process's cache is stale)
    first = api.put("/api/v1/callback", {"url": "https://hooks.example.test/a"}, format="json").json()
    agent_callback_clear(agent=Agent.objects.get())
    # when: registered again at once (within TOKEN_CACHE_SECONDS)
    again = api.put("/api/v1/callback", {"url": "https://hooks.example.test/b"}, format="json").json()
    # then: the answer is the stored row, with the new secret shown once
    stored = Agent.objects.get()
    assert again["secret"] not in (None, first["secret"]) and again["secret"] == stored.callback_secret
    assert again["secret_hint"] == f"whsec_…{stored.callback_secret[-4:]}"
    assert api.get("/api/v1/callback").json() == {
        "url": "https://hooks.example.test/b",
        "secret_hint": again["secret_hint"],
        "secret": None,
    }


def test_clearing_with_a_stale_agent_clears_the_stored_row() -> None:
    # given: a stale Agent (read before a rotation elsewhere)
    agent, _ = agent_with_callback("https://hooks.example.test/a")
    agent_callback_set(
        agent=Agent.objects.get(id=agent.id), url="https://hooks.example.test/a", rotate_secret=True
    )
    # when
    agent_callback_clear(agent=agent)
    # then
    assert Agent.objects.values_list("callback_url", "callback_secret").get() == ("", "")


def test_deliveries_use_the_url_and_secret_in_force_at_the_attempt(receiver: Receiver) -> None:
    # given: a delivery written while the agent had another URL and secret
    agent, _ = agent_with_callback("http://127.0.0.1:9/old")
    intent = submit()
    intent_cancel(intent_id=intent.id, actor="agent:agent-1")
    secret = agent_callback_set(agent=agent, url=receiver.url, rotate_secret=True).new_secret
    # when
    assert webhooks_deliver_due() == {"delivered": 1}
    # then
    Webhook(secret).verify(receiver.received[0].body, receiver.received[0].headers)


def test_delivery_after_the_url_was_removed_fails_without_sending(receiver: Receiver) -> None:
    agent, _ = agent_with_callback(receiver.url)
    intent = submit()
    intent_cancel(intent_id=intent.id, actor="agent:agent-1")
    agent_callback_clear(agent=agent)
    assert webhooks_deliver_due() == {"retry": 1}
    assert receiver.received == []
    assert "no callback URL" in WebhookDelivery.objects.get().last_error


def test_message_ids_differ_between_deliveries(receiver: Receiver) -> None:
    agent_with_callback(receiver.url)
    for _ in range(2):
        intent_cancel(intent_id=submit().id, actor="agent:agent-1")
    ids = set(WebhookDelivery.objects.values_list("message_id", flat=True))
    assert len(ids) == 2
    assert (
        WebhookDelivery.objects.filter(next_attempt_at__lte=timezone.now() + timedelta(seconds=1)).count()
        == 2
    )


def test_callback_answers_match_the_openapi_document(api: APIClient) -> None:
    from tests.operations.test_openapi import assert_matches_document, served_document

    def send(method: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else b""
        response = getattr(api, method)("/api/v1/callback", data=data, content_type="application/json")
        response.sent_body = data
        return response

    # given / when
    answers = [
        send("put", {"url": "https://hooks.example.test/ledger"}),
        send("get"),
        send("put", {"url": "https://hooks.example.test/ledger", "rotate_secret": True}),
        send("put", {"url": "https://user:pw@hooks.example.test/"}),
        send("put", {"url": 5}),
        send("delete"),
    ]
    # then
    assert [a.status_code for a in answers] == [200, 200, 200, 422, 422, 204]
    for answer in answers:
        assert_matches_document(answer)
    operations = served_document()["paths"]["/api/v1/callback"]
    assert set(operations) >= {"get", "put", "delete"}
    assert all(
        op["security"] == [{"AgentToken": []}] for op in (operations[m] for m in ("get", "put", "delete"))
    )


def test_the_admin_sets_the_url_shows_the_secret_once_and_rotates_it(client: Any) -> None:
    from django.contrib.auth import get_user_model

    # given
    admin = get_user_model().objects.create_superuser("root", "root@example.test", "correct horse battery")
    client.force_login(admin)
    agent, _ = make_agent()
    url = f"/admin/operations/agent/{agent.id}/change/"
    form = {"actions_text": "*", "scope": "own", "is_active": "on", "tokens-TOTAL_FORMS": "0",
            "tokens-INITIAL_FORMS": "0"}  # fmt: skip
    # when: a refused URL, then a good one
    refused = client.post(url, {**form, "callback_url": "https://u:p@hooks.example.test/"})
    saved = client.post(url, {**form, "callback_url": "https://hooks.example.test/a"}, follow=True)
    # then
    assert refused.status_code == 200 and b"credentials" in refused.content
    agent.refresh_from_db()
    assert agent.callback_url == "https://hooks.example.test/a"
    assert agent.callback_secret.encode() in saved.content, "shown once, in a message"
    again = client.get(url).content
    assert agent.callback_secret.encode() not in again and agent.callback_secret[-4:].encode() in again
    # when: rotated
    old = agent.callback_secret
    client.post(
        "/admin/operations/agent/", {"action": "rotate_callback_secret", "_selected_action": [agent.id]}
    )
    agent.refresh_from_db()
    assert agent.callback_secret not in ("", old)


def test_the_admin_saving_an_agent_keeps_a_secret_rotated_meanwhile(rf: Any) -> None:
    from django.contrib import admin

    # given: the admin's form read the agent; then the agent rotated its secret through the API
    agent, _ = agent_with_callback("https://hooks.example.test/a")
    read_by_the_form = Agent.objects.get(id=agent.id)
    rotated = agent_callback_set(agent=agent, url="https://hooks.example.test/a", rotate_secret=True)
    read_by_the_form.scope = "tenant"
    # when: the operator saves the form (same URL)
    admin.site._registry[Agent].save_model(rf.post("/"), read_by_the_form, None, True)
    # then: the edit is saved and the rotated secret kept
    stored = Agent.objects.get(id=agent.id)
    assert (stored.scope, stored.callback_secret) == ("tenant", rotated.new_secret)
