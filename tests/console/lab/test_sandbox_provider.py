"""The sandbox provider process over real HTTP and real PostgreSQL: idempotency, fences, faults,
withdrawal, email lag and reservation duplicates. Its ledger is the ground truth."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.support.processes import SandboxProvider

CHARGE = {"amount": 4990, "currency": "EUR", "customer": "cus_42", "reference": "order-1"}


def new_key() -> str:
    return f"key-{uuid.uuid4()}"


def post_charge(
    provider: SandboxProvider,
    key: str,
    body: dict[str, Any] | None = None,
    *,
    fence: int | None = None,
    timeout: float = 10.0,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    all_headers = {"Idempotency-Key": key, **(headers or {})}
    if fence is not None:
        all_headers["X-Fencing-Token"] = str(fence)
    return httpx.post(f"{provider.url}/v1/charges", json=body or CHARGE, headers=all_headers, timeout=timeout)


def wait_until(condition: Any, *, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


# --- payments: idempotency keys -------------------------------------------------------------


def test_key_replay_returns_identical_body_and_replayed_header(sandbox: SandboxProvider) -> None:
    # given
    key = new_key()
    first = post_charge(sandbox, key)

    # when
    replay = post_charge(sandbox, key)

    # then
    assert first.status_code == 200 and "Idempotent-Replayed" not in first.headers
    assert replay.status_code == 200
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.content == first.content
    assert [e["id"] for e in sandbox.ledger("payments")] == [first.json()["id"]]


def test_key_reused_with_other_parameters_is_422_and_applies_nothing(sandbox: SandboxProvider) -> None:
    # given
    key = new_key()
    post_charge(sandbox, key)

    # when
    response = post_charge(sandbox, key, {**CHARGE, "amount": 5000})

    # then
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "idempotency_key_reused"
    assert len(sandbox.ledger("payments")) == 1


def test_missing_idempotency_key_is_400_and_not_applied(sandbox: SandboxProvider) -> None:
    # when
    response = httpx.post(f"{sandbox.url}/v1/charges", json=CHARGE)

    # then
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "Idempotency-Key"
    assert sandbox.ledger() == []


def test_concurrent_identical_posts_apply_exactly_one_charge(sandbox: SandboxProvider) -> None:
    # given
    key, workers = new_key(), 16
    barrier = threading.Barrier(workers)

    def send(_: int) -> httpx.Response:
        barrier.wait()
        return post_charge(sandbox, key)

    # when
    with ThreadPoolExecutor(max_workers=workers) as pool:
        responses = list(pool.map(send, range(workers)))

    # then
    effects = sandbox.ledger("payments")
    assert len(effects) == 1
    successes = [r for r in responses if r.status_code == 200]
    assert successes and {r.json()["id"] for r in successes} == {effects[0]["id"]}
    others = [r for r in responses if r.status_code != 200]
    assert all(r.status_code == 409 and r.json()["error"]["code"] == "request_in_progress" for r in others)


def test_second_request_while_first_is_processing_is_409_in_progress(sandbox: SandboxProvider) -> None:
    # given: the first request holds the key while it sleeps before applying
    key = new_key()
    sandbox.inject("delay_after_effect", product="payments", delay_seconds=1.5)
    first: dict[str, httpx.Response] = {}
    thread = threading.Thread(target=lambda: first.update(r=post_charge(sandbox, key)))
    thread.start()
    assert wait_until(lambda: sandbox.request_count("payments") == 1)
    time.sleep(0.2)

    # when
    second = post_charge(sandbox, key)
    thread.join()

    # then
    assert second.status_code == 409
    assert second.json()["error"]["code"] == "request_in_progress"
    assert first["r"].status_code == 200
    assert len(sandbox.ledger("payments")) == 1


def test_declined_charge_is_402_and_stored_under_the_key(sandbox: SandboxProvider) -> None:
    # given
    key = new_key()
    declined = {**CHARGE, "customer": "cus_declined"}

    # when
    first = post_charge(sandbox, key, declined)
    replay = post_charge(sandbox, key, declined)

    # then
    assert first.status_code == 402 and first.json()["error"]["code"] == "card_declined"
    assert replay.status_code == 402 and replay.headers["Idempotent-Replayed"] == "true"
    assert sandbox.ledger() == []


# --- payments: fences ---------------------------------------------------------------------------


def test_stale_fence_is_refused_and_applies_nothing(sandbox: SandboxProvider) -> None:
    # given: fence 2 was seen for the key (it ended in a 500 before any effect)
    key = new_key()
    post_charge(sandbox, key, fence=2, headers={"X-Sandbox-Fault": "in_progress"})
    post_charge(sandbox, key, fence=2)

    # when
    stale = post_charge(sandbox, key, fence=1)

    # then
    assert stale.status_code == 409
    assert stale.json()["error"]["code"] == "stale_fence"
    assert [e["fence"] for e in sandbox.ledger("payments")] == [2]


def test_newer_fence_arriving_while_older_request_waits_stops_the_older_one(sandbox: SandboxProvider) -> None:
    # given: fence 1 claimed the key and sleeps before applying
    key = new_key()
    sandbox.inject("delay_after_effect", product="payments", delay_seconds=1.5)
    older: dict[str, httpx.Response] = {}
    thread = threading.Thread(target=lambda: older.update(r=post_charge(sandbox, key, fence=1)))
    thread.start()
    assert wait_until(lambda: sandbox.request_count("payments") == 1)
    time.sleep(0.2)

    # when: a successor with fence 2 shows up, then the older one wakes up
    newer = post_charge(sandbox, key, fence=2)
    thread.join()
    retry = post_charge(sandbox, key, fence=2)

    # then
    assert newer.json()["error"]["code"] == "request_in_progress"
    assert older["r"].status_code == 409 and older["r"].json()["error"]["code"] == "stale_fence"
    assert retry.status_code == 200
    assert [e["fence"] for e in sandbox.ledger("payments")] == [2]


# --- payments: refunds --------------------------------------------------------------------------


def test_refund_of_unknown_charge_is_404_and_above_amount_is_422(sandbox: SandboxProvider) -> None:
    # given
    charge = post_charge(sandbox, new_key()).json()
    refund = {"charge": charge["id"], "amount": 1000, "currency": "EUR"}

    # when
    unknown = httpx.post(
        f"{sandbox.url}/v1/refunds",
        json={**refund, "charge": "ch_nope"},
        headers={"Idempotency-Key": new_key()},
    )
    too_much = httpx.post(
        f"{sandbox.url}/v1/refunds",
        json={**refund, "amount": 999_999},
        headers={"Idempotency-Key": new_key()},
    )
    ok = httpx.post(f"{sandbox.url}/v1/refunds", json=refund, headers={"Idempotency-Key": new_key()})

    # then
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "resource_missing"
    assert too_much.status_code == 422 and too_much.json()["error"]["code"] == "amount_too_large"
    assert ok.status_code == 200 and ok.json()["charge"] == charge["id"]
    kinds = [(e["kind"], e["amount"]) for e in sandbox.ledger("payments")]
    assert kinds == [("charge", 4990), ("refund", 1000)]


# --- faults -------------------------------------------------------------------------------------


def test_crash_before_effect_drops_the_connection_and_applies_nothing(sandbox: SandboxProvider) -> None:
    # given
    key = new_key()
    sandbox.inject("crash_before_effect", product="payments")

    # when
    with pytest.raises(httpx.RemoteProtocolError):
        post_charge(sandbox, key)
    retry = post_charge(sandbox, key)

    # then: nothing was stored under the key, so the retry applies once
    assert retry.status_code == 200 and "Idempotent-Replayed" not in retry.headers
    assert len(sandbox.ledger("payments")) == 1


def test_crash_after_effect_applies_then_drops_the_connection(sandbox: SandboxProvider) -> None:
    # given
    key = new_key()
    sandbox.inject("crash_after_effect", product="payments")

    # when
    with pytest.raises(httpx.RemoteProtocolError):
        post_charge(sandbox, key)
    effects_after_crash = sandbox.ledger("payments")
    retry = post_charge(sandbox, key)

    # then
    assert len(effects_after_crash) == 1
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert retry.json()["id"] == effects_after_crash[0]["id"]
    assert len(sandbox.ledger("payments")) == 1


def test_delay_after_effect_applies_after_the_client_timed_out(sandbox: SandboxProvider) -> None:
    # given
    sandbox.inject("delay_after_effect", product="payments", delay_seconds=1.0)

    # when
    with pytest.raises(httpx.ReadTimeout):
        post_charge(sandbox, new_key(), timeout=0.3)
    right_after = sandbox.ledger("payments")

    # then
    assert right_after == []
    assert wait_until(lambda: len(sandbox.ledger("payments")) == 1, timeout=5)


def test_error_500_before_effect_applies_nothing(sandbox: SandboxProvider) -> None:
    # given
    key = new_key()
    sandbox.inject("error_500_before_effect", product="payments")

    # when
    response = post_charge(sandbox, key)

    # then
    assert response.status_code == 500
    assert sandbox.ledger() == []
    assert post_charge(sandbox, key).headers.get("Idempotent-Replayed") is None


def test_error_500_after_effect_applies_and_a_retry_replays(sandbox: SandboxProvider) -> None:
    # given
    key = new_key()
    sandbox.inject("error_500_after_effect", product="payments")

    # when
    response = post_charge(sandbox, key)
    retry = post_charge(sandbox, key)

    # then
    assert response.status_code == 500
    assert retry.status_code == 200 and retry.headers["Idempotent-Replayed"] == "true"
    assert len(sandbox.ledger("payments")) == 1


def test_in_progress_fault_answers_409_and_applies_nothing(sandbox: SandboxProvider) -> None:
    # given
    sandbox.inject("in_progress", product="payments")

    # when
    response = post_charge(sandbox, new_key())

    # then
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "request_in_progress"
    assert sandbox.ledger() == []


@pytest.mark.parametrize(("mode", "applied"), [("hold_before_effect", 0), ("hold_after_effect", 1)])
def test_hold_keeps_the_connection_open_without_answering(
    sandbox: SandboxProvider, mode: str, applied: int
) -> None:
    # given
    sandbox.inject(mode, product="email", delay_seconds=1.0)
    started = time.monotonic()

    # when
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{sandbox.url}/v1/emails", json={"to": "a@b.c", "subject": "s", "body": "b"}, timeout=0.5)
    waited = time.monotonic() - started
    time.sleep(0.8)

    # then: the client gave up while the provider held the connection; the effect is as said
    assert waited >= 0.5
    assert len(sandbox.ledger("email")) == applied


def test_i35_hold_answer_holds_a_replay_then_answers_it(sandbox: SandboxProvider) -> None:
    # given: a charge applied under a key, and a hold_answer fault for the next request
    key = new_key()
    first = post_charge(sandbox, key, fence=1)
    sandbox.inject("hold_answer", product="payments", delay_seconds=1.0)
    started = time.monotonic()

    # when: the same key is sent again with a higher fence
    again = post_charge(sandbox, key, fence=2)
    waited = time.monotonic() - started

    # then: the replay was answered, after the hold; still one charge
    assert again.status_code == first.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert waited >= 1.0
    assert len(sandbox.ledger("payments")) == 1


def test_fault_matches_product_reference_and_times(sandbox: SandboxProvider) -> None:
    # given
    sandbox.inject("error_500_before_effect", product="reservations", times=2, reference="trip-9")
    body = {"resource": "room-1", "start": "2026-01-01T10:00:00Z", "seats": 2}

    # when
    other = httpx.post(f"{sandbox.url}/v1/reservations", json={**body, "reference": "trip-1"})
    hits = [
        httpx.post(f"{sandbox.url}/v1/reservations", json={**body, "reference": "trip-9"}) for _ in range(3)
    ]

    # then
    assert other.status_code == 200
    assert [r.status_code for r in hits] == [500, 500, 200]
    assert [e["reference"] for e in sandbox.ledger("reservations")] == ["trip-1", "trip-9"]


def test_fault_header_applies_to_its_own_request_only(sandbox: SandboxProvider) -> None:
    # when
    with pytest.raises(httpx.RemoteProtocolError):
        post_charge(sandbox, new_key(), headers={"X-Sandbox-Fault": "crash_after_effect"})
    plain = post_charge(sandbox, new_key())

    # then
    assert plain.status_code == 200
    assert len(sandbox.ledger("payments")) == 2


def test_cleared_faults_no_longer_apply(sandbox: SandboxProvider) -> None:
    # given
    sandbox.inject("error_500_before_effect", times=5)

    # when
    sandbox.clear_faults()
    response = post_charge(sandbox, new_key())

    # then
    assert response.status_code == 200


# --- withdrawal, email lag, reservations -----------------------------------------------------


def test_withdrawn_items_are_hidden_from_lists_and_gone_on_get(sandbox: SandboxProvider) -> None:
    # given
    key = new_key()
    charge = post_charge(sandbox, key).json()
    reservation = httpx.post(
        f"{sandbox.url}/v1/reservations",
        json={"resource": "room-1", "start": "2026-01-01T10:00:00Z", "seats": 1, "reference": "r-w"},
    ).json()

    # when
    sandbox.withdraw("payments", charge["id"])
    sandbox.withdraw("reservations", reservation["id"])

    # then
    assert httpx.get(f"{sandbox.url}/v1/charges/{charge['id']}").status_code == 410
    listed = httpx.get(f"{sandbox.url}/v1/charges", params={"idempotency_key": key}).json()
    assert listed["data"] == [] and listed["idempotency_key"]["state"] == "done"
    assert httpx.get(f"{sandbox.url}/v1/reservations", params={"reference": "r-w"}).json()["data"] == []
    assert httpx.get(f"{sandbox.url}/v1/reservations/{reservation['id']}").status_code == 410
    assert {e["status"] for e in sandbox.ledger()} == {"withdrawn"}


def test_email_lookup_lags_behind_sending(sandbox: SandboxProvider) -> None:
    # given
    sandbox.configure(email_lookup_lag_seconds=1.0)
    message_id = f"<{uuid.uuid4()}@effect-ledger.local>"

    # when
    sent = httpx.post(
        f"{sandbox.url}/v1/emails",
        json={"to": "ana@example.com", "subject": "Hi", "body": "..."},
        headers={"Message-ID": message_id},
    )

    def listed() -> list[dict[str, Any]]:
        return httpx.get(f"{sandbox.url}/v1/emails", params={"message_id": message_id}).json()["data"]

    # then
    assert sent.status_code == 200
    assert listed() == []
    assert httpx.get(f"{sandbox.url}/v1/emails/{sent.json()['id']}").status_code == 200
    assert wait_until(lambda: [e["id"] for e in listed()] == [sent.json()["id"]], timeout=5)


def test_email_has_no_key_support_so_a_repeat_sends_twice(sandbox: SandboxProvider) -> None:
    # given
    message_id = f"<{uuid.uuid4()}@effect-ledger.local>"
    email = {"to": "ana@example.com", "subject": "Hi", "body": "..."}

    # when
    for _ in range(2):
        httpx.post(f"{sandbox.url}/v1/emails", json=email, headers={"Message-ID": message_id})

    # then
    effects = sandbox.ledger("email")
    assert [e["message_id"] for e in effects] == [message_id, message_id]
    assert len({e["id"] for e in effects}) == 2


def test_email_lookup_answers_410_when_every_match_was_withdrawn(sandbox: SandboxProvider) -> None:
    # given
    message_id = f"<{uuid.uuid4()}@effect-ledger.local>"
    sent = httpx.post(
        f"{sandbox.url}/v1/emails",
        json={"to": "a@b.c", "subject": "s", "body": "b"},
        headers={"Message-ID": message_id},
    ).json()

    # when
    sandbox.withdraw("email", sent["id"])

    # then
    assert httpx.get(f"{sandbox.url}/v1/emails", params={"message_id": message_id}).status_code == 410
    assert httpx.get(f"{sandbox.url}/v1/emails/{sent['id']}").status_code == 410


def test_reservations_repeat_creates_duplicates_and_cancel_is_idempotent(sandbox: SandboxProvider) -> None:
    # given
    body = {"resource": "room-1", "start": "2026-01-01T10:00:00Z", "seats": 2, "reference": "trip-7"}

    # when
    first = httpx.post(f"{sandbox.url}/v1/reservations", json=body).json()
    second = httpx.post(f"{sandbox.url}/v1/reservations", json=body).json()
    cancel = httpx.post(f"{sandbox.url}/v1/reservations/{second['id']}/cancel")
    cancel_again = httpx.post(f"{sandbox.url}/v1/reservations/{second['id']}/cancel")
    listed = httpx.get(f"{sandbox.url}/v1/reservations", params={"reference": "trip-7"}).json()["data"]

    # then
    assert first["id"] != second["id"]
    assert cancel.json()["status"] == "cancelled" and cancel_again.json() == cancel.json()
    assert [(r["id"], r["status"]) for r in listed] == [
        (first["id"], "confirmed"),
        (second["id"], "cancelled"),
    ]
    assert [e["status"] for e in sandbox.ledger("reservations")] == ["confirmed", "cancelled"]
    assert httpx.post(f"{sandbox.url}/v1/reservations/rsv_nope/cancel").status_code == 404


# --- robustness and control plane --------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "content", "code"),
    [
        ("/v1/charges", b"{not json", "invalid_json"),
        ("/v1/charges", b"[1, 2]", "invalid_json"),
        ("/v1/charges", b'{"amount": "12", "currency": "EUR", "customer": "c"}', "invalid_request"),
        ("/v1/charges", b'{"amount": true, "currency": "EUR", "customer": "c"}', "invalid_request"),
        ("/v1/charges", b'{"amount": 1.5, "currency": "EUR", "customer": "c"}', "invalid_request"),
        ("/v1/emails", b'{"to": 5, "subject": "s", "body": "b"}', "invalid_request"),
        (
            "/v1/reservations",
            b'{"resource": "r", "start": "s", "seats": 0, "reference": "x"}',
            "invalid_request",
        ),
        ("/_sandbox/faults", b'{"mode": "explode"}', "invalid_request"),
    ],
)
def test_malformed_requests_get_400_and_apply_nothing(
    sandbox: SandboxProvider, path: str, content: bytes, code: str
) -> None:
    # when
    response = httpx.post(f"{sandbox.url}{path}", content=content, headers={"Idempotency-Key": new_key()})

    # then
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code
    assert sandbox.ledger() == []


def test_server_stays_up_under_concurrent_garbage_and_valid_traffic(sandbox: SandboxProvider) -> None:
    # given
    def hit(i: int) -> int:
        if i % 3 == 0:
            return httpx.post(f"{sandbox.url}/v1/charges", content=b"\x00\xff{", timeout=10).status_code
        if i % 3 == 1:
            return httpx.get(f"{sandbox.url}/v1/nothing/here", timeout=10).status_code
        return post_charge(sandbox, f"k-{i}").status_code

    # when
    with ThreadPoolExecutor(max_workers=24) as pool:
        statuses = list(pool.map(hit, range(60)))

    # then
    assert set(statuses) == {200, 400, 404}
    assert httpx.get(f"{sandbox.url}/healthz").json() == {"status": "ok"}
    assert len(sandbox.ledger("payments")) == 20


def test_reset_forgets_effects_keys_and_faults(sandbox: SandboxProvider) -> None:
    # given
    key = new_key()
    post_charge(sandbox, key)
    sandbox.inject("error_500_before_effect", times=3)

    # when
    sandbox.reset()
    again = post_charge(sandbox, key)

    # then
    assert again.status_code == 200 and "Idempotent-Replayed" not in again.headers
    assert len(sandbox.ledger()) == 1
    assert sandbox.request_count() == 1


@pytest.mark.parametrize("match", [{"ref": "x"}, [], "", 0, {"reference": 5}])
def test_a_malformed_match_is_refused_not_applied_to_everything(sandbox: SandboxProvider, match: Any) -> None:
    # when
    response = sandbox.client.post(
        "/_sandbox/faults", json={"product": "payments", "mode": "in_progress", "match": match}
    )
    # then
    assert response.status_code == 400
    assert sandbox.client.get("/_sandbox/faults").json()["faults"] == []


# --- where the provider keeps its data (issue 22) ----------------------------------------------


def test_i22_the_default_sandbox_database_is_not_the_ledgers(db: None, settings: Any) -> None:
    # given: no SANDBOX_DATABASE_URL, the ledger on the test database
    from django.db import connection

    from console.lab.management.commands.sandbox_provider import provider_dsn
    from console.lab.sandbox_provider.database import database_name, default_dsn

    settings.SANDBOX_DATABASE_URL = ""
    ledger = str(connection.settings_dict["NAME"])

    # when
    default = database_name(default_dsn(connection.settings_dict))

    # then: a database of its own beside the ledger's, per test run; an explicit one wins
    assert default == f"{ledger}_sandbox" and default != ledger
    assert database_name(provider_dsn(None)) == default
    settings.SANDBOX_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/elsewhere"
    assert database_name(provider_dsn(None)) == "elsewhere"
    assert database_name(provider_dsn("dbname=given")) == "given"


def test_i22_a_restore_of_the_ledger_database_leaves_the_providers_effects(sandbox: SandboxProvider) -> None:
    # given: a charge applied at the provider
    from django.db import connection

    assert post_charge(sandbox, new_key()).status_code == 200

    # when: the ledger's database loses everything a restore --clean would replace (there is no
    # sandbox schema in it to lose: the provider's tables live in the sandbox database)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'sandbox'")
        sandbox_tables_in_the_ledger = cursor.fetchone()[0]
        cursor.execute("DROP SCHEMA IF EXISTS sandbox CASCADE")

    # then: the provider still holds the effect
    assert sandbox_tables_in_the_ledger == 0
    assert [e["reference"] for e in sandbox.ledger("payments")] == ["order-1"]
