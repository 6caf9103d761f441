"""Provider events: verifying a signed event and reading what it says (issue 19).

A provider that *tells* (webhooks) sends ``POST /providers/<source>/events``. The adapter that
declares the source (``Adapter.evidence_source``) verifies the signature on the raw body
(``Adapter.verify_event``; Standard Webhooks by default, https://www.standardwebhooks.com) and
reads the verified body into ``EventFacts`` (``Adapter.parse_event``). This module holds the
shared pieces: the facts, the two refusals, the Standard Webhooks check and the reader of the
body shape the sandbox provider sends (and the generic HTTP adapter expects)::

    {"id": "evt_...", "type": "charge.succeeded", "created": "2026-12-02T05:38:24Z",
     "data": {"object": "charge", "id": "ch_...", "idempotency_key": "...",
              "message_id": "<KEY@effect-ledger.local>", "reference": "order-77",
              "amount": 1200, "currency": "EUR", "status": "succeeded"}}

Adapters never touch the ledger's tables: what an event proves is decided in
``reconciliation.events``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from standardwebhooks.webhooks import Webhook

from operations.strict_json import loads_strict

#: The longest field values stored (the ``ProviderEvent`` columns).
FIELD_LIMITS = {"id": 200, "type": 100, "idempotency_key": 255, "reference": 200, "provider_reference": 200}

#: ``created`` must fall in [EARLIEST, LATEST) once converted to UTC: a date outside is no
#: provider's clock (and years 1 or 9999 overflow once shifted to UTC or PostgreSQL's range).
EARLIEST_CREATED = datetime(2000, 1, 1, tzinfo=UTC)
LATEST_CREATED = datetime(2100, 1, 1, tzinfo=UTC)

#: Our key inside an email's Message-ID (``message_id_for``).
_MESSAGE_ID = re.compile(r"^<(?P<key>[^<>@\s]+)@effect-ledger\.local>$")


class EventSignatureInvalid(Exception):
    """The signature is missing, does not match, or its timestamp is outside the tolerance
    (Standard Webhooks: 5 minutes either way). Answered 401; nothing is stored."""


class EventInvalid(Exception):
    """A correctly signed body that is not an event this source sends (not JSON, not an object,
    a required field missing or of the wrong type, a type the source does not send, a NUL or
    text that is not UTF-8 anywhere). Answered 400; nothing is stored."""


@dataclass(frozen=True)
class EventFacts:
    """What one verified provider event says.

    Attributes:
        event_id: the provider's id of the event (one stored row per source and id).
        event_type: e.g. ``charge.succeeded``.
        occurred_at: when the provider says it happened (aware, UTC), or None.
        idempotency_key: our key for the effect, when the event carries it ("" otherwise).
        reference: the business reference, or "".
        provider_reference: the provider's id of the effect (``ch_...``), or "".
        amount: minor units (ISO 4217 exponent of ``currency``), or None.
        currency: ISO 4217 code, or "".
        object_kind: the provider's object (``charge``, ``refund``, ``email``, ``reservation``).
        proves_action: the action whose effect this event type proves exists
            (``charge.succeeded`` -> ``payments.charge``), or "" for a type that proves no
            effect (``charge.created``, ``charge.refunded``, ``reservation.cancelled``).
    """

    event_id: str
    event_type: str
    occurred_at: datetime | None
    idempotency_key: str
    reference: str
    provider_reference: str
    amount: int | None
    currency: str
    object_kind: str
    proves_action: str

    @property
    def proves_effect(self) -> bool:
        """Whether this event type proves that an effect exists at the provider."""
        return bool(self.proves_action)


def verify_standard_webhook(secret: str, body: bytes, headers: Mapping[str, str]) -> str:
    """Check a Standard Webhooks signature (``webhook-id``, ``webhook-timestamp``,
    ``webhook-signature``) of the raw ``body`` with ``secret`` (``whsec_<base64>``) and the
    package's tolerance of 5 minutes. Returns the ``webhook-id``.

    Raises:
        EventSignatureInvalid: no secret configured, a header missing or malformed, no matching
            ``v1`` signature, or a timestamp older or newer than the tolerance.
    """
    if not secret:
        raise EventSignatureInvalid("no event secret is configured for this source")
    wanted = {"webhook-id", "webhook-timestamp", "webhook-signature"}
    present = {name.lower(): value for name, value in headers.items() if name.lower() in wanted}
    try:
        Webhook(secret).verify(body, present, json_parse=False)
    except Exception as exc:  # the package raises several kinds for malformed headers
        raise EventSignatureInvalid(f"signature refused: {exc}"[:200]) from exc
    return present["webhook-id"]


def _text(data: Mapping[str, Any], name: str, limit: int, *, required: bool = False) -> str:
    return checked_text(data.get(name), name, limit, required=required)


def checked_text(value: Any, name: str, limit: int, *, required: bool = False) -> str:
    """The JSON value ``value`` of the field ``name`` as text: "" for null or "" (absent).

    Raises:
        EventInvalid: absent while ``required``, not a string, longer than ``limit``
            characters or holding a NUL.
    """
    if value is None or value == "":
        if required:
            raise EventInvalid(f"{name} is required")
        return ""
    if not isinstance(value, str):
        raise EventInvalid(f"{name} must be a string")
    if len(value) > limit or "\x00" in value:
        raise EventInvalid(f"{name} is longer than {limit} characters or holds a NUL")
    return value


def occurred_at_from_rfc3339(value: Any) -> datetime | None:
    """``created`` as an aware UTC datetime, or None when absent.

    Raises:
        EventInvalid: not an RFC 3339 timestamp with a zone, or its UTC value outside
            [2000-01-01, 2100-01-01) (``EARLIEST_CREATED``/``LATEST_CREATED``).
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise EventInvalid("created must be an RFC 3339 timestamp")
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise EventInvalid("created must be an RFC 3339 timestamp") from exc
    if moment.tzinfo is None:
        raise EventInvalid("created must carry a time zone (RFC 3339)")
    try:
        moment = moment.astimezone(UTC)
    except OverflowError as exc:  # year 1 east of UTC, year 9999 west of it
        raise EventInvalid("created must be between 2000-01-01 and 2100-01-01 (UTC)") from exc
    if not EARLIEST_CREATED <= moment < LATEST_CREATED:
        raise EventInvalid("created must be between 2000-01-01 and 2100-01-01 (UTC)")
    return moment


