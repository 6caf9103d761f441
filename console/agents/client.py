"""A small typed client of the Effect Ledger HTTP API (``/api/v1/``), for agents.

It imports nothing of Django or of the ledger (only httpx and rfc8785), so it runs on the agent's
machine with an agent's bearer token::

    client = EffectLedgerClient("http://127.0.0.1:8765", token)
    key = derive_idempotency_key(run_id, "payments.charge", arguments)
    intent = client.submit("payments.charge", arguments, idempotency_key=key)
    intent = client.wait(intent.intent_id, timeout_seconds=60)

Every call is safe to send again: ``submit`` with the same idempotency key and request answers
the intent the first call created (the API's ``Idempotent-Replayed``), reads change nothing.
An API error (an RFC 9457 problem) is raised as ``ProblemError``; a server that cannot be reached
as ``LedgerUnreachable`` (both ``console.agents.errors``).
"""

from __future__ import annotations

import hashlib
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
import rfc8785

from console.agents.errors import LedgerUnreachable, ProblemError

#: States an intent does not leave (``operations.models.TERMINAL_STATUSES``).
TERMINAL_STATUSES = frozenset({"FAILED", "COMPENSATED", "REJECTED", "EXPIRED", "CANCELLED"})
#: States where the question "what happened?" has its answer: the terminal ones and SUCCEEDED
#: (which leaves only if an operator compensates the effect). ``wait`` returns at once in them.
SETTLED_STATUSES = TERMINAL_STATUSES | {"SUCCEEDED"}
#: Every status an intent can be in (the API's ``Intent.Status``).
STATUSES = SETTLED_STATUSES | {
    "AWAITING_APPROVAL", "READY", "RUNNING", "UNKNOWN", "COMPENSATING", "HELD",
}  # fmt: skip
#: The API's long-poll bound (``GET /api/v1/intents/{id}?wait=N``, 0 < N <= 30 seconds).
MAX_LONG_POLL_SECONDS = 30
#: How long ``wait`` sleeps between two reads when the server answered at once with nothing new
#: (a server without the long-poll answers every read at once).
POLL_INTERVAL_SECONDS = 0.5
DEFAULT_TIMEOUT_SECONDS = 10.0
#: Prefix of the keys ``derive_idempotency_key`` makes; the version names the derivation.
DERIVED_KEY_PREFIX = "derived-v1-"
#: Prefix of the references ``derive_reference`` makes; the version names the derivation.
DERIVED_REFERENCE_PREFIX = "derived-ref-v1-"


@dataclass(frozen=True)
class Outcome:
    """The newest evidence of an intent's effect: ``provider_reference`` (the provider's id of
    the effect), ``source`` (how it was learnt: the call's response, a lookup, an operator)."""

    source: str
    provider_reference: str
    response_digest: str
    created_at: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        return cls(
            source=str(data.get("source") or ""),
            provider_reference=str(data.get("provider_reference") or ""),
            response_digest=str(data.get("response_digest") or ""),
            created_at=str(data.get("created_at") or ""),
        )


@dataclass(frozen=True)
class Intent:
    """An intent as the API represents it (``IntentSerializer``). The main members are typed
    here; ``data`` is the whole JSON object (fields added later to the API are there).

    ``console_url``: the page a person opens for it (the approval page while AWAITING_APPROVAL),
    from the API's ``links.console``; ``None`` when the server does not give one.
    ``resolution``: an operator's resolution of it, when there is one (the API's
    ``resolution`` object). ``replayed``: this answer to a submission is the intent an earlier
    submission with the same key created (``Idempotent-Replayed: true``). ``held_behind``: while
    HELD, the earlier intent for the same business action it waits behind. ``likely_duplicate``:
    ``{"earlier_intent", "reason", "at"}`` when it is HELD for a person or REJECTED because that
    earlier intent already made its effect (do not submit it again).
    """

    intent_id: str
    status: str
    action: str
    action_version: int
    arguments: dict[str, Any]
    reference: str
    request_hash: str
    outcome: Outcome | None
    last_error: str
    approval_expires_at: str | None
    created_at: str
    updated_at: str
    console_url: str | None = None
    resolution: dict[str, Any] | None = None
    replayed: bool = False
    held_behind: str | None = None
    likely_duplicate: dict[str, Any] | None = None
    data: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def settled(self) -> bool:
        """True in SUCCEEDED and the terminal states (``SETTLED_STATUSES``)."""
        return self.status in SETTLED_STATUSES

    @classmethod
    def from_json(cls, data: dict[str, Any], *, replayed: bool = False) -> Intent:
        outcome = data.get("outcome")
        links = data.get("links")
        resolution = data.get("resolution")
        duplicate = data.get("likely_duplicate")
        return cls(
            intent_id=str(data["intent_id"]),
            status=str(data["status"]),
            action=str(data.get("action") or ""),
            action_version=int(data.get("action_version") or 1),
            arguments=dict(data.get("arguments") or {}),
            reference=str(data.get("reference") or ""),
            request_hash=str(data.get("request_hash") or ""),
            outcome=Outcome.from_json(outcome) if isinstance(outcome, dict) else None,
            last_error=str(data.get("last_error") or ""),
            approval_expires_at=data.get("approval_expires_at"),
            created_at=str(data.get("created_at") or ""),
            updated_at=str(data.get("updated_at") or ""),
            console_url=links.get("console") if isinstance(links, dict) else None,
            resolution=resolution if isinstance(resolution, dict) else None,
            replayed=replayed,
            held_behind=str(data["held_behind"]) if data.get("held_behind") else None,
            likely_duplicate=duplicate if isinstance(duplicate, dict) else None,
            data=data,
        )


