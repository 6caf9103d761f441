"""Adapters for the built-in sandbox provider (``manage.py sandbox_provider``).

Each class speaks to one sandbox product over HTTP and mirrors a real provider contract:

* payments (``payments.charge``, ``payments.refund``): honours idempotency keys and fences;
  lookup by key is authoritative (Stripe-style).
* email (``email.send``): no key support; our key travels as the Message-ID; lookup by
  Message-ID is eventually consistent.
* reservations (``reservations.create``, ``reservations.cancel``): no keys, no lookup by key;
  list by our reference only; compensation is ``reservations.cancel``.

The base URL is ``settings.SANDBOX_PROVIDER_URL``; every request is bounded by the call's
``deadline_seconds``. How transport failures and error answers map to ``RetryableError`` /
``TerminalError`` / ``AmbiguousOutcome`` is the table in ``http_support``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar
from urllib.parse import quote

from django.conf import settings

from operations.adapters import http_support as http
from operations.adapters.base import (
    Adapter,
    AdapterError,
    Capabilities,
    ExecutionCall,
    ExecutionResult,
    LookupKind,
    LookupResult,
    LookupStatus,
    Preview,
    RetryableError,
)

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


#: Seconds a read (``list_by_reference``) may take when no call deadline applies.
READ_TIMEOUT_SECONDS = 10.0


def sandbox_url(path: str) -> str:
    """Absolute URL of ``path`` (e.g. ``/v1/charges``) on ``settings.SANDBOX_PROVIDER_URL``."""
    return str(settings.SANDBOX_PROVIDER_URL).rstrip("/") + path


def message_id_for(idempotency_key: str) -> str:
    """The RFC 5322 Message-ID that carries our key: ``<{idempotency_key}@effect-ledger.local>``."""
    return f"<{idempotency_key}@effect-ledger.local>"


def call_reference(call: ExecutionCall) -> str | None:
    """The business reference of ``call``: ``call.reference``, else ``arguments["reference"]``."""
    reference = call.reference or call.arguments.get("reference")
    return str(reference) if reference else None


def _with_reference(call: ExecutionCall) -> dict[str, Any]:
    body = dict(call.arguments)
    reference = call_reference(call)
    if reference and "reference" not in body:
        body["reference"] = reference
    return body


def _provider_id(body: dict[str, Any]) -> str:
    """The ``id`` of a provider object; a success without one cannot be trusted."""
    provider_id = body.get("id")
    if not isinstance(provider_id, str) or not provider_id:
        raise http.AmbiguousOutcome("provider answered success without an id", detail={"code": "missing_id"})
    return provider_id


def _inconclusive(error: AdapterError | None = None, **detail: Any) -> LookupResult:
    if error is not None:
        detail = {**error.detail, "error": str(error)[:300], **detail}
    return LookupResult(status=LookupStatus.INCONCLUSIVE, detail=detail)


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

    def capabilities_for(self, action: str) -> Capabilities:
        """A charge is compensated by a refund; a refund has no compensation of its own."""
        if action == "payments.refund":
            return replace(self.capabilities, compensation_action=None)
        return self.capabilities

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

    def execute(self, call: ExecutionCall) -> ExecutionResult:
        """POST the charge (``/v1/charges``) or refund (``/v1/refunds``) once.

        Sends ``Idempotency-Key: call.idempotency_key`` and ``X-Fencing-Token: call.fence``; the
        charge carries ``metadata.intent_id``. A key replay comes back with ``replayed=True``.

        Returns:
            ``ExecutionResult(provider_reference="ch_…"/"re_…", detail={status, object, amount
            (minor units), currency, state})``.

        Raises:
            RetryableError: not sent (connection refused, connect timeout).
            TerminalError: 402 ``card_declined``, 404 unknown charge, 422 ``amount_too_large`` /
                ``idempotency_key_reused``, 409 ``stale_fence``, 400 validation; ``detail["code"]``.
            AmbiguousOutcome: timeout after send, dropped connection, 5xx, 409 ``request_in_progress``.
        """
        path = "/v1/refunds" if call.action == "payments.refund" else "/v1/charges"
        body = _with_reference(call)
        if call.action == "payments.charge":
            body["metadata"] = {"intent_id": call.intent_id}
        response = http.send(
            "POST",
            sandbox_url(path),
            timeout_seconds=call.deadline_seconds,
            json=body,
            headers={"Idempotency-Key": call.idempotency_key, "X-Fencing-Token": str(call.fence)},
        )
        data = http.expect_success(response)
        summary = {k: data.get(k) for k in ("object", "amount", "currency")}
        return http.success_result(
            response, provider_reference=_provider_id(data), detail={**summary, "state": data.get("status")}
        )

    def lookup(self, call: ExecutionCall) -> LookupResult:
        """Ask the sandbox whether the charge or refund with ``call.idempotency_key`` exists.

        Authoritative (``GET /v1/charges?idempotency_key=K`` also reports the key's record):

        * a visible item → FOUND with its id;
        * no key record, a released key, or a stored error (e.g. a decline) → ABSENT: nothing
          was applied, a same-key retry is safe;
        * a key still ``processing`` → INCONCLUSIVE (``code: request_in_progress``);
        * a stored success whose item is hidden → WITHDRAWN;
        * transport errors or non-2xx answers → INCONCLUSIVE. Never raises.
        """
        path = "/v1/refunds" if call.action == "payments.refund" else "/v1/charges"
        try:
            response = http.send(
                "GET",
                sandbox_url(path),
                timeout_seconds=call.deadline_seconds,
                params={"idempotency_key": call.idempotency_key},
            )
        except AdapterError as exc:
            return _inconclusive(exc)
        if not response.is_success:
            return _inconclusive(code=http.error_code(response), status=response.status_code)
        body = http.response_json(response)
        items = [item for item in body.get("data") or [] if isinstance(item, dict) and item.get("id")]
        if items:
            return LookupResult(
                status=LookupStatus.FOUND,
                provider_references=tuple(str(item["id"]) for item in items),
                detail={"state": items[0].get("status"), "amount": items[0].get("amount")},
            )
        record = body.get("idempotency_key")
        if not isinstance(record, dict):
            return LookupResult(status=LookupStatus.ABSENT, detail={"key_record": None})
        state, stored_status = record.get("state"), record.get("status_code")
        if state == "processing":
            return _inconclusive(code="request_in_progress")
        if state == "done" and isinstance(stored_status, int) and 200 <= stored_status < 300:
            return LookupResult(status=LookupStatus.WITHDRAWN, detail={"key_state": state})
        return LookupResult(
            status=LookupStatus.ABSENT, detail={"key_state": state, "stored_status": stored_status}
        )

    def compensation_arguments(
        self, action: str, arguments: dict[str, Any], provider_reference: str
    ) -> dict[str, Any]:
        """A charge is offset by a full refund of the same amount."""
        if action != "payments.charge":
            raise NotImplementedError(f"{action} has no compensation")
        return {
            "charge": provider_reference,
            "amount": arguments["amount"],
            "currency": arguments["currency"],
        }


class SandboxEmailAdapter(Adapter):
    """``email.send`` on the sandbox: no keys; our key is the Message-ID; eventual lookup."""

    actions: ClassVar[tuple[str, ...]] = ("email.send",)
    capabilities = Capabilities(idempotency_keys=False, lookup=LookupKind.EVENTUAL)
    argument_schemas: ClassVar[dict[str, dict[str, Any]]] = {"email.send": EMAIL_SCHEMA}
    money_fields: ClassVar[tuple[str, ...]] = ()

    def capabilities_for(self, action: str) -> Capabilities:
        """No keys, an eventual lookup by Message-ID whose lag is at most
        ``settings.SANDBOX_EMAIL_CONSISTENCY_WINDOW_SECONDS``, and no compensation (a sent
        email cannot be unsent: a duplicate becomes a finding for operators)."""
        window = float(getattr(settings, "SANDBOX_EMAIL_CONSISTENCY_WINDOW_SECONDS", 120.0))
        return replace(self.capabilities, consistency_window_seconds=window)

    def execute(self, call: ExecutionCall) -> ExecutionResult:
        """POST the email once with ``Message-ID: <{idempotency_key}@effect-ledger.local>``.

        The sandbox does not deduplicate: every call that reaches it sends an email.

        Returns:
            ``ExecutionResult(provider_reference="em_…", detail={status, message_id, to})``.

        Raises:
            RetryableError: not sent. TerminalError: 4xx (validation).
            AmbiguousOutcome: timeout after send, dropped connection, 5xx.
        """
        message_id = message_id_for(call.idempotency_key)
        response = http.send(
            "POST",
            sandbox_url("/v1/emails"),
            timeout_seconds=call.deadline_seconds,
            json=_with_reference(call),
            headers={"Message-ID": message_id},
        )
        data = http.expect_success(response)
        return http.success_result(
            response,
            provider_reference=_provider_id(data),
            detail={"message_id": message_id, "to": data.get("to")},
        )

    def lookup(self, call: ExecutionCall) -> LookupResult:
        """Look the email up by its Message-ID (eventually consistent).

        FOUND with every email id carrying the Message-ID (two or more: duplicates);
        NOT_FOUND_YET when none is visible (never ABSENT: the read path lags); WITHDRAWN on 410;
        INCONCLUSIVE on transport errors or other answers. Never raises.
        """
        message_id = message_id_for(call.idempotency_key)
        try:
            response = http.send(
                "GET",
                sandbox_url("/v1/emails"),
                timeout_seconds=call.deadline_seconds,
                params={"message_id": message_id},
            )
        except AdapterError as exc:
            return _inconclusive(exc)
        if response.status_code == 410:
            return LookupResult(status=LookupStatus.WITHDRAWN, detail={"message_id": message_id})
        if not response.is_success:
            return _inconclusive(code=http.error_code(response), status=response.status_code)
        ids = tuple(
            str(item["id"]) for item in http.response_json(response).get("data") or [] if item.get("id")
        )
        if not ids:
            return LookupResult(status=LookupStatus.NOT_FOUND_YET, detail={"message_id": message_id})
        return LookupResult(
            status=LookupStatus.FOUND,
            provider_references=ids,
            detail={"message_id": message_id, "count": len(ids)},
        )

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

    def capabilities_for(self, action: str) -> Capabilities:
        """``reservations.create``: listed by reference; a late second booking (a request that
        lands after the client gave up) may appear for up to
        ``settings.SANDBOX_RESERVATIONS_CONSISTENCY_WINDOW_SECONDS``; compensated by
        ``reservations.cancel``. ``reservations.cancel`` reads the reservation itself and has
        no compensation."""
        if action == "reservations.cancel":
            return replace(
                self.capabilities,
                lookup=LookupKind.EVENTUAL,
                list_by_reference=False,
                compensation_action=None,
            )
        window = float(getattr(settings, "SANDBOX_RESERVATIONS_CONSISTENCY_WINDOW_SECONDS", 60.0))
        return replace(self.capabilities, consistency_window_seconds=window)

    def execute(self, call: ExecutionCall) -> ExecutionResult:
        """Create the reservation (``POST /v1/reservations``) or cancel one
        (``POST /v1/reservations/{reservation}/cancel``, idempotent at the provider).

        ``reservations.create`` is not deduplicated: a repeat books again (find duplicates
        with ``lookup`` / ``list_by_reference``).

        Returns:
            ``ExecutionResult(provider_reference="rsv_…", detail={status, state, reference})``.

        Raises:
            RetryableError: not sent. TerminalError: 4xx (validation, 404 unknown or 410
            withdrawn reservation on cancel). AmbiguousOutcome: timeout after send, dropped
            connection, 5xx.
        """
        if call.action == "reservations.cancel":
            reservation = quote(str(call.arguments["reservation"]), safe="")
            url, body = sandbox_url(f"/v1/reservations/{reservation}/cancel"), {}
        else:
            url, body = sandbox_url("/v1/reservations"), _with_reference(call)
        response = http.send("POST", url, timeout_seconds=call.deadline_seconds, json=body)
        data = http.expect_success(response)
        return http.success_result(
            response,
            provider_reference=_provider_id(data),
            detail={"state": data.get("status"), "reference": data.get("reference")},
        )

    def lookup(self, call: ExecutionCall) -> LookupResult:
        """Find what the provider holds for ``call``. Never raises.

        ``reservations.create``: lists by our reference (``call.reference``, else
        ``arguments["reference"]``) → FOUND with ALL reservation ids, oldest first (two or more
        are duplicates; ``detail["states"]`` gives each status); INCONCLUSIVE when the list is
        empty (withdrawn items are hidden, so an empty list proves nothing) or unreadable.
        ``reservations.cancel``: reads the reservation → FOUND when cancelled, ABSENT when still
        confirmed (cancel is idempotent), WITHDRAWN on 410, INCONCLUSIVE otherwise.
        """
        if call.action == "reservations.cancel":
            return self._lookup_cancel(call)
        reference = call_reference(call)
        if not reference:
            return _inconclusive(code="no_reference")
        try:
            items = self._list(reference, timeout_seconds=call.deadline_seconds)
        except AdapterError as exc:
            return _inconclusive(exc)
        if not items:
            return _inconclusive(code="empty_list", reference=reference)
        return LookupResult(
            status=LookupStatus.FOUND,
            provider_references=tuple(str(item["id"]) for item in items),
            detail={"reference": reference, "states": {str(i["id"]): i.get("status") for i in items}},
        )

    def list_by_reference(self, reference: str) -> list[str]:
        """Return the ids of every visible reservation with ``reference``, oldest first
        (cancelled ones included, withdrawn ones hidden by the provider).

        Raises:
            RetryableError: the provider could not be read (transport error or non-2xx).
        """
        return [str(item["id"]) for item in self._list(reference, timeout_seconds=READ_TIMEOUT_SECONDS)]

    def _list(self, reference: str, *, timeout_seconds: float) -> list[dict[str, Any]]:
        try:
            response = http.send(
                "GET",
                sandbox_url("/v1/reservations"),
                timeout_seconds=timeout_seconds,
                params={"reference": reference},
            )
        except AdapterError as exc:
            raise RetryableError(f"listing reservations failed: {exc}", detail=exc.detail) from exc
        if not response.is_success:
            raise RetryableError(
                f"listing reservations answered {response.status_code}",
                detail={"code": http.error_code(response), "status": response.status_code},
            )
        return [item for item in http.response_json(response).get("data") or [] if item.get("id")]

    def _lookup_cancel(self, call: ExecutionCall) -> LookupResult:
        reservation = str(call.arguments.get("reservation", ""))
        try:
            response = http.send(
                "GET",
                sandbox_url(f"/v1/reservations/{quote(reservation, safe='')}"),
                timeout_seconds=call.deadline_seconds,
            )
        except AdapterError as exc:
            return _inconclusive(exc)
        if response.status_code == 410:
            return LookupResult(status=LookupStatus.WITHDRAWN, detail={"reservation": reservation})
        if not response.is_success:
            return _inconclusive(code=http.error_code(response), status=response.status_code)
        state = http.response_json(response).get("status")
        if state == "cancelled":
            return LookupResult(
                status=LookupStatus.FOUND, provider_references=(reservation,), detail={"state": state}
            )
        return LookupResult(status=LookupStatus.ABSENT, detail={"state": state})

    def preview(self, action: str, arguments: dict[str, Any]) -> Preview:
        """Describe the reservation or its cancellation; nothing is booked."""
        if action == "reservations.cancel":
            return Preview(
                summary=f"Cancel reservation {arguments['reservation']}",
                target=arguments["reservation"],
                scope="one existing reservation",
            )
        return Preview(
            summary=(
                f"Reserve {arguments['seats']} seat(s) of {arguments['resource']} at {arguments['start']}"
            ),
            target=arguments["resource"],
            scope=f"{arguments['seats']} seat(s)",
        )

    def compensation_arguments(
        self, action: str, arguments: dict[str, Any], provider_reference: str
    ) -> dict[str, Any]:
        """A reservation is undone by cancelling it."""
        if action != "reservations.create":
            raise NotImplementedError(f"{action} has no compensation")
        return {"reservation": provider_reference, "reference": f"cancel:{provider_reference}"}