def check_storable(payload: Any) -> None:
    """Refuse a parsed JSON value that cannot be stored as PostgreSQL ``jsonb``: any string,
    object keys included, holding a NUL (U+0000) or text that cannot be encoded as UTF-8 (a
    lone surrogate such as ``"\\ud800"``). Walks the value without recursion.

    Raises:
        EventInvalid: naming what was found.
    """
    stack: list[Any] = [payload]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str):
            if "\x00" in value:
                raise EventInvalid("the event holds a NUL character")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise EventInvalid("the event holds text that is not UTF-8 (a lone surrogate)") from exc


def message_id_for(idempotency_key: str) -> str:
    """The RFC 5322 Message-ID that carries our key: ``<{idempotency_key}@effect-ledger.local>``
    (every email adapter sends it, the sandbox's and SMTP's; ``key_from_message_id`` reads it
    back from a provider's event or statement)."""
    return f"<{idempotency_key}@effect-ledger.local>"


def event_object(body: bytes) -> dict[str, Any]:
    """A verified event body as a storable JSON object (strict JSON, ``check_storable``).

    Raises:
        EventInvalid: not strict UTF-8 JSON, not an object, or not storable as ``jsonb``.
    """
    try:
        payload = loads_strict(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise EventInvalid(f"the body is not JSON: {exc}"[:200]) from exc
    if not isinstance(payload, dict):
        raise EventInvalid("the body must be a JSON object")
    check_storable(payload)
    return payload


def key_from_message_id(message_id: str) -> str:
    """Our idempotency key inside a Message-ID ``<KEY@effect-ledger.local>``; "" if not ours."""
    match = _MESSAGE_ID.match(message_id.strip())
    return match.group("key") if match else ""


def parse_event_body(
    body: bytes,
    *,
    webhook_id: str,
    proving: Mapping[str, str],
    types: Mapping[str, str] | None = None,
) -> EventFacts:
    """Read a verified event body of the shape in the module docstring.

    Args:
        body: the raw, verified request body (UTF-8 JSON).
        webhook_id: the signed ``webhook-id`` header; it must equal the body's ``id``.
        proving: event type -> the action whose effect that type proves
            (``{"charge.succeeded": "payments.charge"}``); other types prove nothing.
        types: every event type the source sends -> the ``data.object`` that type carries
            (``{"charge.succeeded": "charge"}``; "" = any object). Empty or None: any type.

    Raises:
        EventInvalid: not strict JSON, not an object, a NUL or non-UTF-8 text anywhere
            (``check_storable``), ``id``/``type``/``data`` missing or of the wrong type, ``id``
            differs from ``webhook-id``, a type not in ``types``, ``data.object`` not the
            type's object, ``amount`` not an integer or negative, ``currency`` not three
            letters, ``created`` outside [2000-01-01, 2100-01-01) UTC, an effect-proving type
            without ``data.id`` (the provider's id of the effect).
    """
    payload = event_object(body)
    event_id = _text(payload, "id", FIELD_LIMITS["id"], required=True)
    if event_id != webhook_id:
        raise EventInvalid("the body's id differs from the signed webhook-id")
    event_type = _text(payload, "type", FIELD_LIMITS["type"], required=True)
    if types and event_type not in types:
        raise EventInvalid(f"this source sends no events of type {event_type!r}"[:200])
    data = payload.get("data")
    if not isinstance(data, dict):
        raise EventInvalid("data must be an object")
    object_kind = _text(data, "object", 60)
    wanted = (types or {}).get(event_type, "")
    if wanted and object_kind != wanted:
        raise EventInvalid(f"data.object must be {wanted!r} for {event_type!r}"[:200])
    amount = data.get("amount")
    if amount is not None and (isinstance(amount, bool) or not isinstance(amount, int)):
        raise EventInvalid("data.amount must be an integer in minor units, or null")
    if amount is not None and not 0 <= amount < 2**63:
        raise EventInvalid(
            "data.amount must not be negative (minor units)" if amount < 0 else "data.amount is out of range"
        )
    currency = _text(data, "currency", 3)
    if currency and not re.fullmatch(r"[A-Z]{3}", currency):
        raise EventInvalid("data.currency must be an ISO 4217 code")
    key = _text(data, "idempotency_key", FIELD_LIMITS["idempotency_key"])
    if not key:
        key = key_from_message_id(_text(data, "message_id", 1000))
    occurred_at = occurred_at_from_rfc3339(payload.get("created"))
    proves_action = proving.get(event_type, "")
    # an event proving an effect must name it: without the provider's id it proves nothing
    provider_reference = _text(data, "id", FIELD_LIMITS["provider_reference"])
    if proves_action and not provider_reference:
        raise EventInvalid(f"data.id (the provider's id of the effect) is required for {event_type!r}"[:200])
    return EventFacts(
        event_id=event_id,
        event_type=event_type,
        occurred_at=occurred_at,
        idempotency_key=key,
        reference=_text(data, "reference", FIELD_LIMITS["reference"]),
        provider_reference=provider_reference,
        amount=amount,
        currency=currency,
        object_kind=object_kind,
        proves_action=proves_action,
    )
