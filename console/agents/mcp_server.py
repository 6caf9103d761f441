"""An MCP server giving an AI agent the ledger's actions as tools (issue 15), on the official
``mcp`` SDK (2.x, ``MCPServer``; ``pip install 'effect-ledger[agents]'``).

It speaks to the ledger only through the public HTTP API (``console.agents.client``) with an
agent's bearer token, so it runs on the agent's machine; it imports nothing of Django or the
ledger. Two transports:

* stdio (``python manage.py mcp_server``, or ``python -m console.agents.mcp_server`` where the
  ledger is not installed): a desktop agent starts it; the token comes from
  ``EFFECT_LEDGER_TOKEN`` (or ``--token``) and the API from ``EFFECT_LEDGER_URL``.
* streamable HTTP (``--transport http``, ``/mcp``): the server holds no token. Each MCP request's
  own ``Authorization: Bearer <agent token>`` header is forwarded to the API, which checks it;
  so this endpoint acts for no one by itself, and every agent acts with its own scopes.

Tools: ``list_actions``, ``preview_action``, ``submit_intent``, ``get_intent``,
``wait_for_intent``. A refusal of the API (an RFC 9457 problem: bad arguments, an action outside
the agent's scopes, a bad token) is returned as a tool error carrying the problem's detail, as is
an unreachable API; nothing crashes.

Idempotency without a key (``submit_intent``): a tool call re-sent by the agent framework must
never make a second intent, and a JSON-RPC request id is not stable across retries, so the key
is derived (``client.derive_idempotency_key``) from a stable identity of the agent's run plus the
action, its version, the reference and the RFC 8785 canonical hash of the arguments. The run is,
in order: the ``run_id`` argument; else the MCP session (the ``Mcp-Session-Id`` of a
streamable HTTP session; on stdio, this server process, which lives exactly as long as the
client's connection). A 2026-07-28 streamable HTTP request carries no session: there a call
without ``idempotency_key`` or ``run_id`` is refused (a tool error), never guessed.
Trade-off: two deliberately identical submissions in one run (the same charge twice, on purpose)
collapse into one intent; give them distinct ``reference`` values or explicit keys. And a new
session (a restarted desktop agent) is a new run: pass ``run_id`` or the framework's tool-call id
to keep a retry idempotent across restarts.

A new run is caught by the ledger instead (issue 38 item 5, case C33): a second intent for the
same business reference is held while the first is open and, once the first made its effect,
within its policy's reuse window (24 h for money by default), as a likely duplicate for a
person (or refused, by policy); the tool's answer says so (``likely_duplicate``, ``next_step``).
A call that names no reference (neither ``reference`` nor ``arguments.reference``) is sent with
one derived from the action and its arguments (``client.derive_reference``), so the same call
repeated from a new session is recognised too, rather than making the ledger's identity depend
on a session id; the idempotency key is still derived from the reference the agent gave (none),
so keys are what they were. Trade-off: the same action with the same arguments on purpose, from
two runs within the window, is held for a person: give each its own reference.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from console.agents.cli import add_arguments
from console.agents.client import EffectLedgerClient, Intent, derive_idempotency_key, derive_reference
from console.agents.errors import EffectLedgerError, LedgerUnreachable, ProblemError

DEFAULT_WAIT_SECONDS = 60.0
#: The longest ``wait_for_intent`` (seconds): under the read timeouts MCP clients commonly use.
MAX_WAIT_SECONDS = 240.0
#: The identity of this process's stdio connection (one process per client connection).
STDIO_RUN = f"stdio-{uuid.uuid4()}"

RETRY_SAFE = (
    "Retrying is safe: send the same call again (same arguments, same idempotency_key or run_id) "
    "after any error or timeout and you get the same intent, never a second one. You never need a "
    "new key to retry. Without an idempotency_key or run_id, that holds only on this same MCP "
    "connection: pass one of them."
)

INSTRUCTIONS = f"""Effect Ledger runs side effects (payments, emails, reservations) for you at most
once, with approvals by people where the policy asks. Call list_actions to learn the actions and
their argument schemas, preview_action to see exactly what would happen, submit_intent to ask for
it, and wait_for_intent to learn the outcome. {RETRY_SAFE} An intent AWAITING_APPROVAL waits for
a person: give them its console_url and call wait_for_intent; do not submit it again."""

NEXT_STEPS = {
    "AWAITING_APPROVAL": "A person must approve it: show them console_url, then call wait_for_intent. "
    "Do not submit it again.",
    "READY": "Queued to run: call wait_for_intent.",
    "RUNNING": "Running now: call wait_for_intent.",
    "UNKNOWN": "The provider's answer was lost; the ledger is finding out whether it happened (never "
    "sending it twice). Call wait_for_intent; do not submit it again.",
    "HELD": "Held behind an earlier intent for the same business action, or for a person: call "
    "wait_for_intent; do not submit it again.",
    "COMPENSATING": "The effect is being undone: call wait_for_intent.",
    "SUCCEEDED": "Done: outcome.provider_reference is the provider's id of the effect.",
    "FAILED": "It ended without effect (last_error says why).",
    "REJECTED": "A person rejected it (resolution says who and why); it did not happen.",
    "EXPIRED": "Nobody approved it in time; it did not happen.",
    "CANCELLED": "Cancelled before it ran; it did not happen.",
    "COMPENSATED": "It happened and was undone.",
}


def next_step(intent: Intent) -> str:
    """What the model should do next, in words (``NEXT_STEPS``); for an intent held or refused
    as a likely duplicate, why (the ledger's reason names the earlier intent)."""
    duplicate = intent.likely_duplicate
    if duplicate and intent.status == "HELD":
        return (
            f"Held as a {duplicate.get('reason') or 'likely duplicate'}. It does not run unless a person "
            "releases it (console_url); the earlier intent's effect already exists. Do not submit it again "
            "(under any key or run_id): tell the user it was already done, or call wait_for_intent for the "
            "person's decision. To do the action a second time on purpose, use a new reference."
        )
    if duplicate and intent.status == "REJECTED":
        return (
            f"Refused by the policy as a {duplicate.get('reason') or 'likely duplicate'}. It did not happen; "
            "the earlier intent's effect already exists. Do not submit it again: tell the user it was already "
            "done. To do the action a second time on purpose, use a new reference."
        )
    return NEXT_STEPS.get(intent.status, "")


def intent_result(intent: Intent, *, idempotency_key: str | None = None) -> dict[str, Any]:
    """The tool result for an intent: what the model needs, with ``next_step`` in words."""
    result: dict[str, Any] = {
        "intent_id": intent.intent_id,
        "status": intent.status,
        "action": intent.action,
        "action_version": intent.action_version,
        "arguments": intent.arguments,
        "reference": intent.reference,
        "outcome": intent.data.get("outcome"),
        "resolution": intent.resolution,
        "last_error": intent.last_error,
        "approval_expires_at": intent.approval_expires_at,
        "console_url": intent.console_url,
        "held_behind": intent.held_behind,
        "likely_duplicate": intent.likely_duplicate,
        "next_step": next_step(intent),
    }
    if idempotency_key is not None:
        result["idempotency_key"] = idempotency_key
        result["replayed"] = intent.replayed
    return result


@contextmanager
def tool_errors() -> Iterator[None]:
    """Turn what the client raises into an MCP tool error the model can read: an API refusal or
    an unreachable API (``problem_message``), or a value refused before anything was sent."""
    try:
        yield
    except EffectLedgerError as exc:
        raise ToolError(problem_message(exc)) from exc
    except ValueError as exc:  # refused by the client before anything was sent
        raise ToolError(f"{exc}. Nothing was sent or stored.") from exc


def problem_message(exc: EffectLedgerError) -> str:
    """A tool error's text for a refusal or an unreachable API."""
    if isinstance(exc, ProblemError):
        if exc.status == 401:
            return (
                f"The ledger refused the agent token (401 {exc.title}): {exc.detail}. Check the token "
                "(EFFECT_LEDGER_TOKEN, or the Authorization header sent to this MCP endpoint)."
            )
        listed = (f"{e.get('field')}: {e.get('message')}" for e in exc.errors)
        fields = "".join(f"\n- {item}" for item in listed if item not in exc.detail)
        stored = " Nothing was stored." if exc.status < 500 and exc.status != 409 else ""
        retry = " Send the same call again later; it is safe." if exc.status in (429, 503) else ""
        detail = exc.detail if exc.detail.endswith((".", "!", "?")) or not exc.detail else f"{exc.detail}."
        return f"{exc.title} ({exc.status}, {exc.code or exc.type}): {detail}{fields}{stored}{retry}"
    if isinstance(exc, LedgerUnreachable):
        return f"The ledger could not be reached: {exc}. {RETRY_SAFE}"
    return str(exc)


class Ledger:
    """How the tools reach the API: ``base_url`` and either one agent token (stdio) or, with
    ``token=None`` (streamable HTTP), the ``Authorization`` header of each MCP request."""

    def __init__(self, base_url: str, token: str | None, *, timeout: float = 10.0) -> None:
        self.base_url = base_url
        self.token = token
        self.timeout = timeout

    def client(self, ctx: Context | None) -> EffectLedgerClient:
        """A client acting for the configured token or the MCP request's bearer token.

        Raises:
            ToolError: no token at all (an HTTP request without ``Authorization: Bearer``).
        """
        token = self.token
        if token is None:
            headers = ctx.headers if ctx is not None else None
            authorization = (headers or {}).get("authorization", "")
            scheme, _, credentials = authorization.partition(" ")
            if scheme.lower() != "bearer" or not credentials.strip():
                raise ToolError(
                    "No agent token: send 'Authorization: Bearer <agent token>' with your MCP requests "
                    "(python manage.py create_agent prints one)."
                )
            token = credentials.strip()
        return EffectLedgerClient(self.base_url, token, timeout=self.timeout)


def session_run(ctx: Context | None) -> str | None:
    """The stable identity of the MCP session a tool call came in: the ``Mcp-Session-Id`` of a
    streamable HTTP session, this process on stdio (no headers), None for a sessionless HTTP
    request (protocol 2026-07-28)."""
    headers = ctx.headers if ctx is not None else None
    if headers is None:
        return STDIO_RUN
    session = headers.get("mcp-session-id")
    return f"mcp-session-{session}" if session else None


def build_server(ledger: Ledger) -> MCPServer:
    """The MCP server with the five tools, acting through ``ledger``."""
    server = MCPServer(name="effect-ledger", instructions=INSTRUCTIONS)
    read_only = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)

    @server.tool(
        annotations=read_only,
        description="List the actions you may submit: each with its versions and the JSON Schema of "
        "its arguments, its risk tier and whether it needs a person's approval (always, never, or "
        "depends_on_arguments: preview_action tells). Money is in integer minor units (cents).",
    )
    def list_actions(ctx: Context) -> dict[str, Any]:
        with ledger.client(ctx) as client, tool_errors():
            return {"actions": client.list_actions()}

    @server.tool(
        annotations=read_only,
        description="Dry run: what exactly would happen if you submitted this (summary, target, money, "
        "checks, whether a person must approve it). Nothing is stored or sent. Arguments are "
        "validated as on submit: a bad field is named in the error.",
    )
    def preview_action(
        ctx: Context,
        action: Annotated[str, Field(description="the action's name, e.g. payments.charge")],
        arguments: Annotated[
            dict[str, Any], Field(description="the action's arguments (list_actions gives the schema)")
        ],
        action_version: Annotated[int, Field(ge=1, description="the action's version")] = 1,
        reference: Annotated[str | None, Field(description="your business reference (an order id)")] = None,
    ) -> dict[str, Any]:
        with ledger.client(ctx) as client, tool_errors():
            return client.preview(action, arguments, action_version=action_version, reference=reference)

    @server.tool(
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=True
        ),
        description="Ask the ledger to do an action; it runs at most once. Returns intent_id and status; "
        "AWAITING_APPROVAL means a person must approve it first: give them console_url and call "
        "wait_for_intent. idempotency_key: pass your tool-call id if you have one; without it the key "
        "is derived from run_id (or this MCP session), the action and the arguments, so the same call "
        f"sent again is the same intent. {RETRY_SAFE} Pass run_id (a stable id of your conversation) "
        "whenever you have one: without it or a key, a call repeated after this connection restarts "
        "is a new intent, which the ledger holds for a person as a likely duplicate when the same "
        "reference (or, without one, the same action and arguments) was done recently: "
        "likely_duplicate then says why. To do the same action twice on purpose, give each a "
        "different reference.",
    )
    def submit_intent(
        ctx: Context,
        action: Annotated[str, Field(description="the action's name, e.g. payments.charge")],
        arguments: Annotated[
            dict[str, Any], Field(description="the action's arguments (list_actions gives the schema)")
        ],
        idempotency_key: Annotated[
            str | None,
            Field(
                min_length=1,
                max_length=255,
                description="optional; your framework's tool-call id is the natural one. Reuse it on retries.",
            ),
        ] = None,
        run_id: Annotated[
            str | None,
            Field(
                min_length=1, max_length=200, description="optional; a stable id of your run or conversation"
            ),
        ] = None,
        action_version: Annotated[int, Field(ge=1, description="the action's version")] = 1,
        reference: Annotated[
            str | None,
            Field(
                description="your business reference (an order id); without one (here or in arguments), "
                "one derived from the action and arguments is sent"
            ),
        ] = None,
        metadata: Annotated[
            dict[str, Any] | None, Field(description="stored with the intent, not part of its identity")
        ] = None,
    ) -> dict[str, Any]:
        key = idempotency_key
        if key is None:
            run = run_id or session_run(ctx)
            if run is None:
                raise ToolError(
                    "This MCP connection has no session to derive an idempotency key from: pass "
                    "idempotency_key (your tool-call id) or run_id. Nothing was submitted."
                )
            try:
                key = derive_idempotency_key(
                    run, action, arguments, action_version=action_version, reference=reference or ""
                )
            except (TypeError, ValueError) as exc:  # rfc8785 refuses what JSON cannot carry
                raise ToolError(f"arguments are not canonical JSON: {exc}. Nothing was submitted.") from exc
        named = arguments.get("reference")
        if not reference and not (isinstance(named, str) and named):
            # The business identity the ledger recognises a repeated call by, whatever its key
            # (the ledger reads a string arguments.reference first, as the adapters send it).
            try:
                reference = derive_reference(action, arguments, action_version=action_version)
            except (TypeError, ValueError) as exc:
                raise ToolError(f"arguments are not canonical JSON: {exc}. Nothing was submitted.") from exc
        with ledger.client(ctx) as client, tool_errors():
            intent = client.submit(
                action,
                arguments,
                idempotency_key=key,
                action_version=action_version,
                reference=reference,
                metadata=metadata,
            )
        return intent_result(intent, idempotency_key=key)

    @server.tool(annotations=read_only, description="An intent as it is now: status, outcome, console_url.")
    def get_intent(
        ctx: Context, intent_id: Annotated[str, Field(description="from submit_intent")]
    ) -> dict[str, Any]:
        with ledger.client(ctx) as client, tool_errors():
            return intent_result(client.get(intent_id))

    @server.tool(
        annotations=read_only,
        description="Wait until the intent leaves its current status (or the given one) or is settled, "
        "or until timeout_seconds: returns it with its outcome (the provider's reference) or the "
        "person's resolution (approved, rejected). Call it again to keep waiting; it is safe.",
    )
    def wait_for_intent(
        ctx: Context,
        intent_id: Annotated[str, Field(description="from submit_intent")],
        timeout_seconds: Annotated[
            float, Field(gt=0, le=MAX_WAIT_SECONDS, description="how long to wait at most, in seconds")
        ] = DEFAULT_WAIT_SECONDS,
        status: Annotated[
            str | None,
            Field(description="wait until the status differs from this one (default: its status now)"),
        ] = None,
    ) -> dict[str, Any]:
        with ledger.client(ctx) as client, tool_errors():
            return intent_result(client.wait(intent_id, timeout_seconds=timeout_seconds, status=status))

    return server


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m console.agents.mcp_server`` (``manage.py mcp_server``
    takes the same options: ``console.agents.cli``)."""
    p = argparse.ArgumentParser(prog="mcp_server", description="The Effect Ledger MCP server.")
    add_arguments(p)
    return p


def run(options: dict[str, Any]) -> None:
    """Serve until stopped (stdio: until the client closes the pipe).

    Raises:
        SystemExit: stdio without a token (message on stderr).
    """
    if options["transport"] == "stdio":
        if not options.get("token"):
            sys.exit("mcp_server: set EFFECT_LEDGER_TOKEN (or --token) to the agent's token")
        build_server(Ledger(options["url"], options["token"], timeout=options["timeout"])).run("stdio")
        return
    server = build_server(Ledger(options["url"], None, timeout=options["timeout"]))
    server.run("streamable-http", host=options["host"], port=options["port"])


def main(argv: Sequence[str] | None = None) -> None:
    run(vars(parser().parse_args(argv)))


if __name__ == "__main__":
    main()
