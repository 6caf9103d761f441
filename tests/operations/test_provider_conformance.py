"""The provider conformance suite: the real engine (``execute_intent`` in-process) against a fake
provider on a loopback port that answers the way real providers, proxies and gateways do
(``tests/support/fake_provider.py``). Each cell asserts the intent's end state, how many requests
the provider saw (all with the same key) and how many effects it applied.

The table is run against the generic adapter and, where a cell applies, the sandbox adapters,
which share the classifier (``operations/adapters/http_classifier.py``). ``test_i21_<n>_*``
are issue 21's items 1-5.
"""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import pytest
from django.db.models.functions import Now

from operations.engine.protocol import execute_intent
from operations.exceptions import ResolutionRefused
from operations.models import Attempt, Intent, OutboxMessage, Outcome
from reconciliation.resolution import resolve_absent
from tests.factories import UserFactory, charge_arguments, submit
from tests.support.fake_provider import Answer, FakeProvider

pytestmark = pytest.mark.django_db

DEADLINE = 1.0  # seconds: the engine's provider deadline in these tests
BUDGET = 5  # the default policy's retry.max_attempts
TRANSFER = {"amount": 1200, "currency": "EUR", "url": "http://127.0.0.1:9/not-the-configured-url"}
EMAIL = {"to": "ada@example.test", "subject": "Your receipt", "body": "Thanks"}
MIB = 1024 * 1024


@pytest.fixture
def provider(fake_provider: FakeProvider, settings: Any) -> FakeProvider:
    """``acme.transfer`` on the generic adapter and the sandbox adapters, all pointed at the
    fake provider, with a 1 s provider deadline."""
    settings.EFFECT_LEDGER_GENERIC_HTTP = {"acme.transfer": {"url": f"{fake_provider.url}/v1/transfers"}}
    settings.SANDBOX_PROVIDER_URL = fake_provider.url
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "PROVIDER_TIMEOUT_SECONDS": DEADLINE}
    return fake_provider


def make_due(intent: Intent) -> None:
    """Skip the retry's wait (test setup): the next claim may run now."""
    Intent.objects.filter(id=intent.id).update(not_before=Now())


def run_to_rest(intent: Intent, provider: FakeProvider) -> list[str]:
    """Run deliveries until the intent leaves READY (at most the budget and one more), letting
    the provider finish what it is doing before each retry."""
    labels = []
    for _ in range(BUDGET + 1):
        labels.append(execute_intent(intent.id))
        intent.refresh_from_db()
        if intent.status != Intent.Status.READY:
            break
        provider.wait_idle()
        make_due(intent)
    return labels


def last_code(intent: Intent) -> str:
    attempt = Attempt.objects.filter(intent=intent).order_by("-attempt_no").first()
    assert attempt is not None
    return str(attempt.detail.get("code", ""))


def seconds_until_due(intent: Intent) -> float:
    """Seconds from the database's now to the intent's ``not_before`` (and its outbox row's)."""
    row = Intent.objects.filter(id=intent.id).annotate(now=Now()).values("not_before", "now").get()
    due = OutboxMessage.objects.filter(intent_id=intent.id, acked_at__isnull=True).order_by("-due_at").first()
    assert due is not None and abs((due.due_at - row["not_before"]).total_seconds()) < 0.01
    return float((row["not_before"] - row["now"]).total_seconds())


HUGE = 50 * MIB

