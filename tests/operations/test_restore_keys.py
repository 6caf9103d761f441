"""A provider key survives the loss of its intent's row (issue 22 item 3): after a failover or a
restore drops an intent whose effect happened, the agent's retry with the same Idempotency-Key
reaches the provider under the same key, and a keyed provider answers with the effect it made."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection, transaction
from rest_framework.test import APIClient

from operations.engine.protocol import execute_intent
from operations.models import Intent
from tests.factories import charge_arguments, make_agent
from tests.support.fake_provider import FakeProvider

pytestmark = pytest.mark.django_db

URL = "/api/v1/intents"
#: The ledger's tables that hold an intent's rows (what a restore to before its submission lacks).
INTENT_TABLES = (
    "operations_attempt",
    "operations_outcome",
    "operations_approval",
    "operations_outboxmessage",
)


def lose(intent: Intent) -> None:
    """What a restore to a point before ``intent`` was submitted does to the ledger: no row of
    it is left (past the audit log's triggers, as a restore would be)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        for table in INTENT_TABLES:
            cursor.execute(f"DELETE FROM {table} WHERE intent_id = %s", [intent.id])
        cursor.execute("DELETE FROM operations_auditevent WHERE intent_id = %s", [intent.id])
        cursor.execute("DELETE FROM operations_intent WHERE id = %s", [intent.id])


@pytest.fixture
def api() -> APIClient:
    _, token = make_agent()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def submit(api: APIClient, key: str, body: dict[str, Any] | None = None) -> Intent:
    body = body or {"action": "payments.charge", "arguments": charge_arguments(4990), "reference": "order-22"}
    response = api.post(URL, data=json.dumps(body), content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 201, response.content
    return Intent.objects.get(id=response.json()["intent_id"])


def test_i22_3_a_retry_after_the_intent_was_lost_charges_once(api: APIClient, sandbox: Any) -> None:
    # given: a charge made at the provider, then its intent lost by a restore
    first = submit(api, "tool-call-22")
    assert execute_intent(first.id) == "succeeded"
    (charge,) = sandbox.ledger("payments")
    lose(first)
    # when: the agent retries with the same Idempotency-Key (a new intent: the ledger lost the first)
    again = submit(api, "tool-call-22")
    assert again.id != first.id
    # then: the same provider key, and the provider answers with the charge it already made
    assert again.idempotency_key == first.idempotency_key
    assert execute_intent(again.id) == "succeeded"
    assert len(sandbox.ledger("payments")) == 1
    (outcome,) = again.outcomes.all()
    assert outcome.provider_reference == charge["id"]


def test_i22_3_different_client_keys_still_get_different_provider_keys(api: APIClient) -> None:
    assert submit(api, "tool-call-a").idempotency_key != submit(api, "tool-call-b").idempotency_key


def test_i22_3_a_generic_http_retry_after_the_intent_was_lost_sends_the_same_key_and_body(
    api: APIClient, fake_provider: FakeProvider, settings: Any
) -> None:
    # given: a generic HTTP action done at the provider, then its intent lost by a restore
    settings.EFFECT_LEDGER_GENERIC_HTTP = {"acme.transfer": {"url": f"{fake_provider.url}/v1/transfers"}}
    body = {"action": "acme.transfer", "arguments": {"amount": 1200, "currency": "EUR", "account": "acc_9"}}
    first = submit(api, "tool-call-x", body)
    assert execute_intent(first.id) == "succeeded"
    lose(first)
    # when: the agent retries with the same Idempotency-Key
    again = submit(api, "tool-call-x", body)
    assert execute_intent(again.id) == "succeeded"
    # then: the provider saw one key and one body twice, which it can deduplicate
    (one, two) = fake_provider.requests
    assert one.key == two.key == first.idempotency_key == again.idempotency_key
    assert one.body == two.body
