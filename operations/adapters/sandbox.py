"""Adapters for the built-in sandbox provider (``manage.py sandbox_provider``).

Each class speaks to one sandbox product over HTTP and mirrors a real provider contract:

* payments (``payments.charge``, ``payments.refund``): honours idempotency keys and fences;
  lookup by key is authoritative (Stripe-style).
* email (``email.send``): no key support; our key travels as the Message-ID; lookup by
  Message-ID is eventually consistent.
* reservations (``reservations.create``, ``reservations.cancel``): no keys, no lookup by key;
  list by our reference only; compensation is ``reservations.cancel``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from operations.adapters.base import Adapter, Capabilities, LookupKind, Preview

CURRENCY = {"type": "string", "pattern": "^[A-Z]{3}$", "description": "ISO 4217 code, upper case"}
REFERENCE = {"type": "string", "minLength": 1, "maxLength": 200}

CHARGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "amount": {"type": "integer", "minimum": 1, "maximum": 10**12, "description": "minor units"},
        "currency": CURRENCY,
        "customer": {"type": "string", "minLength": 1, "maxLength": 200},
        "reference": REFERENCE,
        "description": {"type": "string", "maxLength": 1000},
    },
    "required": ["amount", "currency", "customer"],
    "additionalProperties": False,
}

REFUND_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "charge": {"type": "string", "minLength": 1, "maxLength": 200, "description": "provider charge id"},
        "amount": {"type": "integer", "minimum": 1, "maximum": 10**12, "description": "minor units"},
        "currency": CURRENCY,
        "reference": REFERENCE,
        "reason": {"type": "string", "maxLength": 1000},
    },
    "required": ["charge", "amount", "currency"],
    "additionalProperties": False,
}

EMAIL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "to": {"type": "string", "pattern": "^[^@\\s]+@[^@\\s]+$", "maxLength": 320},
        "subject": {"type": "string", "minLength": 1, "maxLength": 500},
        "body": {"type": "string", "maxLength": 20000},
        "reference": REFERENCE,
    },
    "required": ["to", "subject", "body"],
    "additionalProperties": False,
}

RESERVATION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "resource": {"type": "string", "minLength": 1, "maxLength": 200},
        "start": {"type": "string", "format": "date-time", "minLength": 1, "maxLength": 40},
        "seats": {"type": "integer", "minimum": 1, "maximum": 1000},
        "reference": REFERENCE,
    },
    "required": ["resource", "start", "seats", "reference"],
    "additionalProperties": False,
}

CANCEL_RESERVATION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reservation": {"type": "string", "minLength": 1, "maxLength": 200},
        "reference": REFERENCE,
        "reason": {"type": "string", "maxLength": 1000},
    },
    "required": ["reservation"],
    "additionalProperties": False,
}


def format_minor(amount: int, currency: str) -> str:
    """Render minor units for people, e.g. ``(12000, "EUR") -> "120.00 EUR"`` (two decimals)."""
    return f"{amount // 100:,}.{amount % 100:02d} {currency}"


class SandboxPaymentsAdapter(Adapter):
    """``payments.charge`` and ``payments.refund`` on the sandbox: keys honoured, fences
    enforced, lookup by key authoritative."""

    actions: ClassVar[tuple[str, ...]] = ("payments.charge", "payments.refund")
    capabilities = Capabilities(
        idempotency_keys=True,
        lookup=LookupKind.AUTHORITATIVE,
        compensation_action="payments.refund",
        fences=True,
    )
    argument_schemas: ClassVar[dict[str, dict[str, Any]]] = {
        "payments.charge": CHARGE_SCHEMA,
        "payments.refund": REFUND_SCHEMA,
    }

    def preview(self, action: str, arguments: dict[str, Any]) -> Preview:
        """Describe the charge or refund; no request is sent."""
        amount = format_minor(arguments["amount"], arguments["currency"])
        if action == "payments.refund":
            return Preview(
                summary=f"Refund {amount} of charge {arguments['charge']}",
                target=arguments["charge"],
                amount_minor=arguments["amount"],
                currency=arguments["currency"],
                scope="one refund against one existing charge",
            )
        return Preview(
            summary=f"Charge {amount} to {arguments['customer']}",
            target=arguments["customer"],
            amount_minor=arguments["amount"],
            currency=arguments["currency"],
            scope="one card charge on the customer's default payment method",
        )

    def compensation_arguments(self, action: str, arguments: dict[str, Any], provider_reference: str) -> dict[str, Any]:
        """A charge is offset by a full refund of the same amount."""
        if action != "payments.charge":
            raise NotImplementedError(f"{action} has no compensation")
        return {"charge": provider_reference, "amount": arguments["amount"], "currency": arguments["currency"]}


class SandboxEmailAdapter(Adapter):
    """``email.send`` on the sandbox: no keys; our key is the Message-ID; eventual lookup."""

    actions: ClassVar[tuple[str, ...]] = ("email.send",)
    capabilities = Capabilities(idempotency_keys=False, lookup=LookupKind.EVENTUAL)
    argument_schemas: ClassVar[dict[str, dict[str, Any]]] = {"email.send": EMAIL_SCHEMA}
    money_fields: ClassVar[tuple[str, ...]] = ()

    def preview(self, action: str, arguments: dict[str, Any]) -> Preview:
        """Describe the email; nothing is sent."""
        return Preview(
            summary=f"Send email {arguments['subject']!r} to {arguments['to']}",
            target=arguments["to"],
            scope="one email to one recipient",
        )


class SandboxReservationsAdapter(Adapter):
    """``reservations.create`` / ``reservations.cancel``: no keys, no lookup by key, list by
    our reference only; a duplicate is compensated by ``reservations.cancel``."""

    actions: ClassVar[tuple[str, ...]] = ("reservations.create", "reservations.cancel")
    capabilities = Capabilities(
        idempotency_keys=False,
        lookup=LookupKind.NONE,
        list_by_reference=True,
        compensation_action="reservations.cancel",
    )
    argument_schemas: ClassVar[dict[str, dict[str, Any]]] = {
        "reservations.create": RESERVATION_SCHEMA,
        "reservations.cancel": CANCEL_RESERVATION_SCHEMA,
    }
    money_fields: ClassVar[tuple[str, ...]] = ()

    def preview(self, action: str, arguments: dict[str, Any]) -> Preview:
        """Describe the reservation or its cancellation; nothing is booked."""
        if action == "reservations.cancel":
            return Preview(
                summary=f"Cancel reservation {arguments['reservation']}",
                target=arguments["reservation"],
                scope="one existing reservation",
            )
        return Preview(
            summary=f"Reserve {arguments['seats']} seat(s) of {arguments['resource']} at {arguments['start']}",
            target=arguments["resource"],
            scope=f"{arguments['seats']} seat(s)",
        )

    def compensation_arguments(self, action: str, arguments: dict[str, Any], provider_reference: str) -> dict[str, Any]:
        """A reservation is undone by cancelling it."""
        if action != "reservations.create":
            raise NotImplementedError(f"{action} has no compensation")
        return {"reservation": provider_reference, "reference": f"cancel:{provider_reference}"}