# cell: (script, end state, requests the provider saw, effects it applied, last attempt's code)
CELLS: dict[str, tuple[list[Answer], str, int, int, str]] = {
    "ok": ([Answer("ok")], "SUCCEEDED", 1, 1, ""),
    "slow first request, then a replay": ([Answer("ok", seconds=2.0)], "SUCCEEDED", 2, 1, ""),
    # "In progress" is waited out without spending the budget (issue 38, item 4): still READY
    # after more requests than the budget; past retry.in_progress_patience_seconds it goes
    # UNKNOWN (tests/operations/test_in_progress.py).
    "409 problem without code, every time": (
        [Answer("problem", status=409)],
        "READY",
        BUDGET + 1,
        0,
        "request_in_progress",
    ),
    "409 unknown code, every time": (
        [Answer("coded", 409, code="conflict")],
        "UNKNOWN",
        BUDGET,
        0,
        "conflict",
    ),
    "409 stale_fence (a newer attempt exists: no same-key retry)": (
        [Answer("coded", 409, code="stale_fence")],
        "UNKNOWN",
        1,
        0,
        "stale_fence",
    ),
    "200 HTML, every time": ([Answer("html")], "UNKNOWN", BUDGET, 0, "unreadable_success"),
    "429 Retry-After seconds, then ok": (
        [Answer("retry_after", 429, retry_after="1"), Answer("ok")],
        "SUCCEEDED",
        2,
        1,
        "",
    ),
    "503 Retry-After HTTP-date, then ok": (
        [Answer("retry_after", 503, retry_after="date+1"), Answer("ok")],
        "SUCCEEDED",
        2,
        1,
        "",
    ),
    "429 every time": ([Answer("retry_after", 429, retry_after="0")], "FAILED", BUDGET, 0, "http_429"),
    "trickle, then a replay": ([Answer("trickle", seconds=1.0, size=8), Answer("ok")], "SUCCEEDED", 2, 1, ""),
    "50 MB body, then a replay": ([Answer("huge", size=HUGE), Answer("ok")], "SUCCEEDED", 2, 1, ""),
    "502 after the effect, then a replay": (
        [Answer("after_effect", 502), Answer("ok")],
        "SUCCEEDED",
        2,
        1,
        "",
    ),
    "504 every time": ([Answer("gateway", 504)], "UNKNOWN", BUDGET, 0, "http_504"),
    "redirect, every time (not followed)": (
        [Answer("redirect")],
        "UNKNOWN",
        BUDGET,
        0,
        "redirect_not_followed",
    ),
    "200 without an id": ([Answer("no_id")], "SUCCEEDED", 1, 1, ""),
    "422 key reused": ([Answer("problem", status=422)], "FAILED", 1, 0, "idempotency_key_reused"),
    "400 key missing": ([Answer("problem", status=400)], "FAILED", 1, 0, "idempotency_key_missing"),
    "dropped connection after the effect, then a replay": (
        [Answer("drop"), Answer("ok")],
        "SUCCEEDED",
        2,
        1,
        "",
    ),
}


@pytest.mark.parametrize("cell", list(CELLS))
def test_generic_adapter_conformance(provider: FakeProvider, cell: str) -> None:
    # given
    script, end_state, requests, applied, code = CELLS[cell]
    provider.script(*script)
    intent = submit(action="acme.transfer", arguments=TRANSFER)

    # when
    run_to_rest(intent, provider)

    # then
    intent.refresh_from_db()
    assert intent.status == end_state, intent.last_error
    assert provider.keys() == [intent.idempotency_key] * requests
    assert len(provider.effects) == applied
    assert {seen.path for seen in provider.requests} == {"/v1/transfers"}  # no URL from arguments
    if code:
        assert last_code(intent) == code
    if code == "request_in_progress":
        assert intent.in_progress_waits == intent.attempt_count == requests  # none spent the budget
    if end_state == "SUCCEEDED":
        outcome = Outcome.objects.get(intent=intent)
        expected = intent.idempotency_key if cell == "200 without an id" else "tr_1"
        assert outcome.provider_reference == expected


