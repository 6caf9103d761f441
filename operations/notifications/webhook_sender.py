"""One webhook attempt: sign per the Standard Webhooks specification and POST, outside any
transaction (``operations.services.webhook_delivery`` claims before and records after).

Headers (Standard Webhooks, "Webhook headers"): ``webhook-id`` (the delivery's stable message
id), ``webhook-timestamp`` (this attempt's time, integer seconds since the epoch) and
``webhook-signature`` (``v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`` with the agent's
``whsec_`` secret, by the ``standardwebhooks`` package). Redirects are not followed (a 3xx is a
failed attempt): a redirect could lead the workers past the SSRF guard.
"""

from __future__ import annotations

import base64
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
from django.conf import settings
from standardwebhooks import Webhook

from operations.notifications.callback_urls import address_problem

USER_AGENT = "effect-ledger-webhooks/1"
#: Characters of a receiver's answer kept as the attempt's error.
ERROR_CHARS = 300


def new_secret() -> str:
    """A new signing secret in the Standard Webhooks form: ``whsec_`` + base64 of 32 random bytes
    (the specification asks for 24 to 64 bytes)."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def secret_hint(secret: str) -> str:
    """What may be shown of a secret once it was handed over: ``whsec_`` and its last 4 characters."""
    return f"whsec_…{secret[-4:]}" if secret else ""


@dataclass(frozen=True)
class AttemptResult:
    """What one POST gave: ``status_code`` (None: no answer), ``error`` ("" on a 2xx), the time
    it took in milliseconds."""

    status_code: int | None
    error: str
    duration_ms: int

    @property
    def delivered(self) -> bool:
        """A 2xx answer: the receiver took it (Standard Webhooks: any 2xx is success)."""
        return self.status_code is not None and 200 <= self.status_code < 300


def signed_headers(*, secret: str, message_id: str, body: str, at: datetime) -> dict[str, str]:
    """The headers of one attempt at time ``at`` (UTC)."""
    signature = Webhook(secret).sign(message_id, at, body)
    return {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": message_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
    }


def post_webhook(*, url: str, secret: str, message_id: str, body: str) -> AttemptResult:
    """Sign ``body`` now and POST it to ``url`` (the SSRF guard first: ``address_problem``).

    Timeouts: ``WEBHOOK_CONNECT_TIMEOUT_SECONDS`` to connect, ``WEBHOOK_TIMEOUT_SECONDS`` for the
    rest. Never raises for a network error: it becomes the result's ``error``."""
    clock = time.monotonic()

    def result(status_code: int | None, error: str) -> AttemptResult:
        return AttemptResult(status_code, error, int((time.monotonic() - clock) * 1000))

    refused = address_problem(url)
    if refused:
        return result(None, f"not sent: {refused}")
    conf = settings.EFFECT_LEDGER
    timeout = httpx.Timeout(conf["WEBHOOK_TIMEOUT_SECONDS"], connect=conf["WEBHOOK_CONNECT_TIMEOUT_SECONDS"])
    headers = signed_headers(secret=secret, message_id=message_id, body=body, at=datetime.now(UTC))
    try:
        with httpx.Client(timeout=timeout, follow_redirects=False) as client:
            response = client.post(url, content=body.encode(), headers=headers)
    except httpx.HTTPError as exc:
        return result(None, f"{type(exc).__name__}: {exc}"[:ERROR_CHARS])
    if 200 <= response.status_code < 300:
        return result(response.status_code, "")
    return result(response.status_code, f"HTTP {response.status_code}: {response.text[:ERROR_CHARS]}")
