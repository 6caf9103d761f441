"""The sandbox adapter for reservations.create / reservations.cancel on the sandbox provider."""

from __future__ import annotations

from dataclasses import replace
from datetime import date
from typing import Any, ClassVar
from urllib.parse import quote

from django.conf import settings

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
from operations.adapters.errors import AdapterError, RetryableError
from operations.adapters.sandbox.common import (
    CANCEL_RESERVATION_SCHEMA,
    READ_TIMEOUT_SECONDS,
    RESERVATION_SCHEMA,
    SandboxAdapter,
    call_reference,
    fetch_statement,
    inconclusive,
    provider_id,
    sandbox_event_secret,
    sandbox_url,
    with_reference,
)


class SandboxReservationsAdapter(SandboxAdapter):
    """``reservations.create`` / ``reservations.cancel``: no keys, no lookup by key, list by
    our reference only; a duplicate is compensated by ``reservations.cancel``."""

    actions: ClassVar[tuple[str, ...]] = ("reservations.create", "reservations.cancel")
    capabilities = Capabilities(
        idempotency_keys=False,
        lookup=LookupKind.NONE,
        list_by_reference=True,
        compensation_action="reservations.cancel",
    )
    #: Its signed events (issue 19): ``POST /providers/sandbox-reservations/events``.
    evidence_source: ClassVar[str] = "sandbox-reservations"
    #: What the sandbox sends for reservations (console/lab/sandbox_provider/reservations.py).
    event_types: ClassVar[dict[str, str]] = {
        "reservation.created": "reservation",
        "reservation.cancelled": "reservation",
    }
    proving_event_types: ClassVar[dict[str, str]] = {"reservation.created": "reservations.create"}

    def event_secret(self) -> str:
        """The sandbox's event secret (``sandbox_event_secret``)."""
        return sandbox_event_secret(self.evidence_source)

    #: The action versions served (issue 21: declared by the adapter, not a constant).
    versions: ClassVar[dict[str, tuple[int, ...]]] = {
        "reservations.create": (1,),
        "reservations.cancel": (1,),
    }
    argument_schemas: ClassVar[dict[str, dict[str, Any]]] = {
        "reservations.create": RESERVATION_SCHEMA,
        "reservations.cancel": CANCEL_RESERVATION_SCHEMA,
    }
    #: A booking affects the resource it reserves; a cancellation, the reservation it cancels.
    target_fields: ClassVar[dict[str, str]] = {
        "reservations.create": "resource",
        "reservations.cancel": "reservation",
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
            url, body = sandbox_url("/v1/reservations"), with_reference(call)
        response = http.send("POST", url, deadline_seconds=call.deadline_seconds, json=body)
        data = answers.expect_success(response)
        return answers.success_result(
            response,
            provider_reference=provider_id(data),
            detail={"state": data.get("status"), "reference": data.get("reference")},
        )

    def lookup(self, call: ExecutionCall) -> LookupResult:
        """Find what the provider holds for ``call``. Never raises.

        ``reservations.create``: lists by our reference (``call.reference``, else
        ``arguments["reference"]``) → FOUND with ALL reservation ids, oldest first (two or more
        are duplicates; ``detail["states"]`` gives each status); NOT_FOUND_YET when the list is
        empty (withdrawn items are hidden, so an empty list proves nothing: the reconciler never
        reads it as absence; only the restore guard, after the recovery's settle point, sends
        on it), INCONCLUSIVE when unreadable.
        ``reservations.cancel``: reads the reservation → FOUND when cancelled, ABSENT when still
        confirmed (cancel is idempotent), WITHDRAWN on 410, INCONCLUSIVE otherwise.
        """
        if call.action == "reservations.cancel":
            return self._lookup_cancel(call)
        reference = call_reference(call)
        if not reference:
            return inconclusive(code="no_reference")
        try:
            items = self._list(reference, deadline_seconds=call.deadline_seconds)
        except AdapterError as exc:
            return inconclusive(exc)
        if not items:
            # Nothing visible, which proves nothing (withdrawn items are hidden): never ABSENT.
            return LookupResult(
                status=LookupStatus.NOT_FOUND_YET, detail={"code": "empty_list", "reference": reference}
            )
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
        return [str(item["id"]) for item in self._list(reference, deadline_seconds=READ_TIMEOUT_SECONDS)]

    def _list(self, reference: str, *, deadline_seconds: float) -> list[dict[str, Any]]:
        try:
            response = http.send(
                "GET",
                sandbox_url("/v1/reservations"),
                deadline_seconds=deadline_seconds,
                params={"reference": reference},
            )
        except AdapterError as exc:
            raise RetryableError(f"listing reservations failed: {exc}", detail=exc.detail) from exc
        if not response.is_success:
            raise RetryableError(
                f"listing reservations answered {response.status_code}",
                detail={"code": answers.error_code(response), "status": response.status_code},
            )
        return [item for item in answers.response_json(response).get("data") or [] if item.get("id")]

    def _lookup_cancel(self, call: ExecutionCall) -> LookupResult:
        reservation = str(call.arguments.get("reservation", ""))
        try:
            response = http.send(
                "GET",
                sandbox_url(f"/v1/reservations/{quote(reservation, safe='')}"),
                deadline_seconds=call.deadline_seconds,
            )
        except AdapterError as exc:
            return inconclusive(exc)
        if response.status_code == 410:
            return LookupResult(status=LookupStatus.WITHDRAWN, detail={"reservation": reservation})
        if not response.is_success:
            return inconclusive(code=answers.error_code(response), status=response.status_code)
        state = answers.response_json(response).get("status")
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

    def statement_actions(self) -> tuple[str, ...]:
        """A cancellation changes a reservation's state; only a reservation is a statement line."""
        return ("reservations.create",)

    def statement(self, day: date, *, deadline_seconds: float = 30.0) -> list[StatementEntry]:
        """The sandbox's reservations statement of ``day`` (``common.fetch_statement``)."""
        return fetch_statement("reservations", day, deadline_seconds)
