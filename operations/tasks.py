"""Celery tasks of the ledger: thin wrappers that take ids and call one function."""

from __future__ import annotations

import uuid

from celery import shared_task

from operations import engine, outbox


@shared_task(name="operations.execute_intent", acks_late=True, reject_on_worker_lost=True)
def execute_intent(intent_id: str, message_id: str | None = None) -> str:
    """Execute one intent (see ``operations.engine.execute_intent``); safe to deliver twice."""
    return engine.execute_intent(uuid.UUID(intent_id))


@shared_task(name="operations.relay_outbox")
def relay_outbox() -> int:
    """Publish pending outbox rows (the periodic safety net behind the post-commit kick)."""
    return outbox.outbox_relay()
