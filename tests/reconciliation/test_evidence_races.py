"""Issue 21 item 9: evidence found at the same moment as an operator's decision is never thrown
away. Each race runs on real PostgreSQL connections (threads, each with its own connection)
against the real sandbox provider process; nothing is mocked."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.db.models.functions import Now

from operations.engine.protocol import execute_intent
from operations.exceptions import IntentMoved, ResolutionRefused
from operations.models import AuditEvent, Intent, Outcome
from reconciliation.lookups import reconcile_intent
from reconciliation.models import Evidence
from reconciliation.resolution import resolve_absent
from tests.factories import UserFactory, submit
from tests.operations.test_races import run_together
from tests.reconciliation.test_reconciliation import email

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def operator(db: Any) -> Any:
    return UserFactory(username="olga", groups=["operator"])


def unknown_email_that_was_sent(sandbox: Any, n: int) -> Intent:
    """An email the provider sent whose answer was lost: UNKNOWN, one email in the ledger."""
    sandbox.inject("crash_after_effect", product="email")
    intent = submit(action="email.send", arguments={**email(n), "reference": f"race-{n}"})
    assert execute_intent(intent.id) == "unknown"
    assert len(sandbox.ledger("email", reference=f"race-{n}")) == 1
    return intent


def run_what_is_due(intent: Intent) -> None:
    """Let any re-send happen: wait out the settle time, then deliver the intent to a worker."""
    Intent.objects.filter(id=intent.id, status=Intent.Status.READY).update(not_before=Now())
    execute_intent(intent.id)


def blocked_on_a_lock(thread_connection_pid: list[int]) -> bool:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [thread_connection_pid[0]]
        )
        row = cursor.fetchone()
    return bool(row and row[0] == "Lock")


def test_i21_9_a_lookup_in_flight_when_the_operator_says_absent_wins(sandbox: Any, operator: Any) -> None:
    # given: an email that was sent; the reconciler's lookup has found it but cannot record yet,
    # because the operator's `absent` holds the intent's row (the order the race produced)
    intent = unknown_email_that_was_sent(sandbox, 901)
    pid: list[int] = []
    outcome: list[Any] = []

    def reconciler() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pid.append(cursor.fetchone()[0])
            outcome.append(reconcile_intent(intent.id))
        finally:
            connection.close()

    with transaction.atomic():
        Intent.objects.select_for_update().get(id=intent.id)
        thread = threading.Thread(target=reconciler)
        thread.start()
        deadline = time.monotonic() + 10
        while not (pid and blocked_on_a_lock(pid)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pid and blocked_on_a_lock(pid), "the reconciler never reached the intent's lock"
        # when: the operator's absent commits first (nothing found is on record yet)
        ready = resolve_absent(
            intent_id=intent.id,
            user=operator,
            reason="customer says nothing came",
            accept_duplicate_risk=True,
        )
        assert ready.status == Intent.Status.READY and ready.not_before is not None
    thread.join(15)
    # then: the lookup's evidence wins: SUCCEEDED with the found email, nothing sent again
    assert outcome == ["resolved"]
    intent.refresh_from_db()
    assert intent.status == Intent.Status.SUCCEEDED
    run_what_is_due(intent)
    (sent,) = sandbox.ledger("email", reference="race-901")
    assert Outcome.objects.get(intent=intent).provider_reference == sent["id"]
    found = AuditEvent.objects.filter(intent=intent, event="outcome_found").get()
    assert (found.from_status, found.to_status) == ("READY", "SUCCEEDED")
    assert "not sent again" in found.reason


def test_i21_9_absent_is_refused_while_a_found_effect_is_on_record(sandbox: Any, operator: Any) -> None:
    # given: a lookup found the email but could not act on it (its intent was still UNKNOWN
    # afterwards); here the evidence row is what that lookup left
    intent = unknown_email_that_was_sent(sandbox, 902)
    (sent,) = sandbox.ledger("email", reference="race-902")
    Evidence.objects.create(
        intent=intent, kind=Evidence.Kind.LOOKUP, result="found", provider_references=[sent["id"]]
    )
    # when / then: absent is refused and names the evidence; nothing moves, nothing is sent
    with pytest.raises(ResolutionRefused, match=sent["id"]):
        resolve_absent(intent_id=intent.id, user=operator, reason="resend", accept_duplicate_risk=True)
    intent.refresh_from_db()
    assert intent.status == Intent.Status.UNKNOWN
    assert not Evidence.objects.filter(intent=intent, kind=Evidence.Kind.RESOLUTION).exists()
    assert len(sandbox.ledger("email", reference="race-902")) == 1


@pytest.mark.parametrize("trial", range(6))
def test_i21_9_operator_absent_and_reconciler_released_together_never_lose_the_evidence(
    sandbox: Any, operator: Any, trial: int
) -> None:
    # given: an email that was sent, its answer lost
    reference = f"race-{910 + trial}"
    intent = unknown_email_that_was_sent(sandbox, 910 + trial)
    roles = iter(["reconciler", "operator"])
    lock = threading.Lock()
    results: dict[str, Any] = {}

    def one() -> None:
        with lock:
            role = next(roles)
        try:
            if role == "reconciler":
                results[role] = reconcile_intent(intent.id)
            else:
                results[role] = resolve_absent(
                    intent_id=intent.id, user=operator, reason="resend", accept_duplicate_risk=True
                ).status
        except (IntentMoved, ResolutionRefused) as exc:
            results[role] = type(exc).__name__

    # when: the reconciler's lookup and the operator's absent are released at the same instant
    run_together(one, n=2)
    run_what_is_due(intent)
    # then: a lookup that found the email always decides the outcome, and nothing is re-sent;
    # only when the operator moved the intent before any lookup began is it sent again (their
    # explicit, recorded risk), and then a duplicate check is scheduled to find the second one
    intent.refresh_from_db()
    found_on_record = Evidence.objects.filter(intent=intent, kind="lookup", result="found").exists()
    emails = sandbox.ledger("email", reference=reference)
    assert intent.status == Intent.Status.SUCCEEDED, results
    if found_on_record:
        (sent,) = emails
        assert Outcome.objects.get(intent=intent).provider_reference == sent["id"], results
    else:
        assert results == {"reconciler": "moved", "operator": "READY"}
        assert len(emails) == 2 and intent.next_duplicate_check_at is not None
