"""Issue 13: what one happy-path intent costs the database, counted (not timed).

The same counter as ``manage.py bench``'s statement profile (``console.lab.bench.profile``):
every SQL statement Django sends, every server-side commit, and which commits were single
autocommit reads. Through the real API view, the real broker (the hand-off after commit) and
the real sandbox provider process.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from console.lab.bench.profile import Tally, tallying
from operations.engine.protocol import execute_intent
from operations.models import AuditEvent, Intent, OutboxMessage
from tests.factories import make_agent
from tests.support.fake_provider import FakeProvider, fake_provider  # noqa: F401
from tests.support.processes import sandbox, sandbox_provider  # noqa: F401


def _submit(client: APIClient, action: str, arguments: dict[str, Any]) -> uuid.UUID:
    key = f"rt-{uuid.uuid4().hex[:10]}"
    if action == "reservations.create":  # its business reference travels in the arguments
        arguments = {**arguments, "reference": key}
    response = client.post(
        "/api/v1/intents",
        {"action": action, "arguments": arguments, "reference": key},
        format="json",
        HTTP_IDEMPOTENCY_KEY=key,
    )
    assert response.status_code == 201, response.content
    return uuid.UUID(response.json()["intent_id"])


#: One happy-path intent per sandbox action kind: (action, arguments).
SANDBOX_ACTIONS = [
    ("payments.charge", {"amount": 1200, "currency": "EUR", "customer": "c"}),
    ("email.send", {"to": "a@example.com", "subject": "s", "body": "b"}),
    ("reservations.create", {"resource": "room-101", "start": "2030-01-01T10:00:00Z", "seats": 2}),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("action", "arguments"), SANDBOX_ACTIONS)
def test_i13_a_happy_path_intent_is_three_write_transactions_and_no_autocommit_read(
    sandbox: Any,  # noqa: F811
    action: str,
    arguments: dict[str, Any],
) -> None:
    _assert_three_write_transactions(action, arguments)


@pytest.mark.django_db(transaction=True)
def test_i13_the_generic_http_adapter_costs_the_same_three_write_transactions(
    fake_provider: FakeProvider,  # noqa: F811
    settings: Any,
) -> None:
    settings.EFFECT_LEDGER_GENERIC_HTTP = {"acme.transfer": {"url": f"{fake_provider.url}/v1/transfers"}}
    _assert_three_write_transactions("acme.transfer", {"amount": 1200, "currency": "EUR", "account": "acc_9"})


def _assert_three_write_transactions(action: str, arguments: dict[str, Any]) -> None:
    # given: rate limits off: their one statement per request (standing in for the connection's
    # health check) is counted by tests/operations/test_rate_limits.py; this test counts the protocol's
    from django.conf import settings

    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "RATE_AGENT": None, "RATE_TENANT": None}
    # and an agent whose token this web process verified a moment ago
    _, token = make_agent()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    _submit(client, action, arguments)
    tally = Tally()
    connection.ensure_connection()
    # when: one intent is submitted through the API and executed by the engine
    with tallying(tally):
        tally.step = "submit"
        intent_id = _submit(client, action, arguments)
        tally.step = "execute"
        outcome = execute_intent(intent_id)
    # then: one write transaction to submit, two to execute (claim, record), nothing else
    assert outcome == "succeeded"
    assert dict(tally.commits) == {"submit": 1, "execute": 2}, "\n".join(map(str, tally.sql))
    assert sum(tally.autocommit_reads.values()) == 0, tally.sql
    assert tally.statements["submit"] <= 3 and tally.statements["execute"] <= 4, tally.sql
    # and the protocol's records are all there: the chain, the consumed message, the attempt
    intent = Intent.objects.get(id=intent_id)
    events = list(AuditEvent.objects.filter(intent=intent).order_by("seq").values_list("event", flat=True))
    assert intent.status == "SUCCEEDED" and events == ["submitted", "claimed", "succeeded"]
    [message] = OutboxMessage.objects.filter(intent=intent)
    assert message.acked_at is not None and message.sent_at is not None and message.publish_count == 1
    [attempt] = intent.attempts.all()
    assert attempt.result == "succeeded" and attempt.finished_at is not None
    assert intent.outcomes.get().attempt_id == attempt.id


@pytest.mark.django_db
def test_i13_a_revoked_token_is_refused_by_every_process_within_the_cache_bound(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from operations.api import authentication
    from operations.models import Agent

    # given: a token verified by this process, cached for 5 s, on a clock we control
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "TOKEN_CACHE_SECONDS": 5.0}
    clock = [1000.0]
    monkeypatch.setattr(authentication.time, "monotonic", lambda: clock[0])
    agent, token = make_agent()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert client.get("/api/v1/intents").status_code == 200
    # when: the agent is deactivated (in another process: this one's cache is not told)
    Agent.objects.filter(id=agent.id).update(is_active=False)
    # then: refused once the bound has passed, and no later
    clock[0] += 4.9
    assert client.get("/api/v1/intents").status_code == 200
    clock[0] += 0.2
    refused = client.get("/api/v1/intents")
    assert refused.status_code == 401 and "revoked" in refused.json()["detail"]
    # and an unknown token is never remembered: a token created now works at once
    _, fresh = make_agent(name="agent-2")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {fresh}")
    assert client.get("/api/v1/intents").status_code == 200


@pytest.mark.django_db
def test_i13_with_the_cache_off_a_revocation_takes_effect_at_once(settings: Any) -> None:
    from operations.models import Agent

    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "TOKEN_CACHE_SECONDS": 0}
    agent, token = make_agent()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert client.get("/api/v1/intents").status_code == 200
    Agent.objects.filter(id=agent.id).update(is_active=False)
    assert client.get("/api/v1/intents").status_code == 401
