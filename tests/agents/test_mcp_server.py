"""The MCP server (``manage.py mcp_server``) driven by the ``mcp`` SDK's own client over stdio and
streamable HTTP, against the live product: the API served by ``live_server`` on the test
database, a real worker and beat (``cluster``) and the real sandbox provider (``sandbox``).

Each MCP conversation runs in ``anyio.run`` (the SDK is async); the ORM is used only outside it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import anyio
import pytest
from django.test import Client as DjangoClient

pytest.importorskip("mcp", reason="the MCP server needs the 'agents' extra")

from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402
from mcp.types import CallToolResult  # noqa: E402

from operations.models import Intent  # noqa: E402
from operations.services import intent_approve  # noqa: E402
from tests.factories import UserFactory, charge_arguments, make_agent  # noqa: E402
from tests.support.workers import Cluster  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

BASE_DIR = Path(__file__).resolve().parents[2]
MANAGE = str(BASE_DIR / "manage.py")

Conversation = Callable[[Client], Awaitable[Any]]


def tool_json(result: CallToolResult) -> dict[str, Any]:
    """A successful tool call's JSON result."""
    assert not result.is_error, result.content
    if isinstance(result.structured_content, dict):
        return result.structured_content
    text = result.content[0]
    data: dict[str, Any] = json.loads(getattr(text, "text", ""))
    return data


