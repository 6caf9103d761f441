"""The typed API client (``console.agents.client``) on its own: the derived idempotency key,
problems raised as ``ProblemError``, and ``wait`` with and without the API's long-poll
(``httpx.MockTransport`` stands in for the server; the client against the live API is exercised
through the MCP server in ``test_mcp_server.py``)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import rfc8785

from console.agents.client import DERIVED_KEY_PREFIX, EffectLedgerClient, derive_idempotency_key
from console.agents.errors import LedgerUnreachable, ProblemError

INTENT_ID = "2f7a4c1e-0000-4000-8000-000000000001"
ARGS = {"amount": 4990, "currency": "EUR", "customer": "cus_42"}


def intent(status: str, **extra: Any) -> dict[str, Any]:
    return {"intent_id": INTENT_ID, "status": status, "action": "payments.charge", "arguments": ARGS, **extra}


def test_i15_derived_key_ignores_the_order_of_keys_in_the_arguments() -> None:
    # given
    reordered = {"customer": "cus_42", "currency": "EUR", "amount": 4990}
    # when
    key = derive_idempotency_key("run-1", "payments.charge", ARGS)
    # then
    assert key == derive_idempotency_key("run-1", "payments.charge", reordered)
    assert key.startswith(DERIVED_KEY_PREFIX) and len(key) == len(DERIVED_KEY_PREFIX) + 64


@pytest.mark.parametrize(
    "change",
    [
        {"run_id": "run-2"},
        {"action": "payments.refund"},
        {"arguments": {**ARGS, "amount": 4991}},
        {"arguments": {**ARGS, "amount": 4990.5}},
        {"reference": "order-2"},
        {"action_version": 2},
    ],
)
def test_i15_derived_key_differs_by_run_action_arguments_reference_and_version(
    change: dict[str, Any],
) -> None:
    # given
    base: dict[str, Any] = {"run_id": "run-1", "action": "payments.charge", "arguments": ARGS}
    changed = {**base, **change}
    # when
    before = derive_idempotency_key(
        base["run_id"], base["action"], base["arguments"], action_version=1, reference=""
    )
    after = derive_idempotency_key(
        changed["run_id"],
        changed["action"],
        changed["arguments"],
        action_version=changed.get("action_version", 1),
        reference=changed.get("reference", ""),
    )
    # then
    assert before != after


def test_i15_derived_key_refuses_an_empty_run_and_what_json_cannot_carry() -> None:
    with pytest.raises(ValueError, match="run_id"):
        derive_idempotency_key("", "payments.charge", ARGS)
    with pytest.raises(rfc8785.CanonicalizationError):  # NaN is not JSON
        derive_idempotency_key("run-1", "payments.charge", {"amount": float("nan")})


def mock(handler: Any) -> EffectLedgerClient:
    return EffectLedgerClient("http://ledger.test/", "elk_t", transport=httpx.MockTransport(handler))


def test_i15_a_problem_is_raised_with_its_members_and_the_key_and_token_are_sent() -> None:
    # given
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        problem = {
            "type": "tag:effect-ledger,2026:problems/validation-failed",
            "title": "Invalid request",
            "status": 422,
            "detail": "arguments.amount: required",
            "code": "validation-failed",
            "errors": [{"field": "arguments.amount", "message": "required"}],
        }
        return httpx.Response(422, json=problem, headers={"Content-Type": "application/problem+json"})

    # when
    with mock(handler) as client, pytest.raises(ProblemError) as raised:
        client.submit("payments.charge", {}, idempotency_key="call_1")
    # then
    problem = raised.value
    assert (problem.status, problem.code, problem.title) == (422, "validation-failed", "Invalid request")
    assert problem.errors == [{"field": "arguments.amount", "message": "required"}]
    (request,) = seen
    assert request.url == "http://ledger.test/api/v1/intents"
    assert (request.headers["Idempotency-Key"], request.headers["Authorization"]) == (
        "call_1",
        "Bearer elk_t",
    )
    assert json.loads(request.content) == {"action": "payments.charge", "action_version": 1, "arguments": {}}


def test_i15_a_replayed_submission_is_marked_and_links_give_the_console_url() -> None:
    # given
    body = intent("AWAITING_APPROVAL", links={"self": "x", "console": "http://ledger.test/approvals/1/"})

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(201, json=body, headers={"Idempotent-Replayed": "true"})

    # when
    with mock(handler) as client:
        submitted = client.submit("payments.charge", ARGS, idempotency_key="k")
    # then
    assert (submitted.replayed, submitted.console_url) == (True, "http://ledger.test/approvals/1/")


def test_i15_an_unreachable_server_is_ledger_unreachable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with mock(handler) as client, pytest.raises(LedgerUnreachable):
        client.get(INTENT_ID)


def test_i15_wait_polls_a_server_without_the_long_poll_until_the_status_changes() -> None:
    # given: a server that ignores wait= and answers at once; RUNNING twice, then SUCCEEDED
    answers = iter(["RUNNING", "RUNNING", "RUNNING", "SUCCEEDED"])
    params: list[dict[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        params.append(dict(request.url.params))
        return httpx.Response(200, json=intent(next(answers)))

    # when
    with mock(handler) as client:
        result = client.wait(INTENT_ID, timeout_seconds=10)
    # then: the first read learns the status; the others ask the long-poll for a change of it
    assert result.status == "SUCCEEDED"
    assert params[0] == {}
    assert all(p["status"] == "RUNNING" and 0 < int(p["wait"]) <= 30 for p in params[1:])


def test_i15_wait_returns_at_the_timeout_with_the_intent_unchanged() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=intent("AWAITING_APPROVAL"))

    with mock(handler) as client:
        result = client.wait(INTENT_ID, timeout_seconds=1.2)
    assert result.status == "AWAITING_APPROVAL"


def test_i15_wait_returns_at_once_for_a_settled_intent_or_one_already_past_the_given_status() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(
            200, json=intent("SUCCEEDED", outcome={"source": "provider", "provider_reference": "ch_1"})
        )

    with mock(handler) as client:
        result = client.wait(INTENT_ID, timeout_seconds=30, status="AWAITING_APPROVAL")
    assert (result.status, calls) == ("SUCCEEDED", 1)
    assert result.outcome is not None and result.outcome.provider_reference == "ch_1"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c.submit("payments.charge", {}, idempotency_key="kéy"), "printable ASCII"),
        (lambda c: c.submit("payments.charge", {}, idempotency_key=""), "printable ASCII"),
        (lambda c: c.submit("payments.charge", {}, idempotency_key="k" * 256), "printable ASCII"),
        (lambda c: c.get("../actions"), "must be a UUID"),
        (lambda c: c.cancel("not-an-id"), "must be a UUID"),
        (
            lambda c: c.wait("00000000-0000-4000-8000-000000000001", timeout_seconds=1, status="BOGUS"),
            "one of",
        ),
    ],
)
def test_i15_what_the_api_would_refuse_or_misread_is_refused_before_sending(call: Any, message: str) -> None:
    # given: a server that records every request
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=intent("READY"))

    # when / then: a clear ValueError, and nothing sent (a key a header cannot carry, an id that
    # would name another path, a status no intent can be in)
    with mock(handler) as client, pytest.raises(ValueError, match=message):
        call(client)
    assert seen == []
