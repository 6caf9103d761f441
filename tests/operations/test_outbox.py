"""The outbox relay: a message keeps one id and a byte-identical body on every re-send (C08)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import operations.workers.outbox as outbox
from operations.models import OutboxMessage
from tests.factories import submit

pytestmark = pytest.mark.django_db


def test_c08_every_publication_of_a_message_has_the_same_id_and_bytes(
    monkeypatch: Any, django_capture_on_commit_callbacks: Any
) -> None:
    # given: an intent whose outbox row is handed to the broker after commit, then found unsent
    # again three times (the relay crashed after publishing and before marking it sent)
    published: list[tuple[str, str]] = []
    monkeypatch.setattr(
        outbox, "_publish", lambda message, countdown: published.append((str(message.id), message.body))
    )
    with django_capture_on_commit_callbacks(execute=True):
        intent = submit()
    message = OutboxMessage.objects.get(intent=intent)
    # when
    for _ in range(3):
        OutboxMessage.objects.filter(id=message.id).update(sent_at=None)
        assert outbox.outbox_relay(message_ids=[message.id]) == 1
    # then: the hand-off and the three re-sends carry the same id and bytes
    assert len(published) == 4 and len(set(published)) == 1
    message_id, body = published[0]
    assert message_id == str(message.id)
    assert json.loads(body) == {
        "intent_id": str(intent.id),
        "message_id": message_id,
        "task": "operations.execute_intent",
    }
    message.refresh_from_db()
    assert message.publish_count == 4 and message.sent_at is not None


def test_c04_a_failed_publication_leaves_the_row_pending_with_the_error(
    monkeypatch: Any, django_capture_on_commit_callbacks: Any
) -> None:
    # given: the broker refuses the hand-off after commit
    def refuse(message: Any, countdown: float) -> None:
        raise ConnectionRefusedError("broker down")

    monkeypatch.setattr(outbox, "_publish", refuse)
    with django_capture_on_commit_callbacks(execute=True):
        intent = submit()
    message = OutboxMessage.objects.get(intent=intent)
    assert message.sent_at is None and message.publish_count == 0 and "broker down" in message.last_error
    # when: the relay finds it while the broker is still down
    sent = outbox.outbox_relay()
    # then
    message.refresh_from_db()
    assert sent == 0 and message.sent_at is None and "broker down" in message.last_error
    # when: the broker is back
    published: list[str] = []
    monkeypatch.setattr(outbox, "_publish", lambda message, countdown: published.append(str(message.id)))
    assert outbox.outbox_relay() == 1
    message.refresh_from_db()
    assert published == [str(message.id)] and message.sent_at is not None and message.last_error == ""
