"""Provider events as real providers sign and shape them (issue 33).

``operations.adapters.events`` knows one signature (Standard Webhooks) and one body shape (the
sandbox's). Real providers differ in both, so a source is described by two choices:

- a signature *scheme* (``SCHEMES``): how the raw body and headers are checked with the source's
  secret, and which header, if any, carries the id used to drop repeated deliveries;
- *fields*: JSON pointers (RFC 6901) from our names to where the provider's body keeps each
  fact (``operations.adapters.event_bodies.parse_mapped_event``).

Pure logic: no database, no settings. ``check_scheme`` validates a source's configuration at
start-up.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Mapping
from typing import Any, Protocol

from django.core.exceptions import ImproperlyConfigured

from operations.adapters.events import (
    FIELD_LIMITS,
    EventSignatureInvalid,
    verify_standard_webhook,
)

#: Seconds a signed timestamp may be off our clock, either way (Stripe's and Slack's advice).
DEFAULT_TOLERANCE_SECONDS = 300.0

_UNIX_TIME = re.compile(r"[0-9]{1,12}")
_HEX_SHA256 = "[0-9a-fA-F]{64}"


class SignatureScheme(Protocol):
    """Checks one request; returns the delivery id to deduplicate on, or "" (the body's id)."""

    def __call__(
        self,
        secret: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS,
        now: float | None = None,
    ) -> str: ...


# --- Signature schemes ------------------------------------------------------------------------


def _require_secret(secret: str) -> None:
    if not secret or not secret.strip():
        raise EventSignatureInvalid("no event secret is configured for this source")


def _header(headers: Mapping[str, str], name: str) -> str:
    """The one value of header ``name`` (any letter case), stripped.

    Raises:
        EventSignatureInvalid: absent, empty, or given twice in different letter cases.
    """
    wanted = name.lower()
    values = [value for key, value in headers.items() if key.lower() == wanted]
    if len(values) > 1:
        raise EventSignatureInvalid(f"the {name} header is given twice")
    if not values or not values[0].strip():
        raise EventSignatureInvalid(f"the {name} header is missing")
    return values[0].strip()


def _unix_time(text: str, name: str) -> int:
    """A signed timestamp: whole seconds since 1970 as ASCII digits (no sign, no spaces)."""
    if not _UNIX_TIME.fullmatch(text):
        raise EventSignatureInvalid(f"{name} is not a Unix time in seconds")
    return int(text)


def _check_window(timestamp: int, tolerance_seconds: float, now: float | None) -> None:
    """Refuse a signed timestamp more than ``tolerance_seconds`` before or after ``now``."""
    current = time.time() if now is None else now
    if timestamp < current - tolerance_seconds:
        raise EventSignatureInvalid(f"the signed timestamp is more than {tolerance_seconds:g} seconds old")
    if timestamp > current + tolerance_seconds:
        raise EventSignatureInvalid(
            f"the signed timestamp is more than {tolerance_seconds:g} seconds in the future"
        )


def _hex_equal(expected_hex: str, given_hex: str) -> bool:
    """Constant-time comparison of two hex digests (letter case ignored)."""
    return hmac.compare_digest(expected_hex.lower().encode("ascii"), given_hex.lower().encode("ascii"))


def verify_standard_webhooks(
    secret: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> str:
    """Standard Webhooks (https://www.standardwebhooks.com): ``webhook-id``, ``webhook-timestamp``,
    ``webhook-signature`` headers, ``secret`` as ``whsec_<base64>``. Returns the signed
    ``webhook-id``.

    The reference library checks the signature and its own 5-minute window against the
    system clock (``events.verify_standard_webhook``); ``tolerance_seconds`` and ``now`` are then
    applied as a second window, so a smaller tolerance narrows the check and a larger one
    cannot widen it.

    Raises:
        EventSignatureInvalid: no secret, a header missing or malformed, no matching signature,
            a timestamp outside either window.
    """
    event_id = verify_standard_webhook(secret, body, headers)
    timestamp = _unix_time(_header(headers, "webhook-timestamp"), "webhook-timestamp")
    _check_window(timestamp, tolerance_seconds, now)
    return event_id


def verify_stripe(
    secret: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> str:
    """Stripe: ``Stripe-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>...]`` (other schemes such
    as test mode's ``v0`` are ignored). Returns "": the event id is the body's ``id``.

    The signature is HMAC-SHA256 keyed with the endpoint secret (``whsec_...``, its UTF-8 bytes
    as they are, not base64-decoded) over ``"{t}.{body}"``; any one ``v1`` may match (two while a
    secret is rolled). Stripe docs, "Verify webhook signatures"
    (https://docs.stripe.com/webhooks#verify-webhook-signatures). The comparison is the
    ``stripe`` package's own (``stripe.WebhookSignature.verify_header``). That check refuses
    only *old* timestamps, against the system clock, so its window is turned off and ours,
    which refuses future ones too, is applied instead.

    Raises:
        EventSignatureInvalid: no secret, the header missing or malformed (not ``key=value``
            items, not exactly one ``t``, no ``v1``), a body that is not UTF-8, no matching
            ``v1``, ``t`` more than ``tolerance_seconds`` from ``now``.
    """
    # Imported here: the package takes a fifth of a second to import, and most installations
    # never receive a Stripe event.
    import stripe

    _require_secret(secret)
    header = _header(headers, "Stripe-Signature")
    items = [item.partition("=") for item in header.split(",")]
    if any(not key or not separator for key, separator, _ in items):
        raise EventSignatureInvalid("the Stripe-Signature header is not a list of key=value items")
    stamps = [value for key, _, value in items if key == "t"]
    if len(stamps) != 1:
        raise EventSignatureInvalid("the Stripe-Signature header must carry exactly one t=")
    timestamp = _unix_time(stamps[0], "Stripe-Signature t")
    if not any(key == "v1" for key, _, _ in items):
        raise EventSignatureInvalid("the Stripe-Signature header carries no v1 signature")
    try:  # Stripe signs the body as text
        payload = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EventSignatureInvalid("the body is not UTF-8, so Stripe's signature cannot match") from exc
    try:
        stripe.WebhookSignature.verify_header(payload, header, secret, tolerance=None)
    except stripe.SignatureVerificationError as exc:
        raise EventSignatureInvalid("no v1 signature in Stripe-Signature matches the body") from exc
    except (TypeError, ValueError) as exc:  # e.g. a v1 value that is not ASCII
        raise EventSignatureInvalid("the Stripe-Signature header is malformed") from exc
    _check_window(timestamp, tolerance_seconds, now)
    return ""


def verify_github_hmac(
    secret: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> str:
    """GitHub: ``X-Hub-Signature-256: sha256=<hex>``, HMAC-SHA256 keyed with the webhook secret's
    UTF-8 bytes over the raw body. Returns the ``X-GitHub-Delivery`` header (a GUID), required.

    GitHub signs no timestamp, so ``tolerance_seconds`` and ``now`` are unused and a captured
    delivery verifies for ever. It does not sign the ``X-GitHub-Delivery`` header either: the
    delivery-id deduplication drops GitHub's own redeliveries, but someone replaying a captured
    body under a new delivery id is stopped by nothing here. Treat GitHub events as evidence to
    match against an effect, never as commands. GitHub docs, "Validating webhook deliveries"
    (https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries).

    Raises:
        EventSignatureInvalid: no secret, a header missing, a signature not ``sha256=`` and 64
            hex digits, a delivery id longer than 200 characters or not printable, a signature
            that does not match.
    """
    _require_secret(secret)
    signature = _header(headers, "X-Hub-Signature-256")
    match = re.fullmatch(f"sha256=({_HEX_SHA256})", signature)
    if match is None:
        raise EventSignatureInvalid("the X-Hub-Signature-256 header is not sha256=<64 hex digits>")
    delivery_id = _header(headers, "X-GitHub-Delivery")
    if len(delivery_id) > FIELD_LIMITS["id"] or not delivery_id.isprintable():
        raise EventSignatureInvalid("the X-GitHub-Delivery header is malformed")
    expected = hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
    if not _hex_equal(expected, match.group(1)):
        raise EventSignatureInvalid("X-Hub-Signature-256 does not match the body")
    return delivery_id


def verify_slack_v0(
    secret: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> str:
    """Slack: ``X-Slack-Signature: v0=<hex>``, HMAC-SHA256 keyed with the app's signing secret
    (UTF-8 bytes) over ``v0:{X-Slack-Request-Timestamp}:{body}``; the timestamp must be within
    ``tolerance_seconds`` of ``now`` (Slack advises five minutes). Returns "": the id is the
    body's (``/event_id`` in the Events API). Slack docs, "Verifying requests from Slack"
    (https://api.slack.com/authentication/verifying-requests-from-slack).

    Raises:
        EventSignatureInvalid: no secret, a header missing or malformed, a signature that does
            not match, a timestamp outside the tolerance.
    """
    _require_secret(secret)
    stamp = _header(headers, "X-Slack-Request-Timestamp")
    timestamp = _unix_time(stamp, "X-Slack-Request-Timestamp")
    match = re.fullmatch(f"v0=({_HEX_SHA256})", _header(headers, "X-Slack-Signature"))
    if match is None:
        raise EventSignatureInvalid("the X-Slack-Signature header is not v0=<64 hex digits>")
    signed = b"v0:" + stamp.encode("ascii") + b":" + body
    expected = hmac.new(secret.encode("utf-8"), signed, hashlib.sha256).hexdigest()
    if not _hex_equal(expected, match.group(1)):
        raise EventSignatureInvalid("X-Slack-Signature does not match the body")
    _check_window(timestamp, tolerance_seconds, now)
    return ""


#: Every signature scheme a source may name.
SCHEMES: dict[str, SignatureScheme] = {
    "standard-webhooks": verify_standard_webhooks,
    "stripe": verify_stripe,
    "github-hmac": verify_github_hmac,
    "slack-v0": verify_slack_v0,
}


def check_scheme(name: Any, where: str) -> None:
    """Refuse a scheme name not in ``SCHEMES``; ``where`` names the configuration (e.g. a source).

    Raises:
        ImproperlyConfigured: naming ``where`` and the known schemes.
    """
    if not isinstance(name, str) or name not in SCHEMES:
        raise ImproperlyConfigured(
            f"{where}: unknown event signature scheme {name!r}; known: {', '.join(sorted(SCHEMES))}"
        )


def verify(
    scheme: str,
    secret: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS,
    now: float | None = None,
) -> str:
    """Check ``body`` and ``headers`` with the scheme named ``scheme`` (a key of ``SCHEMES``).

    Args:
        secret: the source's secret (never written into an error).
        body: the raw request body, exactly as received.
        headers: the request headers; names in any letter case.
        tolerance_seconds: how far a signed timestamp may be from ``now``, either way.
        now: Unix time in seconds (default: the system clock).

    Returns:
        The delivery id to deduplicate on, or "" when the scheme signs none (the body's id).

    Raises:
        ImproperlyConfigured: an unknown scheme.
        EventSignatureInvalid: as the scheme's function documents.
    """
    check_scheme(scheme, "verify")
    return SCHEMES[scheme](secret, body, headers, tolerance_seconds=tolerance_seconds, now=now)
