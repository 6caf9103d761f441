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


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("move", ["cancel", "claim", "record success"])
def test_i13_a_transition_that_waited_for_the_row_lock_appends_after_the_event_it_waited_for(
    move: str,
) -> None:
    """Issue 13 review: the compare-and-swap returns the audit chain's head, read in the snapshot
    taken before it waited for the intent's row lock. When the lock's holder appended an event
    without changing the status (a refused decision) and committed, that head is stale; the
    transition must still succeed, its event after the other one."""
    import time

    from django.db import transaction

    from operations.adapters.base import ExecutionResult
    from operations.audit.chain_checks import audit_verify
    from operations.models import AuditEvent
    from operations.services import intent_cancel, intent_record_success
    from operations.services.refusals import intent_record_refusal

    intent = submit()
    claim = None
    if move == "record success":
        claim = intent_claim(intent_id=intent.id, worker="w1", lease_seconds=30)
        assert claim is not None
    locked, done = threading.Event(), threading.Event()

    def refusal_holding_the_lock() -> None:
        try:
            with transaction.atomic():
                intent_record_refusal(
                    intent_id=intent.id, actor="user:someone", decision="approve", reason="no"
                )
                locked.set()
                time.sleep(0.5)  # the other transition now waits for the row lock
        finally:
            connection.close()
            done.set()

    holder = threading.Thread(target=refusal_holding_the_lock)
    holder.start()
    assert locked.wait(10)
    if move == "cancel":
        intent_cancel(intent_id=intent.id, actor="agent:a")
        expected = ("decision_refused", "cancelled")
    elif move == "claim":
        assert intent_claim(intent_id=intent.id, worker="w2", lease_seconds=30) is not None
        expected = ("decision_refused", "claimed")
    else:
        assert claim is not None
        result = ExecutionResult(provider_reference="ch_1", response_digest="")
        assert intent_record_success(claim=claim, result=result)
        expected = ("decision_refused", "succeeded")
    holder.join(10)
    assert done.is_set()
    events = list(AuditEvent.objects.filter(intent_id=intent.id).order_by("seq").values_list("seq", "event"))
    assert [name for _, name in events][-2:] == list(expected), events
    assert [seq for seq, _ in events] == list(range(1, len(events) + 1))
    assert list(audit_verify()) == []