def idempotency_key_problem(key: str) -> str:
    """What is wrong with ``key`` as an ``Idempotency-Key`` ("" when nothing): the API takes 1-255
    printable ASCII characters (docs/how-to/connect-an-agent.md); checked here so that a key an
    HTTP header cannot carry is a clear refusal, not an encoding error."""
    if not isinstance(key, str) or not 1 <= len(key) <= 255 or not all(" " <= c <= "~" for c in key):
        return f"idempotency_key must be 1-255 printable ASCII characters; got {key!r}"
    return ""


def _intent_path(intent_id: str) -> str:
    """``intents/<id>`` for an intent id; an id that is not a UUID is refused here, never put in
    a URL path (``../actions`` would name another resource)."""
    try:
        return f"intents/{uuid.UUID(str(intent_id))}"
    except ValueError:
        raise ValueError(f"intent_id must be a UUID (from submit_intent); got {intent_id!r}") from None


def derive_idempotency_key(
    run_id: str, action: str, arguments: dict[str, Any], *, action_version: int = 1, reference: str = ""
) -> str:
    """An idempotency key for a submission that came without one: the same run, action and
    arguments always give the same key, so a re-sent tool call never makes a second intent.

    The key is ``derived-v1-`` + sha256 hex of the RFC 8785 (JCS) canonical JSON of
    ``{"run": run_id, "action": ..., "action_version": ..., "arguments": ..., "reference": ...}``:
    the order of keys in ``arguments`` does not matter, any other difference does.

    Trade-off: two deliberately identical submissions in one run (the same charge twice, on
    purpose) collapse into one intent. Give them distinct ``reference`` values (or explicit
    idempotency keys) to make two. Raises ``ValueError`` for an empty ``run_id`` and
    ``rfc8785.CanonicalizationError`` for arguments JSON cannot carry (NaN, a non-string key).
    """
    if not run_id:
        raise ValueError("run_id must be a non-empty string")
    canonical = rfc8785.dumps(
        {
            "run": run_id,
            "action": action,
            "action_version": action_version,
            "arguments": arguments,
            "reference": reference,
        }
    )
    return DERIVED_KEY_PREFIX + hashlib.sha256(canonical).hexdigest()


def derive_reference(action: str, arguments: dict[str, Any], *, action_version: int = 1) -> str:
    """A business reference for a submission that names none: the same action, version and
    arguments always give the same reference, whoever sends them and in whatever run.

    The ledger holds a second intent for the same business reference while the first is open,
    and, once the first made its effect, within its policy's reuse window (24 hours for money by
    default) as a likely duplicate for a person. Without a reference there is nothing to
    recognise a repeated call by when it comes under a new idempotency key (a restarted agent,
    a new run); with this one, the same call is recognised. It is ``derived-ref-v1-`` + the first
    32 hex digits of the sha256 of the RFC 8785 canonical JSON of ``{"action", "action_version",
    "arguments"}``.

    Trade-off: the same action with the same arguments on purpose (the same amount for the same
    customer twice in a day) is held for a person; give each its own reference to make two.
    Raises ``rfc8785.CanonicalizationError`` for arguments JSON cannot carry.
    """
    canonical = rfc8785.dumps({"action": action, "action_version": action_version, "arguments": arguments})
    return DERIVED_REFERENCE_PREFIX + hashlib.sha256(canonical).hexdigest()[:32]