# A declared provider that does not deduplicate (issue 33, "Done when"): every cell of the table
# again, for an API without keys ("keys": "none") and one that takes an Idempotency-Key but
# ignores it (localstripe; "deduplicates": false). An ambiguous answer is never followed by a
# second request: the intent goes UNKNOWN, for a lookup or a person. Only a definite "not
# applied" (a 429) is retried; a definite refusal fails.
NO_KEY_ENDS: dict[str, tuple[str, int]] = {
    "ok": ("SUCCEEDED", 1),
    "slow first request, then a replay": ("UNKNOWN", 1),
    "409 problem without code, every time": ("UNKNOWN", 1),
    "409 unknown code, every time": ("UNKNOWN", 1),
    "409 stale_fence (a newer attempt exists: no same-key retry)": ("UNKNOWN", 1),
    "200 HTML, every time": ("UNKNOWN", 1),
    "429 Retry-After seconds, then ok": ("SUCCEEDED", 2),
    "503 Retry-After HTTP-date, then ok": ("UNKNOWN", 1),  # a 503 may come after the effect
    "429 every time": ("FAILED", BUDGET),
    "trickle, then a replay": ("UNKNOWN", 1),
    "50 MB body, then a replay": ("UNKNOWN", 1),
    "502 after the effect, then a replay": ("UNKNOWN", 1),
    "504 every time": ("UNKNOWN", 1),
    "redirect, every time (not followed)": ("UNKNOWN", 1),
    "200 without an id": ("SUCCEEDED", 1),
    "422 key reused": ("FAILED", 1),
    "400 key missing": ("FAILED", 1),
    "dropped connection after the effect, then a replay": ("UNKNOWN", 1),
}
NO_KEY_CONTRACTS = {
    "no keys": "none",
    "key sent, ignored": {"header": "Idempotency-Key", "deduplicates": False},
}


def test_the_no_key_table_covers_every_cell() -> None:
    assert set(NO_KEY_ENDS) == set(CELLS)


@pytest.mark.parametrize("keys", list(NO_KEY_CONTRACTS))
@pytest.mark.parametrize("cell", list(CELLS))
def test_a_declared_provider_without_keys_never_resends_after_an_ambiguous_answer(
    provider: FakeProvider, settings: Any, cell: str, keys: str
) -> None:
    # given
    settings.EFFECT_LEDGER_GENERIC_HTTP = {
        "acme.transfer": {"url": f"{provider.url}/v1/transfers", "keys": NO_KEY_CONTRACTS[keys]}
    }
    script, _, _, _, _ = CELLS[cell]
    end_state, requests = NO_KEY_ENDS[cell]
    provider.script(*script)
    intent = submit(action="acme.transfer", arguments=TRANSFER)

    # when
    run_to_rest(intent, provider)

    # then
    intent.refresh_from_db()
    assert intent.status == end_state, intent.last_error
    assert len(provider.requests) == requests
    sent = intent.idempotency_key if keys == "key sent, ignored" else ""
    assert provider.keys() == [sent] * requests
    if end_state == "UNKNOWN":
        assert intent.attempt_count == 1


# The sandbox adapters share the classifier: the cells that apply to them, same expectations
# except where their contract differs (an id is required; email has no keys).
SANDBOX_CELLS: dict[str, tuple[str, list[Answer], str, int, int]] = {
    "payments: 409 problem without code (waited out, not counted)": (
        "payments.charge",
        [Answer("problem", status=409)],
        "READY",
        BUDGET + 1,
        0,
    ),
    "payments: slow first request": ("payments.charge", [Answer("ok", seconds=2.0)], "SUCCEEDED", 2, 1),
    "payments: 200 HTML": ("payments.charge", [Answer("html")], "UNKNOWN", BUDGET, 0),
    "payments: 200 without an id (an id is required)": (
        "payments.charge",
        [Answer("no_id")],
        "UNKNOWN",
        BUDGET,
        1,
    ),
    "payments: 429 then ok": (
        "payments.charge",
        [Answer("retry_after", 429, retry_after="1"), Answer("ok")],
        "SUCCEEDED",
        2,
        1,
    ),
    "payments: 50 MB body then a replay": (
        "payments.charge",
        [Answer("huge", size=HUGE), Answer("ok")],
        "SUCCEEDED",
        2,
        1,
    ),
    "payments: trickle then a replay": (
        "payments.charge",
        [Answer("trickle", seconds=1.0, size=8), Answer("ok")],
        "SUCCEEDED",
        2,
        1,
    ),
    "payments: 422 key reused": ("payments.charge", [Answer("problem", status=422)], "FAILED", 1, 0),
    "payments: 409 stale_fence (a newer attempt exists)": (
        "payments.charge",
        [Answer("coded", 409, code="stale_fence")],
        "UNKNOWN",
        1,
        0,
    ),
    "email: 409 problem without code (no keys: no retry)": (
        "email.send",
        [Answer("problem", status=409)],
        "UNKNOWN",
        1,
        0,
    ),
    "email: 200 HTML": ("email.send", [Answer("html")], "UNKNOWN", 1, 0),
    "email: 502 after the effect": ("email.send", [Answer("after_effect", 502)], "UNKNOWN", 1, 1),
    "email: 429 then ok (refused unprocessed)": (
        "email.send",
        [Answer("retry_after", 429, retry_after="1"), Answer("ok")],
        "SUCCEEDED",
        2,
        1,
    ),
}


