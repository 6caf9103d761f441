"""The one classifier of HTTP answers, shared by every HTTP adapter (generic and sandbox).

``execute`` raises what this table says; the engine then decides from the provider's
capabilities (``operations/engine/classification.py``): ``RetryableError`` → READY with the same key after a
delay, FAILED once the budget is spent; ``AmbiguousOutcome`` → READY with the same key where the
provider deduplicates on it and the budget allows, else UNKNOWN (never FAILED; an in-progress
answer, code ``request_in_progress``, waits without spending the budget, within the policy's
``retry.in_progress_patience_seconds``);
``NewerAttemptExists`` (an ``AmbiguousOutcome``) → UNKNOWN at once, for a lookup (never a
same-key retry, never FAILED); ``TerminalError`` → FAILED. A delay carried by the error
(``retry_after_seconds``, from ``Retry-After`` or the in-progress default) is a minimum for the
next attempt, capped by the policy's ``retry.cap_seconds`` and kept in PostgreSQL (the intent's
``not_before``).

=================================================  ===============================================
answer                                             raised (``detail["code"]``)
=================================================  ===============================================
never sent: connection refused, connect timeout,   ``RetryableError`` (``not_sent``,
no pooled connection, deadline hit before the      ``deadline_before_send``, ``bad_url``);
first byte was written, unusable URL               ``http_support.send``
sent, then: deadline hit (connect + send +         ``AmbiguousOutcome`` (``deadline_exceeded``,
headers + body), connection dropped, protocol      ``connection_dropped``, ``transport_error``)
or other transport error
any status, body larger than the cap               ``AmbiguousOutcome`` (``response_too_large``;
(``PROVIDER_RESPONSE_MAX_BYTES``)                  sha256 of the part read, nothing stored)
2xx, body a JSON object                            success (``expect_success`` returns it; each
                                                   adapter says what an id-less body means)
204, empty body                                    success where the adapter allows it (generic)
2xx, body not a JSON object (HTML, text, empty,    ``AmbiguousOutcome`` (``unreadable_success``):
array)                                             maybe applied, nobody can tell
3xx (redirects are never followed)                 ``AmbiguousOutcome`` (``redirect_not_followed``)
400 saying the Idempotency-Key is missing          ``TerminalError`` (``idempotency_key_missing``,
                                                   ``configuration_error``) — draft, Error Scenarios
400 otherwise (validation)                         ``TerminalError``
408 Request Timeout                                ``RetryableError``: the request was not
                                                   received whole (RFC 9110 §15.5.9)
409 ``stale_fence`` (the provider has seen a       ``NewerAttemptExists`` (``stale_fence``): a
higher fence for the key: a newer attempt,         newer attempt exists and may have applied the
perhaps one a database restore lost)               effect; UNKNOWN, reconcile — DESIGN.md
409 any other: ``request_in_progress``,            ``AmbiguousOutcome`` (the code, else
``idempotency_key_in_use``, a problem without      ``request_in_progress``) with
``code`` (the draft's shape), an unknown code,     ``retry_after_seconds``: ``Retry-After``, else
an unreadable body                                 1 s — draft, Error Scenarios
422 saying the key was reused with another         ``TerminalError`` (``idempotency_key_reused``)
payload                                            — draft, Error Scenarios
429 Too Many Requests                              ``RetryableError`` with ``Retry-After``
                                                   (RFC 6585 §4: refused unprocessed)
other 4xx (decline, not found, validation)         ``TerminalError``
503 Service Unavailable                            ``AmbiguousOutcome`` with ``Retry-After``
                                                   (RFC 9110 §15.6.4)
other 5xx (500, 502, 504, ...)                     ``AmbiguousOutcome``: it may have applied
=================================================  ===============================================

A 409 with a code we do not know is read as "in progress": the Idempotency-Key draft reserves
409 for a request still being processed under the same key, and for a keyed provider the
reading costs at most a same-key retry the provider deduplicates (then UNKNOWN for the
reconciler), whereas reading an in-progress answer as a refusal records FAILED for an effect
the provider may be applying. No 409 is a refusal.

A 409 ``stale_fence`` applied nothing for *our* request, but it says the provider has seen a
higher fence for the key: a newer attempt got further, possibly one the ledger no longer knows
about (a point-in-time restore or a failover to a lagging replica lost it, and the customer
may have been charged by it). Reading it as a refusal records FAILED for an effect that exists;
a same-key retry cannot settle it either (its fence may still be below the provider's, so it is
refused again while it spends the attempt budget). So it is ambiguous, and the reconciler's
lookup by key settles it — DESIGN.md, "When
the database goes back in time": a stale-fence answer means "a newer attempt exists"
(UNKNOWN), never FAILED; issue 22, item 2.

Sources: RFC 9110 (§10.2.3 ``Retry-After``, §15 status codes), RFC 6585 §4 (429), RFC 9457
(problem details: ``type``, ``title``, ``detail``; a ``type`` URI's last segment names the
problem when there is no ``code``), draft-ietf-httpapi-idempotency-key-header-06 ("Error
Scenarios": 400 missing key, 422 key reused with another payload, 409 request outstanding),
Stripe's error shape ``{"error": {"code": ...}}`` and its idempotency behaviour.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from operations.adapters.base import ExecutionResult
from operations.adapters.errors import (
    IN_PROGRESS_CODE,
    AdapterError,
    AmbiguousOutcome,
    NewerAttemptExists,
    RetryableError,
    TerminalError,
)
from operations.adapters.http_support import HttpAnswer

#: Codes that say the provider is still executing the same key (Stripe-style, the sandbox).
IN_PROGRESS_CODES = frozenset({IN_PROGRESS_CODE, "idempotency_key_in_use"})
#: 409 codes saying the provider has seen a higher fence for the key: a newer attempt exists.
NEWER_ATTEMPT_CODES = frozenset({"stale_fence"})
#: Codes for a key reused with another payload, and for a missing key.
KEY_REUSED_CODES = frozenset({"idempotency_key_reused"})
KEY_MISSING_CODES = frozenset({"idempotency_key_missing", "missing_idempotency_key"})
#: Seconds to wait before asking again about a request in progress without ``Retry-After``.
IN_PROGRESS_DELAY_SECONDS = 1.0
#: A ``Retry-After`` longer than this many seconds (a day) is read as this; the policy caps it.
RETRY_AFTER_MAX_SECONDS = 86_400.0


def response_json(answer: HttpAnswer) -> dict[str, Any]:
    """The body as a JSON object (``{}`` when it is empty, not JSON, or not an object)."""
    body = json_object(answer)
    return body if body is not None else {}


def json_object(answer: HttpAnswer) -> dict[str, Any] | None:
    """The body as a JSON object, or None when it is not one (empty, HTML, an array...): a
    lookup must then say INCONCLUSIVE, never read the silence as absence."""
    try:
        body = json.loads(answer.content)
    except (ValueError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) else None


def error_code(answer: HttpAnswer) -> str | None:
    """The provider's error code: ``body["error"]["code"]`` (Stripe's shape), ``body["code"]``,
    else the last path segment of an RFC 9457 problem ``type`` (``about:blank`` names none)."""
    body = response_json(answer)
    error = body.get("error")
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        return str(error["code"])
    if isinstance(body.get("code"), str):
        return str(body["code"])
    problem_type = body.get("type")
    if isinstance(problem_type, str) and problem_type not in ("", "about:blank"):
        segment = problem_type.rstrip("/").rsplit("/", 1)[-1]
        return segment[:100] or None
    return None


def _mentions_idempotency(answer: HttpAnswer) -> bool:
    """Whether an RFC 9457 problem (``type``, ``title``, ``detail``) is about the key."""
    body = response_json(answer)
    text = " ".join(str(body.get(field, "")) for field in ("type", "title", "detail"))
    return "idempotency" in text.lower()


def retry_after_seconds(answer: HttpAnswer, *, now: datetime | None = None) -> float | None:
    """The delay a ``Retry-After`` header asks for, in seconds (RFC 9110 §10.2.3), or None.

    ``delay-seconds`` is taken as is; an ``HTTP-date`` (RFC 9110 §5.6.7) is measured from the
    answer's own ``Date`` header when it has one (so clock skew between us and the provider
    does not count), else from ``now`` (default: the current UTC time). A date in the past is
    0; an unparseable value is None; anything over a day is read as a day.
    """
    value = answer.headers.get("Retry-After", "").strip()
    if not value:
        return None
    if value.isascii() and value.isdigit():
        return min(float(value[:12]), RETRY_AFTER_MAX_SECONDS)
    when = _http_date(value)
    if when is None:
        return None
    base = _http_date(answer.headers.get("Date", "")) or now or datetime.now(UTC)
    return min(max(0.0, (when - base).total_seconds()), RETRY_AFTER_MAX_SECONDS)


def _http_date(value: str) -> datetime | None:
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)  # HTTP-dates are GMT


def error_for(answer: HttpAnswer) -> AdapterError:
    """Classify a non-2xx answer by the module table.

    Returns:
        the exception to raise; ``detail`` carries ``code`` and ``status`` (and
        ``retry_after_seconds`` where a delay applies, ``location`` for a redirect,
        ``configuration_error`` for a missing key).
    """
    status = answer.status_code
    code = error_code(answer)
    detail: dict[str, Any] = {"code": code or f"http_{status}", "status": status}
    message = f"provider answered {status} {detail['code']}"
    if 300 <= status < 400:
        detail.update(code="redirect_not_followed", location=answer.headers.get("Location", "")[:500])
        return AmbiguousOutcome(
            f"provider answered {status} redirect_not_followed: redirects are never followed", detail=detail
        )
    if status == 409 and code in NEWER_ATTEMPT_CODES:
        return NewerAttemptExists(
            f"provider answered {status} {code}: the provider has seen a newer attempt for this key "
            "(a higher fence); it may have applied the effect",
            detail=detail,
        )
    if status == 409 or code in IN_PROGRESS_CODES:
        delay = retry_after_seconds(answer)
        delay = IN_PROGRESS_DELAY_SECONDS if delay is None else delay
        in_progress = code is None or code in IN_PROGRESS_CODES or _mentions_idempotency(answer)
        detail.update(code=IN_PROGRESS_CODE if in_progress else code, retry_after_seconds=delay)
        return AmbiguousOutcome(
            f"provider answered {status} {detail['code']}: a request with this key may still be in progress",
            detail=detail,
            retry_after_seconds=delay,
        )
    if status in (429, 503):
        delay = retry_after_seconds(answer)
        if delay is not None:
            detail["retry_after_seconds"] = delay
        error_class = RetryableError if status == 429 else AmbiguousOutcome
        return error_class(message, detail=detail, retry_after_seconds=delay)
    if status == 408:
        return RetryableError(message, detail=detail)
    if status == 400 and (code in KEY_MISSING_CODES or _mentions_idempotency(answer)):
        detail.update(code="idempotency_key_missing", configuration_error=True)
        return TerminalError(
            "provider answered 400 idempotency_key_missing: the Idempotency-Key header did not "
            "arrive; a configuration error (check the adapter's headers and any proxy)",
            detail=detail,
        )
    if status == 422 and (code in KEY_REUSED_CODES or _mentions_idempotency(answer)):
        detail["code"] = "idempotency_key_reused"
        return TerminalError(
            "provider answered 422 idempotency_key_reused: the key was reused with another payload",
            detail=detail,
        )
    if 400 <= status < 500:
        return TerminalError(message, detail=detail)
    return AmbiguousOutcome(message, detail=detail)


def expect_success(answer: HttpAnswer, *, allow_no_content: bool = False) -> dict[str, Any]:
    """Return the JSON object body of a 2xx answer.

    Args:
        allow_no_content: a 204 with an empty body counts as success and returns ``{}``
            (RFC 9110 §15.3.5: nothing to send back).

    Raises:
        TerminalError, RetryableError, AmbiguousOutcome: a non-2xx answer, via ``error_for``.
        AmbiguousOutcome: a 2xx whose body is not a JSON object (``unreadable_success``).
    """
    if not answer.is_success:
        raise error_for(answer)
    if allow_no_content and answer.status_code == 204 and not answer.content.strip():
        return {}
    body = json_object(answer)
    if body is None:
        content_type = answer.headers.get("Content-Type", "")[:100]
        raise AmbiguousOutcome(
            f"provider answered {answer.status_code} ({content_type or 'no content type'}) "
            "without a JSON object: cannot tell what was applied",
            detail={
                "code": "unreadable_success",
                "status": answer.status_code,
                "content_type": content_type,
                "response_digest": answer.digest,
            },
        )
    return body


def is_replayed(answer: HttpAnswer) -> bool:
    """Whether the provider answered from its idempotency cache (``Idempotent-Replayed: true``)."""
    return str(answer.headers.get("Idempotent-Replayed", "")).strip().lower() == "true"


def success_result(
    answer: HttpAnswer, *, provider_reference: str, detail: dict[str, Any] | None = None
) -> ExecutionResult:
    """Build the ``ExecutionResult`` of a 2xx ``answer`` (digest of its body as evidence)."""
    return ExecutionResult(
        provider_reference=provider_reference,
        response_digest=answer.digest,
        replayed=is_replayed(answer),
        detail={"status": answer.status_code, **(detail or {})},
    )
