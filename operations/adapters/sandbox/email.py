"""The sandbox adapter for email.send on the sandbox provider."""

from __future__ import annotations

from dataclasses import replace
from datetime import date
from typing import Any, ClassVar

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
from operations.adapters.errors import AdapterError
from operations.adapters.events import message_id_for
from operations.adapters.sandbox.common import (
    EMAIL_SCHEMA,
    SandboxAdapter,
    fetch_statement,
    inconclusive,
    provider_id,
    sandbox_event_secret,
    sandbox_url,
    with_reference,
)


class SandboxEmailAdapter(SandboxAdapter):
    """``email.send`` on the sandbox: no keys; our key is the Message-ID; eventual lookup."""

    actions: ClassVar[tuple[str, ...]] = ("email.send",)
    capabilities = Capabilities(idempotency_keys=False, lookup=LookupKind.EVENTUAL)
    #: Its signed events (issue 19): ``POST /providers/sandbox-email/events``.
    evidence_source: ClassVar[str] = "sandbox-email"
    #: What the sandbox sends for emails (console/lab/sandbox_provider/messaging.py).
    event_types: ClassVar[dict[str, str]] = {"email.sent": "email", "email.delivered": "email"}
    proving_event_types: ClassVar[dict[str, str]] = {
        "email.sent": "email.send",
        "email.delivered": "email.send",
    }

    def event_secret(self) -> str:
        """The sandbox's event secret (``sandbox_event_secret``)."""
        return sandbox_event_secret(self.evidence_source)

    #: The action versions served (issue 21: declared by the adapter, not a constant).
    versions: ClassVar[dict[str, tuple[int, ...]]] = {"email.send": (1,)}
    argument_schemas: ClassVar[dict[str, dict[str, Any]]] = {"email.send": EMAIL_SCHEMA}
    #: An email affects its recipient.
    target_fields: ClassVar[dict[str, str]] = {"email.send": "to"}
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
            deadline_seconds=call.deadline_seconds,
            json=with_reference(call),
            headers={"Message-ID": message_id},
        )
        data = answers.expect_success(response)
        return answers.success_result(
            response,
            provider_reference=provider_id(data),
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
                deadline_seconds=call.deadline_seconds,
                params={"message_id": message_id},
            )
        except AdapterError as exc:
            return inconclusive(exc)
        if response.status_code == 410:
            return LookupResult(status=LookupStatus.WITHDRAWN, detail={"message_id": message_id})
        if not response.is_success:
            return inconclusive(code=answers.error_code(response), status=response.status_code)
        ids = tuple(
            str(item["id"]) for item in answers.response_json(response).get("data") or [] if item.get("id")
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

    def statement(self, day: date, *, deadline_seconds: float = 30.0) -> list[StatementEntry]:
        """The sandbox's email statement of ``day`` (``common.fetch_statement``)."""
        return fetch_statement("email", day, deadline_seconds)
