"""The HTTP answer classifier's rules that need no provider: ``Retry-After`` parsing and the
provider deadline's margin (the rest of the table runs in test_provider_conformance)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from django.core.checks import run_checks

from operations.adapters.errors import AmbiguousOutcome, RetryableError, TerminalError
from operations.adapters.http_classifier import error_for, retry_after_seconds
from operations.adapters.http_support import HttpAnswer
from operations.engine.protocol import provider_deadline_seconds

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def answer(status: int, headers: dict[str, str] | None = None, body: bytes = b"") -> HttpAnswer:
    return HttpAnswer(status, httpx.Headers(headers or {}), body, "", 0.0)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "5"}, 5.0),
        ({"Retry-After": "Thu, 01 Jan 2026 12:00:07 GMT"}, 7.0),
        ({"Retry-After": "Thu, 01 Jan 2026 12:00:07 GMT", "Date": "Thu, 01 Jan 2026 12:00:05 GMT"}, 2.0),
        ({"Retry-After": "Thu, 01 Jan 2026 11:00:00 GMT"}, 0.0),
        ({"Retry-After": "9" * 5000}, 86_400.0),
        ({"Retry-After": "soon"}, None),
        ({"Retry-After": "-3"}, None),
        ({}, None),
    ],
    ids=[
        "delta-seconds",
        "HTTP-date",
        "HTTP-date from the Date header",
        "past",
        "huge",
        "garbage",
        "negative",
        "none",
    ],
)
def test_retry_after_is_read_as_rfc_9110_says(headers: dict[str, str], expected: float | None) -> None:
    assert retry_after_seconds(answer(429, headers), now=NOW) == expected


@pytest.mark.parametrize(
    ("status", "body", "raised", "code"),
    [
        (409, b'{"error": {"code": "request_in_progress"}}', AmbiguousOutcome, "request_in_progress"),
        (409, b"<html>conflict</html>", AmbiguousOutcome, "request_in_progress"),
        (422, b'{"error": {"code": "idempotency_key_reused"}}', TerminalError, "idempotency_key_reused"),
        (
            402,
            b'{"type": "https://p.test/errors/card_declined", "title": "Declined"}',
            TerminalError,
            "card_declined",
        ),
        (408, b"", RetryableError, "http_408"),
        (302, b"", AmbiguousOutcome, "redirect_not_followed"),
        (500, b"", AmbiguousOutcome, "http_500"),
    ],
)
def test_error_answers_follow_the_table(status: int, body: bytes, raised: type, code: str) -> None:
    error = error_for(answer(status, body=body))
    assert type(error) is raised and error.detail["code"] == code


def test_i22_2_a_stale_fence_409_means_a_newer_attempt_exists_never_a_refusal() -> None:
    # given: the provider has seen a higher fence for this key and applied nothing for ours
    stale = answer(409, body=b'{"error": {"code": "stale_fence", "message": "fencing token 1 < 2"}}')

    # when
    error = error_for(stale)

    # then: ambiguous (the newer attempt may have applied it), not terminal, not "in progress"
    assert isinstance(error, AmbiguousOutcome) and not isinstance(error, TerminalError)
    assert error.detail == {"code": "stale_fence", "status": 409}
    assert error.retry_after_seconds is None
    assert "newer attempt" in str(error)


def test_in_progress_carries_a_delay_and_429_its_retry_after() -> None:
    assert error_for(answer(409)).retry_after_seconds == 1.0
    assert error_for(answer(409, {"Retry-After": "3"})).retry_after_seconds == 3.0
    assert error_for(answer(429, {"Retry-After": "4"})).retry_after_seconds == 4.0
    assert error_for(answer(503)).retry_after_seconds is None


@pytest.mark.parametrize(
    ("lease", "timeout", "margin", "deadline"),
    [(30, 10.0, 2.0, 10.0), (6, 10.0, 2.0, 3.0), (3, 10.0, 2.0, 1.0), (30, 40.0, 20.0, 10.0)],
)
def test_provider_deadline_is_shorter_than_the_lease_by_the_margin(
    settings: Any, lease: int, timeout: float, margin: float, deadline: float
) -> None:
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "LEASE_SECONDS": lease,
        "PROVIDER_TIMEOUT_SECONDS": timeout,
        "PROVIDER_DEADLINE_MARGIN_SECONDS": margin,
    }
    assert provider_deadline_seconds() == deadline


def test_a_margin_as_long_as_the_lease_is_refused_by_the_system_check(settings: Any) -> None:
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "LEASE_SECONDS": 2,
        "PROVIDER_DEADLINE_MARGIN_SECONDS": 2.0,
    }
    assert "operations.E002" in {message.id for message in run_checks()}
