"""``/metrics`` serves Prometheus text with counters and the ledger's gauges."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from operations.models import OutboxMessage
from operations.services import intent_claim, intent_mark_unknown
from tests.factories import submit

pytestmark = pytest.mark.django_db


def test_metrics_exposes_counters_and_ledger_gauges(db: Any) -> None:
    # given: one READY intent whose outbox row waits for the relay (its hand-off after commit
    # failed) and one UNKNOWN intent
    OutboxMessage.objects.filter(intent=submit()).update(sent_at=None)
    unknown = submit()
    claim = intent_claim(intent_id=unknown.id, worker="w", lease_seconds=30)
    assert claim is not None and intent_mark_unknown(claim=claim, error="lost", cause="ambiguous")
    # when
    response = Client().get("/metrics")
    # then
    text = response.content.decode()
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    assert 'effect_ledger_intents{status="READY"} 1.0' in text
    assert 'effect_ledger_intents{status="UNKNOWN"} 1.0' in text
    assert 'effect_ledger_unknown_by_age{age="lt_1m"} 1.0' in text
    assert "effect_ledger_outbox_pending 1.0" in text
    assert "effect_ledger_unknown_outcomes_total" in text
    assert "effect_ledger_stale_fences_rejected_total" in text


@pytest.mark.parametrize(
    ("header", "status"),
    [
        (None, 401),
        ("Bearer wrong-token", 401),
        ("Basic c2VjcmV0LW1ldHJpY3MtdG9rZW4=", 401),
        ("Bearer secret-metrics-token", 200),
        ("bearer secret-metrics-token", 200),
    ],
)
def test_i12_7_metrics_can_require_a_bearer_token(
    db: Any, settings: Any, header: str | None, status: int
) -> None:
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "METRICS_TOKEN": "secret-metrics-token"}
    response = Client().get("/metrics", **({"HTTP_AUTHORIZATION": header} if header else {}))
    assert response.status_code == status
    if status == 401:
        assert response["WWW-Authenticate"].startswith("Bearer")
        assert "effect_ledger_" not in response.content.decode()
    else:
        assert "effect_ledger_intents" in response.content.decode()


def test_i12_7_without_a_token_metrics_stay_open(db: Any, settings: Any) -> None:
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "METRICS_TOKEN": ""}
    assert Client().get("/metrics").status_code == 200