@pytest.mark.parametrize("cell", list(SANDBOX_CELLS))
def test_sandbox_adapters_conformance(provider: FakeProvider, cell: str) -> None:
    # given
    action, script, end_state, requests, applied = SANDBOX_CELLS[cell]
    provider.script(*script)
    intent = submit(action=action, arguments=charge_arguments() if action == "payments.charge" else EMAIL)

    # when
    run_to_rest(intent, provider)

    # then
    intent.refresh_from_db()
    assert intent.status == end_state, intent.last_error
    key = (
        intent.idempotency_key
        if action == "payments.charge"
        else f"<{intent.idempotency_key}@effect-ledger.local>"
    )
    assert provider.keys() == [key] * requests
    assert len(provider.effects) == applied


# --- issue 21, items 1-5 --------------------------------------------------------------------------


def test_i21_1_in_progress_409_without_code_is_a_same_key_retry_never_failed(provider: FakeProvider) -> None:
    # given: the first request is slow (the provider applies the charge after 2 s; we give up at 1 s)
    provider.script(Answer("ok", seconds=2.0))
    intent = submit(action="acme.transfer", arguments=TRANSFER)
    assert execute_intent(intent.id) == "retry"

    # when: the retry meets the draft's 409 (problem+json, no code) while the first still runs
    make_due(intent)
    label = execute_intent(intent.id)

    # then: not a refusal: READY with the same key, after the in-progress delay
    intent.refresh_from_db()
    assert (label, intent.status) == ("retry", "READY"), intent.last_error
    assert last_code(intent) == "request_in_progress"
    assert seconds_until_due(intent) > 0.5
    # and when the first request has applied, the next retry gets its replay: one charge
    provider.wait_idle()
    make_due(intent)
    assert execute_intent(intent.id) == "succeeded"
    assert provider.keys() == [intent.idempotency_key] * 3
    assert [seen.status for seen in provider.requests] == [200, 409, 200]
    assert len(provider.effects) == 1
    assert Outcome.objects.get(intent=intent).detail["replayed"] is True


def test_i21_6_an_id_that_is_not_text_is_unstorable_evidence_not_a_python_repr(
    provider: FakeProvider,
) -> None:
    # given: the provider applies the transfer and answers an id that is a JSON object
    provider.script(Answer("object_id"))
    intent = submit(action="acme.transfer", arguments=TRANSFER)

    # when
    label = execute_intent(intent.id)

    # then: the effect happened but its id cannot be kept: UNKNOWN, escalated, no outcome
    intent.refresh_from_db()
    assert (label, intent.status) == ("unknown", "UNKNOWN")
    assert intent.escalated_at is not None and "not text" in intent.last_error
    assert not Outcome.objects.filter(intent=intent).exists()
    assert len(provider.effects) == 1
    # and an operator cannot call it absent: the provider accepted it (evidence wins)
    operator = UserFactory(username="olga", groups=["operator"])
    with pytest.raises(ResolutionRefused, match="id that cannot be stored"):
        resolve_absent(intent_id=intent.id, user=operator, reason="nothing seen")
    intent.refresh_from_db()
    assert intent.status == "UNKNOWN" and provider.keys() == [intent.idempotency_key]


def test_i21_2_an_unreadable_2xx_is_ambiguous_never_success(provider: FakeProvider) -> None:
    # given: a portal's HTML page with 200, nothing applied
    provider.script(Answer("html"))
    intent = submit(action="acme.transfer", arguments=TRANSFER)

    # when
    label = execute_intent(intent.id)

    # then: a same-key retry (keyed provider), never SUCCEEDED with our key as reference
    intent.refresh_from_db()
    assert (label, intent.status) == ("retry", "READY")
    assert last_code(intent) == "unreadable_success"
    assert not Outcome.objects.filter(intent=intent).exists()