def tool_error(result: CallToolResult) -> str:
    """A failed tool call's message."""
    assert result.is_error, result.structured_content
    return " ".join(getattr(block, "text", "") for block in result.content)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class McpHttpServer:
    """``manage.py mcp_server --transport http`` on a free port, pointed at ``api_url``."""

    def __init__(self, api_url: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process = subprocess.Popen(
            [
                sys.executable,
                MANAGE,
                "mcp_server",
                "--transport",
                "http",
                "--port",
                str(self.port),
                "--url",
                api_url,
            ],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"mcp_server exited: {self.process.stderr.read() if self.process.stderr else ''}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        pytest.fail("mcp_server --transport http did not listen within 30 s")

    def client(self, token: str, **options: Any) -> Client:
        """An SDK client of this endpoint sending ``Authorization: Bearer <token>``."""
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        return Client(streamable_http_client(self.url, http_client=http), **options)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def stdio_client(api_url: str, token: str) -> Client:
    """An SDK client that spawns ``python manage.py mcp_server`` (stdio) as a desktop agent does."""
    env = {k: v for k, v in os.environ.items() if k.isupper()}
    env.update({"EFFECT_LEDGER_URL": api_url, "EFFECT_LEDGER_TOKEN": token})
    return Client(
        StdioServerParameters(command=sys.executable, args=[MANAGE, "mcp_server"], env=env, cwd=BASE_DIR)
    )


def converse(client: AbstractAsyncContextManager[Client], conversation: Conversation) -> Any:
    """Run ``conversation`` on one connection of ``client``; its result."""

    async def main() -> Any:
        async with client as connected:
            with anyio.fail_after(120):
                return await conversation(connected)

    return anyio.run(main)


@pytest.fixture
def product(live_server: Any, cluster: Cluster) -> Iterator[str]:
    """The live API (its base URL) with a worker and beat running against the sandbox."""
    cluster.worker("w1")
    cluster.beat()
    yield str(live_server.url)


@pytest.fixture
def mcp_http(product: str) -> Iterator[McpHttpServer]:
    server = McpHttpServer(product)
    try:
        yield server
    finally:
        server.stop()


def the_scenario(client: Callable[[], Client], sandbox: Any, *, run_id: str | None) -> None:
    """list, preview, submit, re-submit the same tool call, wait: one intent, one effect."""
    arguments = charge_arguments(amount=4990, reference="order-mcp-1")
    submit_args: dict[str, Any] = {"action": "payments.charge", "arguments": arguments}
    if run_id is not None:
        submit_args["run_id"] = run_id

    async def look(c: Client) -> dict[str, Any]:
        return {
            "tools": {tool.name: tool for tool in (await c.list_tools()).tools},
            "actions": tool_json(await c.call_tool("list_actions", {}))["actions"],
            "preview": tool_json(
                await c.call_tool("preview_action", {"action": "payments.charge", "arguments": arguments})
            ),
        }

    async def act(c: Client) -> dict[str, Any]:
        first = tool_json(await c.call_tool("submit_intent", submit_args))
        again = tool_json(await c.call_tool("submit_intent", submit_args))
        waited = tool_json(
            await c.call_tool("wait_for_intent", {"intent_id": first["intent_id"], "timeout_seconds": 60})
        )
        if waited["status"] not in {"SUCCEEDED", "FAILED"}:  # left READY for RUNNING: wait once more
            waited = tool_json(
                await c.call_tool("wait_for_intent", {"intent_id": first["intent_id"], "timeout_seconds": 60})
            )
        return {"first": first, "again": again, "waited": waited}

    seen = converse(client(), look)
    previewed_intents = Intent.objects.count()
    seen.update(converse(client(), act))
    # list_actions: payments.charge with its argument schema and approval rule
    assert set(seen["tools"]) == {
        "list_actions",
        "preview_action",
        "submit_intent",
        "get_intent",
        "wait_for_intent",
    }
    assert "safe" in (seen["tools"]["submit_intent"].description or "").lower()
    charge = {a["action"]: a for a in seen["actions"]}["payments.charge"]
    assert charge["needs_approval"] == "depends_on_arguments"
    assert {"amount", "currency", "customer"} <= set(charge["versions"][0]["arguments_schema"]["properties"])
    # preview: the dry run stored nothing
    assert (seen["preview"]["needs_approval"], previewed_intents) == (False, 0)
    # submit twice, the same tool call: one intent
    first, again = seen["first"], seen["again"]
    assert first["intent_id"] == again["intent_id"]
    assert (first["replayed"], again["replayed"]) == (False, True)
    assert first["idempotency_key"] == again["idempotency_key"]
    assert Intent.objects.count() == 1
    # wait: the outcome, and exactly one effect at the provider
    waited = seen["waited"]
    assert waited["status"] == "SUCCEEDED"
    effects = sandbox.ledger("payments", reference="order-mcp-1")
    assert len(effects) == 1
    assert waited["outcome"]["provider_reference"] == effects[0]["id"]


def test_i15_stdio_list_preview_submit_twice_and_wait_make_one_intent_and_one_effect(
    product: str, sandbox: Any
) -> None:
    # given
    _, token = make_agent()
    # when / then: no run_id, no key: the stdio session (this server process) is the run
    the_scenario(lambda: stdio_client(product, token), sandbox, run_id=None)


def test_i15_http_list_preview_submit_twice_and_wait_make_one_intent_and_one_effect(
    mcp_http: McpHttpServer, sandbox: Any
) -> None:
    # given
    _, token = make_agent()
    # when / then: a 2026-07-28 HTTP request has no session: the run is the run_id argument
    the_scenario(lambda: mcp_http.client(token), sandbox, run_id="run-42")


def test_i15_http_session_of_a_legacy_client_is_the_run_without_a_run_id(mcp_http: McpHttpServer) -> None:
    # given: a client speaking the handshake-era protocol (Mcp-Session-Id)
    _, token = make_agent()
    call = {"action": "payments.charge", "arguments": charge_arguments(reference="order-legacy")}

    async def conversation(c: Client) -> tuple[dict[str, Any], dict[str, Any]]:
        return (
            tool_json(await c.call_tool("submit_intent", call)),
            tool_json(await c.call_tool("submit_intent", call)),
        )

    # when
    first, again = converse(mcp_http.client(token, mode="legacy"), conversation)
    second_session, _ = converse(mcp_http.client(token, mode="legacy"), conversation)
    # then: one intent per session
    assert first["intent_id"] == again["intent_id"]
    assert second_session["intent_id"] != first["intent_id"]
    assert Intent.objects.count() == 2


def test_i15_http_without_a_session_run_or_key_is_refused_and_stores_nothing(mcp_http: McpHttpServer) -> None:
    # given
    _, token = make_agent()

    async def conversation(c: Client) -> CallToolResult:
        return await c.call_tool(
            "submit_intent", {"action": "payments.charge", "arguments": charge_arguments()}
        )

    # when
    message = tool_error(converse(mcp_http.client(token), conversation))
    # then
    assert "idempotency_key" in message and "run_id" in message
    assert Intent.objects.count() == 0


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_i15_a_gated_charge_waits_for_approval_and_the_agent_receives_the_outcome(
    transport: str, product: str, sandbox: Any, request: pytest.FixtureRequest
) -> None:
    # given: a charge above the EUR approval threshold, with an explicit key (a tool-call id)
    _, token = make_agent()
    approver = UserFactory(username="alice", groups=["approver"])
    client: Callable[[], Client]
    if transport == "stdio":
        client = lambda: stdio_client(product, token)  # noqa: E731
    else:
        server: McpHttpServer = request.getfixturevalue("mcp_http")
        client = lambda: server.client(token)  # noqa: E731
    call = {
        "action": "payments.charge",
        "arguments": charge_arguments(amount=50_000, reference="order-big"),
        "idempotency_key": "call_abc123",
    }

    async def submit_and_wait_a_moment(c: Client) -> tuple[dict[str, Any], dict[str, Any]]:
        submitted = tool_json(await c.call_tool("submit_intent", call))
        waited = tool_json(
            await c.call_tool("wait_for_intent", {"intent_id": submitted["intent_id"], "timeout_seconds": 1})
        )
        return submitted, waited

    # when
    submitted, still = converse(client(), submit_and_wait_a_moment)
    # then: it waits for a person, who is given the approval page
    assert submitted["status"] == still["status"] == "AWAITING_APPROVAL"
    assert submitted["console_url"] == f"{product}/approvals/{submitted['intent_id']}/"
    assert "approve" in submitted["next_step"].lower()
    assert sandbox.ledger("payments", reference="order-big") == []
    # when: approved in the console's service, the agent waits (in a new connection)
    intent = Intent.objects.get(id=submitted["intent_id"])
    intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash, reason="fine")

    async def wait_for_the_outcome(c: Client) -> dict[str, Any]:
        status = "AWAITING_APPROVAL"
        result: dict[str, Any] = {}
        for _ in range(5):
            result = tool_json(
                await c.call_tool(
                    "wait_for_intent",
                    {"intent_id": submitted["intent_id"], "status": status, "timeout_seconds": 60},
                )
            )
            if result["status"] in {"SUCCEEDED", "FAILED"}:
                break
            status = result["status"]
        return result

    outcome = converse(client(), wait_for_the_outcome)
    # then
    assert outcome["status"] == "SUCCEEDED"
    assert outcome["resolution"]["event"] == "approved"
    assert outcome["resolution"]["actor"] == "user:alice"
    (effect,) = sandbox.ledger("payments", reference="order-big")
    assert outcome["outcome"]["provider_reference"] == effect["id"]


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_i15_bad_arguments_are_a_tool_error_naming_the_field_and_store_nothing(
    transport: str, product: str, request: pytest.FixtureRequest
) -> None:
    # given
    _, token = make_agent()
    if transport == "stdio":
        client = stdio_client(product, token)
    else:
        client = request.getfixturevalue("mcp_http").client(token)
    bad = {"action": "payments.charge", "arguments": {"amount": "12.50", "currency": "EUR", "customer": "c"}}

    async def conversation(c: Client) -> tuple[CallToolResult, CallToolResult]:
        return (
            await c.call_tool("submit_intent", {**bad, "run_id": "run-1"}),
            await c.call_tool("preview_action", bad),
        )

    # when
    submitted, previewed = converse(client, conversation)
    # then
    for result in (submitted, previewed):
        message = tool_error(result)
        assert "amount: with a currency, the amount must be an integer number of minor units" in message
        assert "Nothing was stored" in message
    assert Intent.objects.count() == 0


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_i15_a_bad_token_is_a_clear_tool_error(
    transport: str, product: str, request: pytest.FixtureRequest
) -> None:
    # given
    make_agent()
    if transport == "stdio":
        client = stdio_client(product, "elk_not-a-real-token")
    else:
        client = request.getfixturevalue("mcp_http").client("elk_not-a-real-token")

    async def conversation(c: Client) -> tuple[CallToolResult, CallToolResult]:
        return (
            await c.call_tool("list_actions", {}),
            await c.call_tool(
                "submit_intent", {"action": "payments.charge", "arguments": charge_arguments(), "run_id": "r"}
            ),
        )

    # when
    listed, submitted = converse(client, conversation)
    # then
    for result in (listed, submitted):
        assert "refused the agent token (401" in tool_error(result)
    assert Intent.objects.count() == 0


def test_i15_http_without_an_authorization_header_is_a_tool_error(mcp_http: McpHttpServer) -> None:
    # given: no header at all (the HTTP server holds no token of its own)
    client = Client(streamable_http_client(mcp_http.url))

    async def conversation(c: Client) -> CallToolResult:
        return await c.call_tool("list_actions", {})

    # when
    message = tool_error(converse(client, conversation))
    # then
    assert "Authorization: Bearer" in message


def test_i15_an_unreachable_ledger_is_a_tool_error_saying_a_retry_is_safe() -> None:
    # given: nothing listens on the API's port
    client = stdio_client(f"http://127.0.0.1:{free_port()}", "elk_any")

    async def conversation(c: Client) -> CallToolResult:
        return await c.call_tool("get_intent", {"intent_id": "00000000-0000-0000-0000-000000000000"})

    # when
    message = tool_error(converse(client, conversation))
    # then
    assert "could not be reached" in message and "Retrying is safe" in message


# --- case C33: the plan run again after a restart (issue 38 item 5) --------------------------------


def charge_until_done(call: dict[str, Any]) -> Conversation:
    """A conversation that submits ``call`` and waits until it is SUCCEEDED or FAILED."""

    async def conversation(c: Client) -> tuple[dict[str, Any], dict[str, Any]]:
        submitted = tool_json(await c.call_tool("submit_intent", call))
        waited = submitted
        for _ in range(5):
            waited = tool_json(
                await c.call_tool(
                    "wait_for_intent",
                    {"intent_id": submitted["intent_id"], "status": waited["status"], "timeout_seconds": 60},
                )
            )
            if waited["status"] in {"SUCCEEDED", "FAILED"}:
                break
        return submitted, waited

    return conversation


def submit_once(call: dict[str, Any]) -> Conversation:
    """A conversation that submits ``call`` once, then asks how it is a few seconds later (the
    agent's ``wait_for_intent``: the reconciler's passes run meanwhile)."""

    async def conversation(c: Client) -> tuple[dict[str, Any], dict[str, Any]]:
        submitted = tool_json(await c.call_tool("submit_intent", call))
        later = tool_json(
            await c.call_tool("wait_for_intent", {"intent_id": submitted["intent_id"], "timeout_seconds": 3})
        )
        return submitted, later

    return conversation


def assert_held_as_a_likely_duplicate(answer: dict[str, Any], first_id: str, product: str, what: str) -> None:
    """The tool's answer says HELD, as a likely duplicate of ``first_id``, and why."""
    assert (
        answer["status"] == "HELD"
        and answer.get("replayed", False) is False
        and answer["intent_id"] != first_id
    )
    assert answer["held_behind"] == first_id
    assert answer["likely_duplicate"]["earlier_intent"] == first_id
    assert f"{what} was already done 30.00 EUR by intent {first_id}" in answer["likely_duplicate"]["reason"]
    assert answer["next_step"].startswith("Held as a likely duplicate:")
    assert "Do not submit it again" in answer["next_step"]
    assert answer["console_url"] == f"{product}/held/{answer['intent_id']}/"


def assert_in_the_operators_queue(intent_ids: list[str]) -> None:
    """HELD and escalated, never attempted, and listed in the operators' queue as likely duplicates."""
    operator = UserFactory(username="olga", groups=["operator"])
    console = DjangoClient()
    console.force_login(operator)
    queue = console.get("/unknown/").content.decode()
    for intent_id in intent_ids:
        intent = Intent.objects.get(id=intent_id)
        assert intent.status == Intent.Status.HELD and intent.escalated_at is not None
        assert intent.attempt_count == 0
        assert intent_id in queue
        held_page = console.get(f"/held/{intent_id}/")
        assert held_page.status_code == 200 and "likely duplicate" in held_page.content.decode()
    assert "likely duplicate" in queue


def test_c33_the_same_charge_from_a_new_session_after_it_succeeded_is_held_not_charged_again(
    product: str, sandbox: Any
) -> None:
    # given: a desktop agent (stdio: one MCP session per app run) charged order-c33 30.00 EUR
    _, token = make_agent()
    call = {"action": "payments.charge", "arguments": charge_arguments(3000, reference="order-c33")}
    first, done = converse(stdio_client(product, token), charge_until_done(call))
    assert done["status"] == "SUCCEEDED"
    # when: the app restarts and runs its plan again: the same tool call from a new session,
    # once without run_id and once (another restart) with a new run_id
    again, again_later = converse(stdio_client(product, token), submit_once(call))
    with_run, with_run_later = converse(
        stdio_client(product, token), submit_once({**call, "run_id": "run-after-restart"})
    )
    # then: each answer says it is held as a likely duplicate of the first, and why
    for answer in (again, again_later, with_run, with_run_later):
        assert_held_as_a_likely_duplicate(answer, first["intent_id"], product, "order-c33")
    # and: both wait for a person in the operators' queue; one charge at the provider
    assert_in_the_operators_queue([again["intent_id"], with_run["intent_id"]])
    (effect,) = sandbox.ledger("payments", reference="order-c33")
    assert done["outcome"]["provider_reference"] == effect["id"]


def test_c33_a_call_without_a_reference_from_a_new_session_is_held_too(
    product: str, mcp_http: McpHttpServer, sandbox: Any
) -> None:
    # given: an agent's charge that names no reference, in one MCP session (Mcp-Session-Id)
    _, token = make_agent()
    call = {"action": "payments.charge", "arguments": charge_arguments(3000)}
    first, done = converse(mcp_http.client(token, mode="legacy"), charge_until_done(call))
    assert done["status"] == "SUCCEEDED"
    # then: the server sent a reference derived from the call (the business object it names)
    derived = first["reference"]
    assert derived.startswith("derived-ref-v1-")
    # when: the same call from a new session (its key is derived from the new session)
    again, _ = converse(mcp_http.client(token, mode="legacy"), submit_once(call))
    # then: recognised by that reference, held as a likely duplicate; one charge
    assert again["idempotency_key"] != first["idempotency_key"] and again["reference"] == derived
    assert_held_as_a_likely_duplicate(again, first["intent_id"], product, derived)
    (effect,) = sandbox.ledger("payments", reference=derived)
    assert done["outcome"]["provider_reference"] == effect["id"]
