"""What the sandbox adapters share: argument schemas, URLs and small helpers for provider
answers. (The Message-ID that carries our key is ``operations.adapters.events.message_id_for``.)"""

from __future__ import annotations

from datetime import date
from typing import Any

from django.conf import settings

from operations.adapters import http_classifier as answers
from operations.adapters import http_support as http
from operations.adapters.base import Adapter, ExecutionCall, LookupResult, LookupStatus, StatementEntry
from operations.adapters.errors import AdapterError, AmbiguousOutcome
from operations.money import format_money

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
    """Render minor units for a preview sentence by the currency's ISO 4217 exponent, in the
    reader's locale (``operations.money.format_money``; en_US unless the request negotiated
    another): ``(12000, "EUR") -> "120.00 EUR"``, ``(125000, "JPY") -> "125,000 JPY"``,
    ``(1234, "KWD") -> "1.234 KWD"``, and ``"1,234 KWD"`` for a German reader. Previews are
    computed when shown, never stored, so the sentence and the page's Amount always agree."""
    return format_money(amount, currency)


#: Seconds a read (``list_by_reference``) may take when no call deadline applies.
READ_TIMEOUT_SECONDS = 10.0


def sandbox_url(path: str) -> str:
    """Absolute URL of ``path`` (e.g. ``/v1/charges``) on ``settings.SANDBOX_PROVIDER_URL``."""
    return str(settings.SANDBOX_PROVIDER_URL).rstrip("/") + path


def sandbox_event_secret(source: str) -> str:
    """The secret of a sandbox event source: ``EFFECT_LEDGER_PROVIDER_EVENT_SECRETS[source]``
    when set, else ``settings.SANDBOX_EVENTS_SECRET`` (one secret for the three sandbox sources)."""
    secrets = getattr(settings, "EFFECT_LEDGER_PROVIDER_EVENT_SECRETS", {}) or {}
    return str(secrets.get(source) or getattr(settings, "SANDBOX_EVENTS_SECRET", ""))


def call_reference(call: ExecutionCall) -> str | None:
    """The business reference of ``call``: ``call.reference``, else ``arguments["reference"]``."""
    reference = call.reference or call.arguments.get("reference")
    return str(reference) if reference else None


def with_reference(call: ExecutionCall) -> dict[str, Any]:
    body = dict(call.arguments)
    reference = call_reference(call)
    if reference and "reference" not in body:
        body["reference"] = reference
    return body


def provider_id(body: dict[str, Any]) -> str:
    """The ``id`` of a provider object; a success without one cannot be trusted."""
    provider_id = body.get("id")
    if not isinstance(provider_id, str) or not provider_id:
        raise AmbiguousOutcome("provider answered success without an id", detail={"code": "missing_id"})
    return provider_id


def inconclusive(error: AdapterError | None = None, **detail: Any) -> LookupResult:
    if error is not None:
        detail = {**error.detail, "error": str(error)[:300], **detail}
    return LookupResult(status=LookupStatus.INCONCLUSIVE, detail=detail)


def fetch_statement(product: str, day: date, deadline_seconds: float) -> list[StatementEntry]:
    """The sandbox's statement of ``product`` (``payments``, ``email``, ``reservations``) for
    ``day``: ``GET /v1/statements?date=YYYY-MM-DD&product=…`` (issue 19 contract), one
    ``StatementEntry`` per line (amount in minor units, None where no money moves).

    Raises:
        RetryableError / AmbiguousOutcome: the transport failed (``http_support.send``).
        AdapterError: a non-2xx answer (``code`` ``statement_refused``) or a body that is not
            the contract's shape (``code`` ``statement_unreadable``, naming the line).
    """
    response = http.send(
        "GET",
        sandbox_url("/v1/statements"),
        deadline_seconds=deadline_seconds,
        params={"date": day.isoformat(), "product": product},
    )
    if not response.is_success:
        raise AdapterError(
            f"the sandbox refused the {product} statement of {day}: HTTP {response.status_code}",
            detail={"code": "statement_refused", "status": response.status_code},
        )
    body = answers.json_object(response)
    lines = body.get("lines") if body is not None else None
    if not isinstance(lines, list):
        raise AdapterError(
            f"the sandbox's {product} statement of {day} is not a JSON object with a list of lines",
            detail={"code": "statement_unreadable"},
        )
    entries = []
    for number, line in enumerate(lines, start=1):
        amount = line.get("amount") if isinstance(line, dict) else None
        if (
            not isinstance(line, dict)
            or not isinstance(line.get("id"), str)
            or not line["id"]
            or not (amount is None or (isinstance(amount, int) and not isinstance(amount, bool)))
        ):
            raise AdapterError(
                f"line {number} of the sandbox's {product} statement of {day} is unreadable",
                detail={"code": "statement_unreadable", "line": number},
            )
        entries.append(
            StatementEntry(
                provider_reference=line["id"],
                # An email carries our key in its Message-ID (``<KEY@effect-ledger.local>``).
                idempotency_key=str(line.get("idempotency_key") or line.get("message_id") or ""),
                reference=str(line.get("reference") or ""),
                amount=amount,
                currency=str(line.get("currency") or "").upper(),
            )
        )
    return entries


class SandboxAdapter(Adapter):
    """What every sandbox adapter is: a client of the project's own test double, so sending a
    request twice costs nothing (``test_endpoint``, for ``manage.py provider_probe``)."""

    @property
    def test_endpoint(self) -> bool:
        """Always: the sandbox provider is a test endpoint."""
        return True
