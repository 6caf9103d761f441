"""Provider events as real providers sign and shape them (issue 33).

``operations.adapters.events`` knows one signature (Standard Webhooks) and one body shape (the
sandbox's). Real providers differ in both, so a source is described by two choices:

- a signature *scheme* (``SCHEMES``): how the raw body and headers are checked with the source's
  secret, and which header, if any, carries the id used to drop repeated deliveries;
- *fields* (``parse_mapped_event``): JSON pointers (RFC 6901) from our names to where the
  provider's body keeps each fact, e.g. for a Stripe ``charge.succeeded``::

      {"provider_reference": "/data/object/id", "amount": "/data/object/amount",
       "currency": "/data/object/currency", "reference": "/data/object/metadata/reference"}

Pure logic: no database, no settings. Wiring into a source's configuration is done elsewhere;
``check_scheme`` and ``check_fields`` validate that configuration at start-up.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from django.core.exceptions import ImproperlyConfigured

from operations.adapters.events import (
    EARLIEST_CREATED,
    FIELD_LIMITS,
    LATEST_CREATED,
    EventFacts,
    EventInvalid,
    EventSignatureInvalid,
    check_storable,
    checked_text,
    key_from_message_id,
    occurred_at_from_rfc3339,
    verify_standard_webhook,
)
from operations.api_json import loads_strict
from operations.json_pointer import pointer_tokens, resolve_pointer

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


# --- Mapped event bodies ----------------------------------------------------------------------

#: Our names for what an event says (``EventFacts``), each read through a pointer when mapped.
FIELD_NAMES = frozenset(
    {
        "id",
        "type",
        "created",
        "provider_reference",
        "reference",
        "idempotency_key",
        "amount",
        "currency",
        "object",
        "message_id",
    }
)

#: Pointers used when ``fields`` does not name the field; every other field is read only when
#: mapped (a default into one provider's shape would read the wrong thing in another's).
DEFAULT_FIELDS: Mapping[str, str] = {"id": "/id", "type": "/type", "created": "/created"}


def check_fields(fields: Any, where: str) -> None:
    """Refuse a ``fields`` mapping that ``parse_mapped_event`` cannot use.

    Args:
        fields: our field name (``FIELD_NAMES``) -> a JSON pointer (RFC 6901), or "" for a field
            not read (turns a ``DEFAULT_FIELDS`` entry off).
        where: names the configuration in the message (e.g. ``"acme-pay events.fields"``).

    Raises:
        ImproperlyConfigured: not a mapping, an unknown field name, a pointer that is not text,
            not "" and not starting with ``/``, or with a ``~`` not followed by 0 or 1.
    """
    if not isinstance(fields, Mapping):
        raise ImproperlyConfigured(f"{where}: must map field names to JSON pointers")
    for name, pointer in fields.items():
        if name not in FIELD_NAMES:
            raise ImproperlyConfigured(
                f"{where}: unknown event field {name!r}; known: {', '.join(sorted(FIELD_NAMES))}"
            )
        if not isinstance(pointer, str):
            raise ImproperlyConfigured(f"{where}: the pointer of {name!r} must be text")
        try:
            pointer_tokens(pointer)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{where}: the pointer of {name!r} ({pointer!r}): {exc}") from exc


def _created(value: Any, label: str) -> datetime | None:
    """``created``: an integer Unix time in seconds or RFC 3339 text, as aware UTC, or None."""
    if value is None:
        return None
    if isinstance(value, str):
        return occurred_at_from_rfc3339(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise EventInvalid(f"{label} must be an integer Unix time in seconds or RFC 3339 text")
    if not EARLIEST_CREATED.timestamp() <= value < LATEST_CREATED.timestamp():
        raise EventInvalid(f"{label} must be between 2000-01-01 and 2100-01-01 (UTC)")
    return datetime.fromtimestamp(value, UTC)


def _amount(value: Any, label: str) -> int | None:
    """``amount``: an integer of minor units in [0, 2**63), or None."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise EventInvalid(f"{label} must be an integer in minor units, or null")
    amount: int = value
    if amount < 0:
        raise EventInvalid(f"{label} must not be negative (minor units)")
    if amount >= 2**63:
        raise EventInvalid(f"{label} is out of range")
    return amount


