"""The console's Webhooks page: deliveries of the tenants the user reads, in every state and
for intents of every action kind; operators re-send a delivered or failed one with the same
message id and body; viewers cannot; another tenant's deliveries are invisible."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from standardwebhooks import Webhook

from operations.models import Agent, WebhookDelivery
from operations.services import agent_callback_set, intent_cancel, webhooks_deliver_due
from tests.console.conftest import signed_in
from tests.factories import UserFactory, make_agent, submit
from tests.support.webhook_receiver import Receiver

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
URL = "/webhooks/"

#: One intent of each provider kind (tests/console/test_every_kind.py has the same arguments).
KINDS: dict[str, dict[str, Any]] = {
    "payments.charge": {"amount": 4990, "currency": "EUR", "customer": "cus_42"},
    "payments.refund": {"charge": "ch_1", "amount": 1500, "currency": "EUR"},
    "email.send": {"to": "ana@example.test", "subject": "Receipt", "body": "Thanks"},
    "reservations.create": {
        "resource": "room-101",
        "start": "2030-01-01T10:00:00Z",
        "seats": 2,
        "reference": "b-1",
    },
    "reservations.cancel": {"reservation": "res_1", "reference": "cancel-1"},
}


@pytest.fixture(autouse=True)
def _loopback_allowed(settings: Any) -> None:
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "WEBHOOK_ALLOWED_NETWORKS": ["127.0.0.0/8"],
                              "WEBHOOK_MAX_ATTEMPTS": 1}  # fmt: skip


def announced(url: str, tenant: str = "acme", action: str = "payments.charge") -> WebhookDelivery:
    """A cancelled intent of ``action`` by agent-1 of ``tenant`` (made when missing) with
    callback ``url``: its delivery."""
    agent = Agent.objects.filter(name="agent-1", tenant=tenant).first() or make_agent(tenant=tenant)[0]
    agent_callback_set(agent=agent, url=url)
    intent = submit(tenant=tenant, action=action, arguments=KINDS[action])
    intent_cancel(intent_id=intent.id, actor="agent:agent-1")
    return WebhookDelivery.objects.get(intent=intent)


def test_the_page_renders_with_no_delivery(viewer_client: Client) -> None:
    for headers in ({}, HTMX):
        response = viewer_client.get(URL, **headers)
        assert response.status_code == 200
        assert b"No webhook delivery" in response.content


def test_the_nav_links_the_page(viewer_client: Client) -> None:
    assert f'href="{URL}"'.encode() in viewer_client.get("/").content


def test_the_page_shows_every_state_for_every_action_kind(viewer_client: Client, receiver: Receiver) -> None:
    # given: a delivered, then failed deliveries (one attempt at most), then pending ones
    receiver.statuses = [200, 500]
    for action in KINDS:
        announced(receiver.url, action=action)
    webhooks_deliver_due()
    for action in KINDS:
        announced(receiver.url, action=action)
    states = set(WebhookDelivery.objects.values_list("state", flat=True))
    assert states == {"delivered", "failed", "pending"}
    # when
    for headers in ({}, HTMX):
        response = viewer_client.get(URL, **headers)
        # then
        assert response.status_code == 200
        page = response.content.decode()
        for action in KINDS:
            assert action in page
        for state in ("delivered", "failed", "pending"):
            assert f">{state}</span>" in page
        assert "HTTP 500" in page and "intent.cancelled" in page
        assert "Re-send</button>" not in page, "a viewer cannot re-send"
    for state in ("delivered", "failed", "pending"):
        narrowed = viewer_client.get(URL, {"state": state}).content.decode()
        others = {"delivered", "failed", "pending"} - {state}
        assert f">{state}</span>" in narrowed and not any(f">{o}</span>" in narrowed for o in others)


def test_an_operator_re_sends_a_failed_delivery_with_the_same_id_and_body(
    operator_client: Client, receiver: Receiver
) -> None:
    # given: a delivery that failed after its last attempt
    receiver.statuses = [500, 200]
    delivery = announced(receiver.url)
    webhooks_deliver_due()
    delivery.refresh_from_db()
    assert delivery.state == "failed"
    assert b"Re-send</button>" in operator_client.get(URL).content
    # when
    response = operator_client.post(reverse("webhook-resend", args=[delivery.id]), **HTMX)
    # then: pending again, due now; the next pass sends the same bytes
    assert response.status_code == 200
    assert b"pending again" in response.content
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts) == ("pending", 0)
    assert delivery.history[-1]["resent_by"] == "user:otto"
    assert webhooks_deliver_due() == {"delivered": 1}
    first, second = receiver.received
    assert first.body == second.body and first.headers["webhook-id"] == second.headers["webhook-id"]
    Webhook(delivery.agent.callback_secret).verify(second.body, second.headers)


def test_a_delivered_delivery_can_be_re_sent_without_javascript(
    operator_client: Client, receiver: Receiver
) -> None:
    delivery = announced(receiver.url)
    webhooks_deliver_due()
    response = operator_client.post(reverse("webhook-resend", args=[delivery.id]))
    assert response.status_code == 302 and response["Location"] == URL
    delivery.refresh_from_db()
    assert delivery.state == "pending"


def test_a_pending_delivery_is_not_re_sent(operator_client: Client) -> None:
    delivery = announced("http://127.0.0.1:9/hooks")
    response = operator_client.post(reverse("webhook-resend", args=[delivery.id]), **HTMX)
    assert response.status_code == 409
    assert b"pending already" in response.content


def test_a_viewer_cannot_re_send(viewer_client: Client, receiver: Receiver) -> None:
    delivery = announced(receiver.url)
    webhooks_deliver_due()
    response = viewer_client.post(reverse("webhook-resend", args=[delivery.id]), **HTMX)
    assert response.status_code == 403
    assert b"Only operators and admins" in response.content
    delivery.refresh_from_db()
    assert delivery.state == "delivered"


def test_re_send_needs_post_and_csrf(operator: Any, receiver: Receiver) -> None:
    delivery = announced(receiver.url)
    webhooks_deliver_due()
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    assert client.get(reverse("webhook-resend", args=[delivery.id])).status_code == 405
    assert client.post(reverse("webhook-resend", args=[delivery.id])).status_code == 403
    delivery.refresh_from_db()
    assert delivery.state == "delivered"


def test_another_tenants_deliveries_are_invisible(receiver: Receiver) -> None:
    # given: an operator of acme only, and a delivery of globex
    ours = announced(receiver.url, tenant="acme")
    theirs = announced(receiver.url, tenant="globex")
    webhooks_deliver_due()
    client = signed_in(UserFactory(username="ann", groups=["operator"], tenants=["acme"]))
    # when
    page = client.get(URL).content.decode()
    # then
    assert ours.message_id in page and theirs.message_id not in page
    assert client.post(reverse("webhook-resend", args=[theirs.id]), **HTMX).status_code == 404
    theirs.refresh_from_db()
    assert theirs.state == "delivered"
