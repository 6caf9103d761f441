"""The bare-Celery baseline: call the sandbox's charge endpoint with a key, record nothing."""

from __future__ import annotations

from typing import Any

import httpx
from celery import shared_task

_client: httpx.Client | None = None


def _http() -> httpx.Client:
    global _client
    if _client is None:
        _client = httpx.Client(timeout=10.0)
    return _client


@shared_task(name="bench.bare_charge", acks_late=True, ignore_result=True)
def bare_charge(url: str, key: str, body: dict[str, Any]) -> int:
    """POST ``body`` to ``url`` with ``Idempotency-Key: key``; return the HTTP status.

    No database access, no outbox, no lease: the least a worker can do per effect.
    """
    return _http().post(url, json=body, headers={"Idempotency-Key": key}).status_code
