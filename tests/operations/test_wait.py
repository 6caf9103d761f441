"""Waiting without polling (issue 15, part 2): ``GET /api/v1/intents/{id}?wait=SECONDS`` answers
as soon as the intent's status changes (PostgreSQL LISTEN/NOTIFY, migration 0028 and
``operations.api.waiting``), or when the seconds run out.

Real PostgreSQL, committed transactions (``transaction=True``): a notification is delivered only
when the transaction that sent it commits. Timings are asserted with wide margins: the machine
running the suite is busy."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from operations.api import waiting
from operations.models import Intent, IntentWaiter
from operations.services import intent_cancel
from tests.factories import make_agent, submit

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/api/v1/intents"


def client_for(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@pytest.fixture
def api() -> APIClient:
    _, token = make_agent()
    return client_for(token)


@pytest.fixture
def later() -> Iterator[Callable[[float, Callable[[], Any]], None]]:
    """``later(seconds, work)``: run ``work`` in another thread (its own Django connection,
    closed after) ``seconds`` from now; the threads are joined and their errors raised at the end."""
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []

    def run(seconds: float, work: Callable[[], Any]) -> None:
        def body() -> None:
            try:
                time.sleep(seconds)
                work()
            except BaseException as exc:  # re-raised in the test's thread
                errors.append(exc)
            finally:
                connection.close()

        thread = threading.Thread(target=body, daemon=True)
        threads.append(thread)
        thread.start()

    yield run
    for thread in threads:
        thread.join(30)
    if errors:
        raise errors[0]


def timed_get(client: APIClient, url: str, query: dict[str, str]) -> tuple[Any, float]:
    started = time.monotonic()
    response = client.get(url, query)
    return response, time.monotonic() - started


def cancel(intent: Intent) -> Callable[[], Any]:
    return lambda: intent_cancel(intent_id=intent.id, actor="agent:agent-1", reason="changed my mind")


def test_a_wait_returns_as_soon_as_another_thread_changes_the_status(
    api: APIClient, status_listener: waiting.StatusListener, later: Any
) -> None:
    # given: an intent that has not started, and its cancel through the service in 1 s
    intent = submit()
    before = intent.status
    later(1.0, cancel(intent))
    # when
    response, elapsed = timed_get(api, f"{URL}/{intent.id}", {"wait": "20"})
    # then: answered well before the 20 s with the new status
    assert response.status_code == 200, response.content
    assert elapsed < 10, elapsed
    assert response["Effect-Ledger-Wait"] == "changed"
    assert response.json()["status"] == "CANCELLED" != before


def test_a_waiting_request_holds_no_database_connection(
    api: APIClient, status_listener: waiting.StatusListener, later: Any
) -> None:
    # given: the backend of this thread's Django connection (the one the request will use)
    intent = submit()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (request_backend,) = cursor.fetchone()
    seen: dict[str, Any] = {}

    def look() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid, state FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            seen["backends"] = dict(cursor.fetchall())
        intent_cancel(intent_id=intent.id, actor="agent:agent-1")

    later(1.5, look)
    # when
    response, _ = timed_get(api, f"{URL}/{intent.id}", {"wait": "20"})
    # then: while it waited, the request's backend was gone and nothing was in a transaction
    assert response["Effect-Ledger-Wait"] == "changed"
    assert request_backend not in seen["backends"]
    assert not [
        state for state in seen["backends"].values() if (state or "").startswith("idle in transaction")
    ]
    assert status_listener.backend_pid in seen["backends"]


def test_a_wait_times_out_with_the_unchanged_intent(
    api: APIClient, status_listener: waiting.StatusListener
) -> None:
    # given
    intent = submit()
    # when
    response, elapsed = timed_get(api, f"{URL}/{intent.id}", {"wait": "1.5"})
    # then: after the wait, not before; the intent as it was
    assert response.status_code == 200
    assert 1.4 <= elapsed < 15, elapsed
    assert response["Effect-Ledger-Wait"] == "timeout"
    assert response.json()["status"] == intent.status


def test_a_terminal_intent_answers_at_once(api: APIClient, status_listener: waiting.StatusListener) -> None:
    # given: a cancelled intent (terminal: it will not change)
    intent = submit()
    intent_cancel(intent_id=intent.id, actor="agent:agent-1")
    # when
    response, elapsed = timed_get(api, f"{URL}/{intent.id}", {"wait": "20"})
    # then
    assert response.status_code == 200
    assert elapsed < 10, elapsed
    assert (response.json()["status"], response["Effect-Ledger-Wait"]) == ("CANCELLED", "timeout")


def test_a_succeeded_intent_answers_at_once(api: APIClient, status_listener: waiting.StatusListener) -> None:
    # given: an intent that SUCCEEDED (only a person's compensation can move it again)
    intent = submit()
    Intent.objects.filter(id=intent.id).update(status=Intent.Status.SUCCEEDED)
    # when
    response, elapsed = timed_get(api, f"{URL}/{intent.id}", {"wait": "20"})
    # then: no web thread held for 20 s
    assert response.status_code == 200
    assert elapsed < 10, elapsed
    assert (response.json()["status"], response["Effect-Ledger-Wait"]) == ("SUCCEEDED", "timeout")


def test_waits_beyond_the_slots_are_answered_at_once_as_busy(
    api: APIClient, status_listener: waiting.StatusListener, later: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: a process with one wait slot, taken by a request waiting 4 s on another intent
    monkeypatch.setattr(waiting, "_slots", threading.BoundedSemaphore(1))
    first, second = submit(), submit(reference="order-2")
    holder: list[Any] = []
    later(0.0, lambda: holder.append(timed_get(api, f"{URL}/{first.id}", {"wait": "4"})))
    wait_until(lambda: status_listener.waiting() == 1)
    # when: a second wait arrives
    response, elapsed = timed_get(api, f"{URL}/{second.id}", {"wait": "20"})
    # then: answered at once, unchanged, and said so; the first wait was not disturbed
    assert response.status_code == 200
    assert elapsed < 3, elapsed
    assert (response.json()["status"], response["Effect-Ledger-Wait"]) == ("READY", "busy")
    wait_until(lambda: bool(holder))
    assert holder[0][0]["Effect-Ledger-Wait"] == "timeout"
    # and: with the slot free again, a wait waits
    response, elapsed = timed_get(api, f"{URL}/{second.id}", {"wait": "1"})
    assert (response["Effect-Ledger-Wait"], elapsed >= 0.9) == ("timeout", True)


def test_status_names_the_status_to_wait_out(
    api: APIClient, status_listener: waiting.StatusListener, later: Any
) -> None:
    # given: an intent whose status is not the one named
    intent = submit()
    other = next(s for s in ("AWAITING_APPROVAL", "READY") if s != intent.status)
    # when: waiting while it is in another status
    response, elapsed = timed_get(api, f"{URL}/{intent.id}", {"wait": "20", "status": other})
    # then: it already differs: at once, changed
    assert elapsed < 10, elapsed
    assert (response.json()["status"], response["Effect-Ledger-Wait"]) == (intent.status, "changed")
    # when: waiting while it is in its own status, named explicitly, and a cancel comes in 1 s
    later(1.0, cancel(intent))
    response, elapsed = timed_get(api, f"{URL}/{intent.id}", {"wait": "20", "status": intent.status})
    # then
    assert elapsed < 10, elapsed
    assert (response.json()["status"], response["Effect-Ledger-Wait"]) == ("CANCELLED", "changed")


def test_without_wait_the_endpoint_answers_as_before(api: APIClient) -> None:
    # given
    intent = submit()
    # when: status alone (and an unknown one) changes nothing
    plain = api.get(f"{URL}/{intent.id}")
    with_status = api.get(f"{URL}/{intent.id}", {"status": "NOT-A-STATUS"})
    # then
    for response in (plain, with_status):
        assert response.status_code == 200
        assert "Effect-Ledger-Wait" not in response
    assert plain.json() == with_status.json()


@pytest.mark.parametrize(
    "wait", ["0", "-1", "30.01", "31", "abc", "", "nan", "NaN", "inf", "-inf", "1e400", "0x10"]
)
def test_a_wait_outside_its_bound_is_refused(api: APIClient, wait: str) -> None:
    # given
    intent = submit()
    # when
    response, elapsed = timed_get(api, f"{URL}/{intent.id}", {"wait": wait})
    # then: a 400 problem naming the bound, at once
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "wait-invalid"
    assert "0 < wait <= 30" in response.json()["detail"]
    assert elapsed < 10
    assert Intent.objects.get(id=intent.id).status == intent.status


@pytest.mark.parametrize("status", ["NOT-A-STATUS", "ready", ""])
def test_an_unknown_status_to_wait_on_is_refused(api: APIClient, status: str) -> None:
    # given
    intent = submit()
    # when
    response = api.get(f"{URL}/{intent.id}", {"wait": "5", "status": status})
    # then
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert "status must be one of" in response.json()["detail"]


def test_another_agents_intent_is_404_without_waiting(status_listener: waiting.StatusListener) -> None:
    # given: an agent limited to its own intents, and another agent's intent
    _, mine = make_agent("second", scope="own")
    theirs = submit(principal="agent:agent-1")
    own_scope = client_for(mine)
    # when: it waits on the other agent's intent, and on one that does not exist
    other, other_elapsed = timed_get(own_scope, f"{URL}/{theirs.id}", {"wait": "20"})
    missing, missing_elapsed = timed_get(own_scope, f"{URL}/{uuid.uuid4()}", {"wait": "20"})
    # then: both the same 404, at once (nothing to learn from the answer or its timing)
    assert (other.status_code, missing.status_code) == (404, 404)
    assert other_elapsed < 10 and missing_elapsed < 10
    assert status_listener.waiting() == 0
    assert other.json()["title"] == missing.json()["title"]


def test_a_wait_survives_the_listeners_connection_being_killed(
    api: APIClient, status_listener: waiting.StatusListener, later: Any
) -> None:
    # given: the listener connected, and an intent
    wait_until(lambda: status_listener.listening)
    killed = status_listener.backend_pid
    intent = submit()

    def kill_then_cancel() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [killed])
        time.sleep(0.5)
        intent_cancel(intent_id=intent.id, actor="agent:agent-1")

    later(1.0, kill_then_cancel)
    # when
    response, elapsed = timed_get(api, f"{URL}/{intent.id}", {"wait": "25"})
    # then: the change still arrived, well before the wait ran out
    assert elapsed < 12, elapsed
    assert (response.json()["status"], response["Effect-Ledger-Wait"]) == ("CANCELLED", "changed")
    # and the listener reconnected on a new backend
    wait_until(lambda: status_listener.listening and status_listener.backend_pid not in (None, killed))


def test_without_a_listener_connection_waiters_reread_every_second(later: Any) -> None:
    # given: a listener that can never connect (the database refuses it)
    def refuse() -> psycopg.Connection[Any]:
        raise psycopg.OperationalError("connection refused")

    listener = waiting.StatusListener(connect=refuse)
    listener.start()
    intent = submit()
    later(1.0, cancel(intent))
    try:
        # when
        started = time.monotonic()
        changed = waiting.wait_for_status_change(
            intent_id=intent.id, status=intent.status, seconds=20, listener=listener
        )
        elapsed = time.monotonic() - started
    finally:
        listener.stop()
    # then: the fallback re-read found the change
    assert not listener.listening
    assert changed and elapsed < 10, elapsed


def test_the_trigger_notifies_only_a_real_status_change_of_an_awaited_intent() -> None:
    # given: a listening connection of its own, and a request waiting for the intent (its row)
    intent, unawaited = submit(), submit()
    IntentWaiter.objects.create(intent_id=intent.id, expires_at=timezone.now() + timedelta(seconds=30))
    params = waiting.listener_connection_params()
    with psycopg.connect(**params, autocommit=True) as listening:
        listening.execute(f"LISTEN {waiting.CHANNEL}")
        # when: an update that leaves the status alone, one that changes it, and a change of an
        # intent nobody waits for
        Intent.objects.filter(id=intent.id).update(status=intent.status)
        intent_cancel(intent_id=intent.id, actor="agent:agent-1")
        intent_cancel(intent_id=unawaited.id, actor="agent:agent-1")
        # then: one notification, carrying the awaited intent's id
        payloads = [n.payload for n in listening.notifies(timeout=2.0)]
    assert payloads == [str(intent.id)]


def test_a_wait_registers_its_intent_for_its_length_and_sweeps_a_dead_processs_rows(
    api: APIClient, status_listener: waiting.StatusListener
) -> None:
    # given: a waiter row left by a process that died while waiting, long expired
    intent = submit()
    stale = IntentWaiter.objects.create(
        intent_id=uuid.uuid4(), expires_at=timezone.now() - timedelta(hours=1)
    )
    seen: list[list[uuid.UUID]] = []
    # when: a wait of one second, while another thread looks at the waiter rows
    watcher = threading.Timer(
        0.5, lambda: seen.append(list(IntentWaiter.objects.values_list("intent_id", flat=True)))
    )
    watcher.start()
    response, _ = timed_get(api, f"/api/v1/intents/{intent.id}", {"wait": "1"})
    watcher.join()
    # then: the intent was registered during the wait; afterwards its row and the stale one are gone
    assert response.status_code == 200
    assert intent.id in seen[0]
    assert not IntentWaiter.objects.filter(id=stale.id).exists()
    assert not IntentWaiter.objects.filter(intent_id=intent.id).exists()


def test_a_change_committing_while_the_wait_registers_is_not_missed(
    api: APIClient, status_listener: waiting.StatusListener
) -> None:
    # given: a writer that has changed the status (its trigger ran while nobody waited) and
    # commits only 1.5 s later
    intent = submit()
    params = waiting.listener_connection_params()
    writer = psycopg.connect(**params)
    writer.execute("UPDATE operations_intent SET status = 'CANCELLED' WHERE id = %s", (intent.id,))
    committer = threading.Timer(1.5, writer.commit)
    committer.start()
    try:
        # when: a wait registers meanwhile
        response, elapsed = timed_get(api, f"/api/v1/intents/{intent.id}", {"wait": "10", "status": "READY"})
    finally:
        committer.join()
        writer.close()
    # then: its registering read waited for the commit and saw the change, with no notification
    # and no time-out (a plain read would have seen READY and slept the 10 s)
    assert response.status_code == 200
    assert response.json()["status"] == "CANCELLED"
    assert response["Effect-Ledger-Wait"] == "changed"
    assert elapsed < 6, elapsed


def wait_until(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_the_migration_adds_the_trigger_and_its_reverse_drops_it() -> None:
    def triggers() -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = 'operations_intent'::regclass AND tgname = %s",
                ["intent_status_notify"],
            )
            return [row[0] for row in cursor.fetchall()]

    # given: migrated
    assert triggers() == ["intent_status_notify"]
    try:
        # when: migrated back before 0028
        call_command("migrate", "operations", "0027", verbosity=0)
        # then
        assert triggers() == []
    finally:
        # every app: going back unapplied the migrations of other apps that depend on a later
        # operations migration (reconciliation's provider evidence), and they must come back too
        call_command("migrate", verbosity=0)
    assert triggers() == ["intent_status_notify"]


@pytest.mark.django_db(transaction=True)
def test_i35_a_listener_that_does_not_hear_the_database_is_not_used_and_waits_poll(
    later: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # given: a listener whose connection hears nothing the database sends (as one on another
    # database, or behind a pooler, would): its probe notification goes nowhere
    listener = waiting.StatusListener(probe=lambda payload: None)
    intent = submit()
    later(1.0, cancel(intent))
    with caplog.at_level("WARNING", logger="operations.api.waiting"):
        listener.start()
        try:
            # when
            started = time.monotonic()
            changed = waiting.wait_for_status_change(
                intent_id=intent.id, status=intent.status, seconds=20, listener=listener
            )
            elapsed = time.monotonic() - started
            wait_until(lambda: "did not arrive" in caplog.text, 15)
        finally:
            listener.stop()
    # then: it was never trusted, the once-a-second re-read found the change, and the warning
    # names the variables to fix
    assert not listener.listening
    assert changed and elapsed < 5, elapsed
    assert "DATABASE_LISTEN_URL" in caplog.text and "DATABASE_URL" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_i35_a_direct_listener_proves_itself_with_its_probe(status_listener: waiting.StatusListener) -> None:
    wait_until(lambda: status_listener.listening, 15)
    assert status_listener.backend_pid is not None
