"""Races proved with two real PostgreSQL connections (threads, each with its own connection)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from operations.models import Attempt, Intent, OutboxMessage
from operations.services import intent_claim, intent_submit
from tests.factories import charge_arguments, submit

pytestmark = pytest.mark.django_db(transaction=True)


def run_together(fn: Callable[[], Any], n: int = 2) -> list[Any]:
    """Run ``fn`` in ``n`` threads released at the same instant; return results or exceptions."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def worker(i: int) -> None:
        try:
            barrier.wait()
            results[i] = fn()
        except Exception as exc:  # surfaced to the test through results
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_c09_concurrent_identical_submissions_create_one_intent() -> None:
    # given
    key = f"resume-{uuid.uuid4()}"

    def submit_once() -> Any:
        return intent_submit(
            tenant="acme",
            principal="agent:agent-1",
            client_key=key,
            action="payments.charge",
            arguments=charge_arguments(),
        )

    # when
    results = run_together(submit_once, n=4)
    # then
    assert not [r for r in results if isinstance(r, Exception)], results
    assert len({r.intent.id for r in results}) == 1
    assert sorted(r.created for r in results) == [False, False, False, True]
    assert Intent.objects.count() == 1 and OutboxMessage.objects.count() == 1


def test_c05_two_connections_claim_one_intent_one_wins() -> None:
    # given
    intent = submit()

    def claim() -> Any:
        return intent_claim(intent_id=intent.id, worker=f"w-{threading.get_ident()}", lease_seconds=30)

    # when
    results = run_together(claim, n=2)
    # then
    winners = [r for r in results if r is not None]
    assert len(winners) == 1, results
    intent.refresh_from_db()
    assert intent.fence == 1 and intent.status == Intent.Status.RUNNING and intent.attempt_count == 1
    assert Attempt.objects.filter(intent=intent).count() == 1