def _currency(value: Any, label: str) -> str:
    """``currency``: three letters, upper-cased (Stripe sends ``eur``), or ""."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        raise EventInvalid(f"{label} must be text")
    code = value.upper()
    if not re.fullmatch(r"[A-Z]{3}", code):
        raise EventInvalid(f"{label} must be an ISO 4217 code")
    return code


def parse_mapped_event(
    body: bytes,
    *,
    delivery_id: str,
    fields: Mapping[str, str],
    proving_types: Collection[str],
    types: Collection[str] | None,
    proves_action: str,
) -> EventFacts:
    """Read a verified event body through the JSON pointers of ``fields``.

    A pointer that refers to nothing, or to JSON null, leaves its field absent ("" or None); one
    that refers to a value of the wrong JSON type refuses the event, naming our field and the
    pointer. Text fields must be JSON strings (a numeric id is refused: point at a textual one,
    such as GitHub's ``node_id``).

    The stored event id is ``delivery_id or`` the body's id: a scheme that signs a delivery id
    (Standard Webhooks, GitHub) deduplicates on it, and the body's id, when there is one, is
    checked but need not equal it (GitHub bodies carry none; a Standard Webhooks sender's
    ``webhook-id`` is signed, so it is the one to trust).

    Args:
        body: the raw, verified request body (UTF-8 JSON, an object).
        delivery_id: what the signature scheme returned ("" when it signs none).
        fields: our field name -> JSON pointer (``check_fields``), over ``DEFAULT_FIELDS``:
            ``id``, ``type``, ``created`` (integer Unix seconds or RFC 3339 text),
            ``provider_reference`` (the provider's id of the effect), ``reference``,
            ``idempotency_key``, ``amount`` (integer minor units), ``currency`` (three letters,
            upper-cased), ``object`` (the provider's object kind), ``message_id`` (our key read
            from ``<KEY@effect-ledger.local>`` when ``idempotency_key`` is absent).
        proving_types: the event types that prove the effect exists (``charge.succeeded``).
        types: every event type the source accepts; None or empty: any.
        proves_action: the action a proving type proves (``payments.charge``).

    Raises:
        EventInvalid: not strict JSON (``loads_strict``: NaN, duplicate names), not an object, a
            NUL or lone surrogate anywhere (``check_storable``), neither a delivery id nor a body
            id, no type, a type not in ``types``, a field of the wrong JSON type or too long
            (``events.FIELD_LIMITS``), ``amount`` not an integer in [0, 2**63), ``currency`` not
            three letters, ``created`` outside [2000-01-01, 2100-01-01) UTC, a proving type
            without a provider reference.
        ImproperlyConfigured: ``fields`` refused by ``check_fields``, or proving types without
            ``proves_action``.
    """
    check_fields(fields, "event fields")
    if proving_types and not proves_action:
        raise ImproperlyConfigured("event fields: proving types are given without the action they prove")
    pointers = {**DEFAULT_FIELDS, **fields}
    try:
        payload = loads_strict(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise EventInvalid(f"the body is not JSON: {exc}"[:200]) from exc
    if not isinstance(payload, dict):
        raise EventInvalid("the body must be a JSON object")
    check_storable(payload)

    def label(name: str) -> str:
        return f"{name} ({pointers[name]})"[:200] if pointers.get(name) else name

    def read(name: str) -> Any:
        pointer = pointers.get(name, "")
        return resolve_pointer(payload, pointer) if pointer else None

    def text(name: str, limit: int, *, required: bool = False) -> str:
        return checked_text(read(name), label(name), limit, required=required)

    body_id = text("id", FIELD_LIMITS["id"])
    event_id = checked_text(delivery_id or body_id, "the event id", FIELD_LIMITS["id"])
    if not event_id:
        raise EventInvalid("the event has no id: the scheme signs no delivery id and the body has none")
    event_type = text("type", FIELD_LIMITS["type"], required=True)
    if types and event_type not in types:
        raise EventInvalid(f"this source sends no events of type {event_type!r}"[:200])
    proves = event_type in proving_types
    provider_reference = text("provider_reference", FIELD_LIMITS["provider_reference"])
    # an event proving an effect must name it: without the provider's id it proves nothing
    if proves and not provider_reference:
        raise EventInvalid(f"the provider's id of the effect is required for {event_type!r}"[:200])
    key = text("idempotency_key", FIELD_LIMITS["idempotency_key"])
    if not key:
        key = key_from_message_id(text("message_id", 1000))
    return EventFacts(
        event_id=event_id,
        event_type=event_type,
        occurred_at=_created(read("created"), label("created")),
        idempotency_key=key,
        reference=text("reference", FIELD_LIMITS["reference"]),
        provider_reference=provider_reference,
        amount=_amount(read("amount"), label("amount")),
        currency=_currency(read("currency"), label("currency")),
        object_kind=text("object", 60),
        proves_action=proves_action if proves else "",
    )
