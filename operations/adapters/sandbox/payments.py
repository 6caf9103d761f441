"""The sandbox adapter for payments.charge / payments.refund on the sandbox provider."""

from __future__ import annotations

from dataclasses import replace
from datetime import date
from typing import Any, ClassVar

from operations.adapters import http_classifier as answers
from operations.adapters import http_support as http
from operations.adapters.base import (
    Capabilities,
    ExecutionCall,
    ExecutionResult,
    LookupKind,
    LookupResult,
    LookupStatus,
    Preview,
    StatementEntry,
)
from operations.adapters.errors import AdapterError
from operations.adapters.sandbox.common import (
    CHARGE_SCHEMA,
    REFUND_SCHEMA,
    SandboxAdapter,
    fetch_statement,
    format_minor,
    inconclusive,
    provider_id,
    sandbox_event_secret,
    sandbox_url,
    with_reference,
)


class SandboxPaymentsAdapter(SandboxAdapter):
    """``payments.charge`` and ``payments.refund`` on the sandbox: keys honoured, fences
    enforced, lookup by key authoritative."""

    actions: ClassVar[tuple[str, ...]] = ("payments.charge", "payments.refund")
    capabilities = Capabilities(
        idempotency_keys=True,
        lookup=LookupKind.AUTHORITATIVE,
        compensation_action="payments.refund",
        fences=True,
    )
    #: Its signed events (issue 19): ``POST /providers/sandbox-payments/events``.
    evidence_source: ClassVar[str] = "sandbox-payments"
    #: What the sandbox sends for payments (console/lab/sandbox_provider/payments.py).
    event_types: ClassVar[dict[str, str]] = {
        "charge.created": "charge",
        "charge.succeeded": "charge",
        "charge.refunded": "charge",
        "refund.succeeded": "refund",
    }
    proving_event_types: ClassVar[dict[str, str]] = {
        "charge.succeeded": "payments.charge",
        "refund.succeeded": "payments.refund",
    }

    def event_secret(self) -> str:
        """The sandbox's event secret (``sandbox_event_secret``)."""
        return sandbox_event_secret(self.evidence_source)

    #: The action versions served (issue 21: declared by the adapter, not a constant).
    versions: ClassVar[dict[str, tuple[int, ...]]] = {"payments.charge": (1,), "payments.refund": (1,)}
    argument_schemas: ClassVar[dict[str, dict[str, Any]]] = {
        "payments.charge": CHARGE_SCHEMA,
        "payments.refund": REFUND_SCHEMA,
    }
    #: A charge affects its customer; a refund, the charge it refunds.
    target_fields: ClassVar[dict[str, str]] = {"payments.charge": "customer", "payments.refund": "charge"}

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
        body is the arguments and the reference only: no intent_id, so an agent's retry after a
        restore lost the intent (a new intent_id, the same provider key: issue 22) sends the same
        parameters and is answered with the charge already made rather than refused as a key
        reused with other parameters. A key replay comes back with ``replayed=True``.

        Returns:
            ``ExecutionResult(provider_reference="ch_…"/"re_…", detail={status, object, amount
            (minor units), currency, state})``.

        Raises:
            RetryableError: not sent (connection refused, connect timeout).
            TerminalError: 402 ``card_declined``, 404 unknown charge, 422 ``amount_too_large`` /
                ``idempotency_key_reused``, 400 validation; ``detail["code"]``.
            NewerAttemptExists: 409 ``stale_fence``: the sandbox has seen a higher fence for the
                key; a newer attempt may have charged (UNKNOWN, then a lookup by key).
            AmbiguousOutcome: deadline hit after send, dropped connection, 5xx, any other 409
                (``request_in_progress``), an unreadable 2xx or one over the size cap (the
                table in ``http_classifier``).
        """
        path = "/v1/refunds" if call.action == "payments.refund" else "/v1/charges"
        body = with_reference(call)
        response = http.send(
            "POST",
            sandbox_url(path),
            deadline_seconds=call.deadline_seconds,
            json=body,
            headers={"Idempotency-Key": call.idempotency_key, "X-Fencing-Token": str(call.fence)},
        )
        data = answers.expect_success(response)
        summary = {k: data.get(k) for k in ("object", "amount", "currency")}
        return answers.success_result(
            response, provider_reference=provider_id(data), detail={**summary, "state": data.get("status")}
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
                deadline_seconds=call.deadline_seconds,
                params={"idempotency_key": call.idempotency_key},
            )
        except AdapterError as exc:
            return inconclusive(exc)
        if not response.is_success:
            return inconclusive(code=answers.error_code(response), status=response.status_code)
        body = answers.json_object(response)
        if body is None:
            return inconclusive(code="unreadable_success", status=response.status_code)
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
            return inconclusive(code="request_in_progress")
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

    def statement(self, day: date, *, deadline_seconds: float = 30.0) -> list[StatementEntry]:
        """The sandbox's payments statement of ``day`` (``common.fetch_statement``)."""
        return fetch_statement("payments", day, deadline_seconds)
