"""HTTP plumbing shared by the HTTP adapters: one request, and the retry classification table.

The table (what ``execute`` raises for each way an HTTP call can end):

=====================================================  ===================================
connect error / connect timeout / pool timeout          ``RetryableError`` (never sent)
read or write timeout, dropped connection, protocol     ``AmbiguousOutcome`` (maybe applied)
error (``RemoteProtocolError``), any other transport
error after the request may have left
409 ``request_in_progress``                             ``AmbiguousOutcome`` (code kept)
409 ``stale_fence``, 422 ``idempotency_key_reused``     ``TerminalError`` (code kept)
429                                                     ``RetryableError`` (refused unprocessed)
other 4xx (validation, decline, missing, withdrawn)     ``TerminalError``
5xx                                                     ``AmbiguousOutcome``: the client cannot
                                                        tell whether it applied; the engine
                                                        decides from the capabilities whether a
                                                        same-key retry is safe
=====================================================  ===================================
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import httpx

from operations.adapters.base import (
    AdapterError,
    AmbiguousOutcome,
    ExecutionResult,
    RetryableError,
    TerminalError,
)

#: Error codes that say the provider is still executing the same key: retrying now is unsafe.
IN_PROGRESS_CODES = frozenset({"request_in_progress"})


_clients: dict[int, httpx.Client] = {}


def _client() -> httpx.Client:
    """One HTTP client per process (thread-safe; created after a fork, never inherited).

    Building a client costs tens of milliseconds (its TLS context), more than a loopback call,
    so it is made once. Idle keep-alive connections expire after 5 s; a request on a connection
    the server closed meanwhile fails as ``RemoteProtocolError`` and is classified ambiguous,
    which is the safe reading.
    """
    pid = os.getpid()
    client = _clients.get(pid)
    if client is None:
        _clients.clear()
        client = _clients[pid] = httpx.Client(
            follow_redirects=False, limits=httpx.Limits(keepalive_expiry=5.0)
        )
    return client


def send(
    method: str,
    url: str,
    *,
    timeout_seconds: float,
    json: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
) -> httpx.Response:
    """Send one HTTP request (no automatic retries, no redirects) and return the response.

    Args:
        timeout_seconds: bound of each phase (connect, write, read, pool), in seconds.

    Raises:
        RetryableError: the request was never sent (connection refused, connect timeout,
            no pooled connection, an unusable URL).
        AmbiguousOutcome: the request may have reached the provider (read or write timeout,
            connection dropped or closed without a response, protocol error).
    """
    try:
        return _client().request(
            method, url, json=json, headers=headers, params=params, timeout=httpx.Timeout(timeout_seconds)
        )
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
        raise RetryableError(f"{method} {url}: not sent ({exc!r})", detail={"code": "not_sent"}) from exc
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
        raise RetryableError(f"{method} {url}: bad provider URL ({exc})", detail={"code": "bad_url"}) from exc
    except httpx.TimeoutException as exc:
        raise AmbiguousOutcome(
            f"{method} {url}: timed out after the request was sent", detail={"code": "timeout"}
        ) from exc
    except httpx.RemoteProtocolError as exc:
        raise AmbiguousOutcome(
            f"{method} {url}: connection dropped without a complete response",
            detail={"code": "connection_dropped"},
        ) from exc
    except httpx.TransportError as exc:
        raise AmbiguousOutcome(
            f"{method} {url}: transport error {exc!r}", detail={"code": "transport_error"}
        ) from exc


def error_code(response: httpx.Response) -> str | None:
    """The provider's error code: ``body["error"]["code"]`` (Stripe shape) or ``body["code"]``."""
    try:
        body = response.json()
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        return str(error["code"])
    code = body.get("code")
    return code if isinstance(code, str) else None


def error_for(response: httpx.Response) -> AdapterError:
    """Classify a non-2xx response (see the module table); the detail carries ``code`` and ``status``.

    Returns:
        the exception to raise: ``TerminalError``, ``RetryableError`` or ``AmbiguousOutcome``.
    """
    status = response.status_code
    code = error_code(response) or f"http_{status}"
    detail = {"code": code, "status": status}
    message = f"provider answered {status} {code}"
    if code in IN_PROGRESS_CODES:
        return AmbiguousOutcome(message, detail=detail)
    if status == 429:
        return RetryableError(message, detail=detail)
    if 400 <= status < 500:
        return TerminalError(message, detail=detail)
    return AmbiguousOutcome(message, detail=detail)


def response_json(response: httpx.Response) -> dict[str, Any]:
    """The response body as a JSON object (``{}`` when it is empty or not an object)."""
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def digest(response: httpx.Response) -> str:
    """sha256 hex of the raw response body, as evidence."""
    return hashlib.sha256(response.content).hexdigest()


def is_replayed(response: httpx.Response) -> bool:
    """Whether the provider answered from its idempotency cache (``Idempotent-Replayed: true``)."""
    return bool(response.headers.get("Idempotent-Replayed", "").strip().lower() == "true")


def success_result(
    response: httpx.Response, *, provider_reference: str, detail: dict[str, Any] | None = None
) -> ExecutionResult:
    """Build the ``ExecutionResult`` of a 2xx ``response``."""
    return ExecutionResult(
        provider_reference=provider_reference,
        response_digest=digest(response),
        replayed=is_replayed(response),
        detail={"status": response.status_code, **(detail or {})},
    )


def expect_success(response: httpx.Response) -> dict[str, Any]:
    """Return the JSON body of a 2xx ``response``.

    Raises:
        TerminalError, RetryableError, AmbiguousOutcome: a non-2xx answer, via ``error_for``.
        AmbiguousOutcome: a 2xx without a JSON object body (cannot tell what was applied).
    """
    if not response.is_success:
        raise error_for(response)
    body = response_json(response)
    if not body:
        raise AmbiguousOutcome(
            f"provider answered {response.status_code} without a JSON object",
            detail={"code": "unreadable_success", "status": response.status_code},
        )
    return body
