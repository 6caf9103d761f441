"""The outbox relay: a message keeps one id and a byte-identical body on every re-send (C08)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import operations.outbox as outbox
from operations.models import OutboxMessage
from tests.factories import submit

pytestmark = pytest.mark.django_db


def test_c08_every_publication_of_a_message_has_the_same_id_and_bytes(monkeypatch: Any) -> None:
    # given: an intent whose outbox row is published, then found unsent again twice (the relay
    # crashed after publishing and before marking it sent)
    published: list[tuple[str, str]] = []
    monkeypatch.setattr(
        outbox, "_publish", lambda message, countdown: published.append((str(message.id), message.body))
    )
    intent = submit()
    message = OutboxMessage.objects.get(intent=intent)
    # when
    for _ in range(3):
        OutboxMessage.objects.filter(id=message.id).update(sent_at=None)
        assert outbox.outbox_relay(message_ids=[message.id]) == 1
    # then
    assert len(published) == 3 and len(set(published)) == 1
    message_id, body = published[0]
    assert message_id == str(message.id)
    assert json.loads(body) == {
        "intent_id": str(intent.id),
        "message_id": message_id,
        "task": "operations.execute_intent",
    }
    message.refresh_from_db()
    assert message.publish_count == 3 and message.sent_at is not None


def test_a_failed_publication_leaves_the_row_pending_with_the_error(monkeypatch: Any) -> None:
    # given: the broker refuses
    def refuse(message: Any, countdown: float) -> None:
        raise ConnectionRefusedError("broker down")

    monkeypatch.setattr(outbox, "_publish", refuse)
    intent = submit()
    # when
    sent = outbox.outbox_relay()
    # then
    message = OutboxMessage.objects.get(intent=intent)
    assert sent == 0 and message.sent_at is None and "broker down" in message.last_error
