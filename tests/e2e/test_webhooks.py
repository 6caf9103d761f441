"""Signed webhooks with real worker and beat processes, the real sandbox provider and a real
loopback receiver: a charge's SUCCEEDED reaches the agent's receiver, signed."""

from __future__ import annotations

from typing import Any

import pytest
from standardwebhooks import Webhook

from operations.models import Intent, Outcome, WebhookDelivery
from operations.services import agent_callback_set
from tests.factories import charge_arguments, make_agent, submit
from tests.support.webhook_receiver import Receiver
from tests.support.workers import Cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_charges_success_reaches_the_agents_receiver_signed(
    cluster: Cluster, sandbox: Any, receiver: Receiver, settings: Any
) -> None:
    # given: workers that may POST to loopback, and an agent that registered the receiver; the
    # receiver fails the first attempt
    cluster.env["EFFECT_LEDGER_WEBHOOK_ALLOWED_NETWORKS"] = "127.0.0.0/8"
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "WEBHOOK_ALLOWED_NETWORKS": ["127.0.0.0/8"]}
    cluster.env["EFFECT_LEDGER_WEBHOOK_BACKOFF_BASE_SECONDS"] = "0.5"
    cluster.env["EFFECT_LEDGER_WEBHOOK_PERIOD_SECONDS"] = "0.5"
    cluster.worker("w1")
    cluster.beat()
    receiver.statuses = [503, 200]
    agent, _ = make_agent()
    secret = agent_callback_set(agent=agent, url=receiver.url).new_secret
    # when
    intent = submit(arguments=charge_arguments(1234), reference="order-hook-1")
    wait_for(
        lambda: WebhookDelivery.objects.filter(intent=intent, state="delivered").exists(),
        60,
        "the webhook of the charge's SUCCEEDED to be delivered",
    )
    # then: one effect, one message, two attempts with the same id and body, both signed
    assert Intent.objects.get(id=intent.id).status == "SUCCEEDED"
    assert len(sandbox.ledger("payments", reference="order-hook-1")) == 1
    assert len(receiver.received) == 2
    first, second = receiver.received
    assert first.headers["webhook-id"] == second.headers["webhook-id"] and first.body == second.body
    payloads = [Webhook(secret).verify(r.body, r.headers) for r in receiver.received]
    outcome = Outcome.objects.get(intent=intent)
    assert payloads[1]["type"] == "intent.succeeded"
    assert payloads[1]["data"]["intent_id"] == str(intent.id)
    assert payloads[1]["data"]["outcome"]["provider_reference"] == outcome.provider_reference
    delivery = WebhookDelivery.objects.get(intent=intent)
    assert (delivery.attempts, delivery.last_status_code) == (2, 200)