class EffectLedgerClient:
    """The ledger's HTTP API for one agent (``Authorization: Bearer <token>``).

    ``base_url``: the server's root (``http://127.0.0.1:8765``); ``timeout``: seconds for each
    request (connect and read; a long-poll read gets its wait on top). Use as a context manager
    or call ``close()``.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._http = httpx.Client(
            base_url=self.base_url + "/api/v1/",
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=timeout,
            transport=transport,
        )

    def __enter__(self) -> EffectLedgerClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        try:
            response = self._http.request(
                method,
                path,
                json=json,
                params=params,
                headers=headers,
                timeout=timeout if timeout is not None else self.timeout,
            )
        except httpx.TransportError as exc:
            raise LedgerUnreachable(f"{method} {self.base_url}/api/v1/{path}: {exc!r}") from exc
        if response.status_code >= 400:
            raise ProblemError.from_response(response)
        return response

    def list_actions(self) -> list[dict[str, Any]]:
        """``GET /api/v1/actions``: the actions this agent may submit, each
        ``{"action", "versions", "arguments_schema", "risk_tier", "needs_approval", ...}``."""
        results: list[dict[str, Any]] = self._request("GET", "actions").json()["results"]
        return results

    def preview(
        self,
        action: str,
        arguments: dict[str, Any],
        *,
        action_version: int = 1,
        reference: str | None = None,
    ) -> dict[str, Any]:
        """``POST /api/v1/intents/preview``: the dry run (summary, target, money, checks,
        ``needs_approval``, policy). Nothing is stored."""
        payload: dict[str, Any] = {"action": action, "action_version": action_version, "arguments": arguments}
        if reference is not None:
            payload["reference"] = reference
        result: dict[str, Any] = self._request("POST", "intents/preview", json=payload).json()
        return result

    def submit(
        self,
        action: str,
        arguments: dict[str, Any],
        *,
        idempotency_key: str,
        action_version: int = 1,
        reference: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Intent:
        """``POST /api/v1/intents`` with ``Idempotency-Key``. The same key and request again
        answer the same intent (``Intent.replayed``); the same key with another request is a
        422 problem ``idempotency-key-reused``. ``metadata`` is stored, not part of the request's
        identity.

        Raises:
            ValueError: ``idempotency_key`` is not 1-255 printable ASCII (nothing is sent).
        """
        problem = idempotency_key_problem(idempotency_key)
        if problem:
            raise ValueError(problem)
        payload: dict[str, Any] = {"action": action, "action_version": action_version, "arguments": arguments}
        if reference is not None:
            payload["reference"] = reference
        if metadata is not None:
            payload["metadata"] = metadata
        response = self._request(
            "POST", "intents", json=payload, headers={"Idempotency-Key": idempotency_key}
        )
        return Intent.from_json(
            response.json(), replayed=response.headers.get("Idempotent-Replayed") == "true"
        )

    def get(self, intent_id: str) -> Intent:
        """``GET /api/v1/intents/{id}``; a 404 problem for an intent this agent may not see.

        Raises:
            ValueError: ``intent_id`` is not a UUID (nothing is sent).
        """
        return Intent.from_json(self._request("GET", _intent_path(intent_id)).json())

    def cancel(self, intent_id: str, *, reason: str = "") -> Intent:
        """``POST /api/v1/intents/{id}/cancel``; a 409 problem once it started running."""
        return Intent.from_json(
            self._request("POST", f"{_intent_path(intent_id)}/cancel", json={"reason": reason}).json()
        )

    def wait(self, intent_id: str, *, timeout_seconds: float, status: str | None = None) -> Intent:
        """The intent once its status differs from ``status`` (default: its status now) or is
        settled (``SETTLED_STATUSES``), or as it is at ``timeout_seconds``.

        Each read is the API's long-poll ``GET /api/v1/intents/{id}?wait=N&status=S`` (the server
        answers when the intent leaves S or after N <= 30 seconds); a server without it answers
        at once, and the loop then reads again every ``POLL_INTERVAL_SECONDS``.
        """
        if status is not None and status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(sorted(STATUSES))}; got {status!r}")
        deadline = time.monotonic() + max(0.0, timeout_seconds)
        intent = self.get(intent_id)
        watched = status if status is not None else intent.status
        while intent.status == watched and not intent.settled:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if remaining < 1:
                time.sleep(min(POLL_INTERVAL_SECONDS, remaining))
                intent = self.get(intent_id)
                continue
            wait = min(MAX_LONG_POLL_SECONDS, math.floor(remaining))
            started = time.monotonic()
            response = self._request(
                "GET",
                _intent_path(intent_id),
                params={"wait": wait, "status": watched},
                timeout=self.timeout + wait,
            )
            intent = Intent.from_json(response.json())
            if intent.status == watched and time.monotonic() - started < 1:
                time.sleep(min(POLL_INTERVAL_SECONDS, max(0.0, deadline - time.monotonic())))
        return intent
