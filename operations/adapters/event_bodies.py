"""Provider event bodies read through JSON pointers (issue 33): where a provider keeps each fact
of an event (``fields``: our name -> RFC 6901 pointer), e.g. for a Stripe ``charge.succeeded``::

    {"provider_reference": "/data/object/id", "amount": "/data/object/amount",
     "currency": "/data/object/currency", "reference": "/data/object/metadata/reference"}

Pure logic: no database, no settings. ``check_fields`` validates a source's configuration at
start-up; the signature schemes are ``operations.adapters.event_schemes``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from operations.adapters.events import (
    EARLIEST_CREATED,
    FIELD_LIMITS,
    LATEST_CREATED,
    EventFacts,
    EventInvalid,
    checked_text,
    event_object,
    key_from_message_id,
    occurred_at_from_rfc3339,
)
from operations.adapters.json_pointer import pointer_tokens, resolve_pointer

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
    payload = event_object(body)

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
