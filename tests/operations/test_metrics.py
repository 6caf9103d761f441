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