def test_i21_2_a_readable_2xx_without_an_id_still_succeeds_with_the_key(provider: FakeProvider) -> None:
    # given: the provider answers a JSON object without an id (it knows the effect by our key)
    provider.script(Answer("no_id"))
    intent = submit(action="acme.transfer", arguments=TRANSFER)

    # when
    assert execute_intent(intent.id) == "succeeded"

    # then
    outcome = Outcome.objects.get(intent=intent)
    assert outcome.provider_reference == intent.idempotency_key
    assert outcome.detail["id_from_body"] is False


@pytest.mark.parametrize(
    ("answer", "at_least", "at_most"),
    [
        (Answer("retry_after", 429, retry_after="5"), 4.5, 5.5),
        (Answer("retry_after", 503, retry_after="date+5"), 3.5, 6.0),
        (Answer("retry_after", 429, retry_after="3600"), 7.5, 8.0),  # capped by retry.cap_seconds (8 s)
    ],
    ids=["429 delta-seconds", "503 HTTP-date", "429 capped by the policy"],
)
def test_i21_3_retry_after_sets_the_delay_kept_in_postgresql(
    provider: FakeProvider, answer: Answer, at_least: float, at_most: float
) -> None:
    # given
    provider.script(answer)
    intent = submit(action="acme.transfer", arguments=TRANSFER)

    # when
    assert execute_intent(intent.id) == "retry"

    # then: the intent's not_before and its outbox row's due_at are that far ahead (database time)
    assert at_least <= seconds_until_due(intent) <= at_most
    assert execute_intent(intent.id) == "duplicate"  # not due yet: nothing sent
    assert len(provider.requests) == 1


def test_i21_4_one_deadline_bounds_the_whole_call_however_the_provider_trickles(
    provider: FakeProvider, settings: Any
) -> None:
    # given: a provider that sends its headers, then one byte a second, every time; a budget of 3
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "acme.transfer": {"retry": {"max_attempts": 3}},
    }
    provider.script(Answer("trickle", seconds=1.0, size=12))
    intent = submit(action="acme.transfer", arguments=TRANSFER)

    # when: each delivery runs at once after the previous one (no wait for the provider)
    durations, labels = [], []
    for _ in range(4):
        started = time.monotonic()
        labels.append(execute_intent(intent.id))
        durations.append(time.monotonic() - started)
        make_due(intent)

    # then: every call ended within the deadline plus a small slack, one request at a time, all
    # with the same key, never more than the budget, and the intent is UNKNOWN (not lost, not FAILED)
    assert max(durations[:3]) < DEADLINE + 0.5, durations
    assert labels == ["retry", "retry", "unknown", "duplicate"]
    assert provider.keys() == [intent.idempotency_key] * 3
    assert provider.max_in_flight == 1 and not provider.overlapping()
    assert all(seen.bytes_sent < 12 for seen in provider.requests)
    intent.refresh_from_db()
    assert intent.status == "UNKNOWN" and last_code(intent) == "deadline_exceeded"
    assert not Attempt.objects.filter(intent=intent, result=Attempt.Result.FENCED_OUT).exists()


@pytest.mark.parametrize("declared", [True, False], ids=["Content-Length", "no length (read until close)"])
def test_i21_5_an_oversized_answer_is_ambiguous_and_memory_stays_bounded(
    provider: FakeProvider, declared: bool
) -> None:
    # given: a 50 MB answer after the effect (with or without a Content-Length)
    provider.script(Answer("huge", size=HUGE, code="" if declared else "no_length"))
    intent = submit(action="acme.transfer", arguments=TRANSFER)
    cap = 1 * MIB

    # when
    tracemalloc.start()
    try:
        label = execute_intent(intent.id)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    # then: ambiguous (a same-key retry), at most the cap and one chunk read, only a digest kept
    assert label == "retry"
    attempt = Attempt.objects.get(intent=intent)
    assert attempt.detail["code"] == "response_too_large"
    assert attempt.detail["bytes_read"] <= cap + 64 * 1024
    assert len(attempt.detail["partial_digest"]) == 64
    assert peak < 4 * cap, f"peak {peak / MIB:.1f} MiB"
