"""The declared HTTP adapter: any HTTP API, its contract written in configuration (issue 33).

Configured per action in ``settings.EFFECT_LEDGER_GENERIC_HTTP`` (or the JSON file
``EFFECT_LEDGER_GENERIC_HTTP_FILE`` names). The contract's fields and what each means are in
``operations.adapters.contract`` and docs/reference/provider-contract.md; the Stripe entry shipped there reads::

    "stripe.charge": {
        "url": "https://api.stripe.com/v1/charges",
        "encoding": "form",                                        # json (default) or form
        "auth": {"scheme": "bearer", "secret": "env:STRIPE_SECRET_KEY"},  # named, never written
        "keys": {"header": "Idempotency-Key", "deduplicates": true},       # or "none"
        "body": {"amount": "{amount}", "currency": "{currency|lower}", "customer": "{customer}",
                 "metadata": {"reference": "{reference}", "idempotency_key": "{idempotency_key}"}},
        "lookup": {"url": "https://api.stripe.com/v1/charges?customer={customer}&limit=100",
                   "by": "reference", "items": "/data",
                   "fields": {"id": "/id", "status": "/status", "reference": "/metadata/reference",
                              "idempotency_key": "/metadata/idempotency_key"},
                   "proving_statuses": ["succeeded"], "consistency_window_seconds": 60},
        "compensation": {"action": "stripe.refund", "arguments": {"charge": "{provider_reference}",
                         "amount": "{amount}", "currency": "{currency}"}},
        "events": {"source": "stripe", "scheme": "stripe", "secret": "env:STRIPE_WEBHOOK_SECRET", ...},
        "schema": {...}, "timeout_seconds": 10, "test_mode": false
    }

Every configured action is registered to this adapter (``registry.py``), each with a subclass of
its own built from its contract (``operations.adapters.declared_actions``). Outcomes follow the
classification table in ``http_classifier``; whether the engine may resend under the same key
after an ambiguous answer is the contract's ``keys.deduplicates`` (``Capabilities``), so a
provider without keys goes to a lookup or a person, never a second request.

Events (issue 19): with ``events`` the provider's events are received at
``POST /providers/<source>/events``. Without a ``scheme`` they are Standard Webhooks (headers
``webhook-id``, ``webhook-timestamp``, ``webhook-signature``; 5 minutes' tolerance) with the
sandbox provider's body shape (``operations.adapters.events``)::

    {"id": "<event id == webhook-id>", "type": "transfer.succeeded", "created": "<RFC 3339>",
     "data": {"object": "transfer", "id": "<provider reference>", "idempotency_key": "<our key>",
              "reference": "<business reference>", "amount": 1200, "currency": "EUR"}}

``data.idempotency_key`` (the key we sent), ``data.reference`` or ``data.id`` (the id our
execute recorded, ``id_field``) match it to its intent. A type in ``proving_types`` proves the
action's effect exists; other types are recorded only. With ``types`` (every type the provider
sends; ``proving_types`` must be among them) an event of another type is refused 400 and
nothing is stored; without it any type is accepted, but only the proving types prove anything.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar, cast
from urllib.parse import urlsplit

from operations.adapters import contract_checks as checks
from operations.adapters import event_bodies as bodies
from operations.adapters import event_schemes as schemes
from operations.adapters import http_classifier as answers
from operations.adapters import http_support as http
from operations.adapters import secrets as named
from operations.adapters.base import (
    Adapter,
    Capabilities,
    ExecutionCall,
    ExecutionResult,
    LookupKind,
    LookupResult,
    LookupStatus,
    Preview,
)
from operations.adapters.contract import STANDARD_WEBHOOKS, Contract
from operations.adapters.declared_lookup import body_reference, read_lookup
from operations.adapters.errors import RetryableError, TerminalError
from operations.adapters.events import EventFacts, EventInvalid, parse_event_body
from operations.adapters.templates import TemplateValueMissing, form_pairs, render, render_url


class GenericHttpAdapter(Adapter):
    """Execute one declared action at its provider, as its contract says
    (``operations.adapters.contract``): keys or none, JSON or form body, named credentials,
    a lookup read through JSON pointers, a compensation built from the original's arguments.

    Use ``declared_actions.generic_http_adapter(action)`` to get the instance for an action:
    each action gets its own subclass so its capabilities and schema reflect its configuration.
    """

    action_name: ClassVar[str] = ""
    config: ClassVar[dict[str, Any]] = {}
    contract: ClassVar[Contract]
    capabilities = Capabilities(idempotency_keys=True, lookup=LookupKind.NONE)

    @property
    def test_endpoint(self) -> bool:
        """Whether the configuration marks the endpoint as a provider's test mode
        (``"test_mode": true``): ``manage.py provider_probe`` runs only against such."""
        return self.contract.test_mode

    def receives_events(self) -> bool:
        """Only with an ``events`` entry: ``statements`` alone declares no inbox."""
        return "events" in self.config

    def _events(self) -> dict[str, Any]:
        return dict(self.config.get("events") or {})

    def event_secret(self) -> str:
        """The configuration's ``events.secret`` (a named secret read now, or a legacy literal
        ``whsec_``), else ``EFFECT_LEDGER_PROVIDER_EVENT_SECRETS[source]``; "" when neither can
        be read (every event is then refused)."""
        configured = str(self._events().get("secret", ""))
        if configured.startswith(("env:", "file:")):
            try:
                return named.resolve(configured)
            except named.SecretUnavailable:
                return ""
        return configured or super().event_secret()

    def verify_event(self, body: bytes, headers: Mapping[str, str]) -> str:
        """Verify the raw ``body`` with the source's ``events.scheme`` (default
        ``standard-webhooks``; ``stripe``, ``github-hmac``, ``slack-v0``:
        ``operations.adapters.event_schemes``) and its ``tolerance_seconds`` (default 300).
        Returns the signed delivery id, or "" where the scheme signs none (the body's id is used).

        Raises:
            EventSignatureInvalid: missing, wrong or stale signature, or no secret.
        """
        events = self._events()
        tolerance = float(events.get("tolerance_seconds", schemes.DEFAULT_TOLERANCE_SECONDS))
        scheme = str(events.get("scheme", STANDARD_WEBHOOKS))
        return schemes.verify(scheme, self.event_secret(), body, headers, tolerance_seconds=tolerance)

    def parse_event(self, body: bytes, *, webhook_id: str) -> EventFacts:
        """Read the body: through the ``events.fields`` pointers when the source declares a
        scheme other than Standard Webhooks or fields of its own
        (``event_schemes.parse_mapped_event``), else in the sandbox's shape (module docstring).
        A type in ``events.proving_types`` (default: any type ending in ``.succeeded``) proves
        this action's effect. With ``events.types`` a type not listed there is refused.

        Raises:
            EventInvalid: the body is not such an event, or of a type not in ``events.types``.
        """
        events = self._events()
        sent = events.get("types") or []
        listed = events.get("proving_types")
        if events.get("scheme", STANDARD_WEBHOOKS) != STANDARD_WEBHOOKS or "fields" in events:
            facts = bodies.parse_mapped_event(
                body, delivery_id=webhook_id, fields=events.get("fields") or {},
                proving_types=(), types=sent or None, proves_action="",
            )  # fmt: skip
        else:
            facts = parse_event_body(body, webhook_id=webhook_id, proving={}, types=dict.fromkeys(sent, ""))
        proves = facts.event_type in listed if listed else facts.event_type.endswith(".succeeded")
        if proves and not facts.provider_reference:
            raise EventInvalid(f"{facts.event_type!r} proves an effect but names no provider id of it"[:200])
        return replace(facts, proves_action=self.action_name) if proves else facts

    def _timeout(self, call: ExecutionCall) -> float:
        configured = self.config.get("timeout_seconds")
        return min(call.deadline_seconds, float(configured)) if configured else call.deadline_seconds

    def preview(self, action: str, arguments: dict[str, Any]) -> Preview:
        """Describe the request that ``execute`` would send; nothing is sent."""
        contract = self.contract
        amount, currency = arguments.get("amount"), arguments.get("currency")
        if contract.keys.deduplicates:
            scope = f"one request to the configured endpoint, deduplicated by its {contract.keys.header}"
        else:
            scope = "one request to the configured endpoint; the provider does not deduplicate, so a lost answer goes to a lookup or a person, never a resend"
        return Preview(
            summary=f"{action}: {contract.method} {_host(contract.url)}",
            target=self.target_for(action, arguments),
            amount_minor=amount if isinstance(amount, int) and not isinstance(amount, bool) else None,
            currency=currency if isinstance(currency, str) else None,
            scope=scope,
        )

    def target_for(self, action: str, arguments: dict[str, Any]) -> str:
        """The argument the configuration's ``target_field`` names; without one, the host the
        request goes to (``api.acme.test``): every intent of the action affects that endpoint."""
        name = self.config.get("target_field")
        if isinstance(name, str) and name:
            value = arguments.get(name) if isinstance(arguments, dict) else None
            return "" if isinstance(value, bool) or not isinstance(value, str | int) else str(value)
        return _host(self.contract.url)

    def _headers(self) -> dict[str, str]:
        """The configured headers and credentials, secrets read now.

        Raises:
            SecretUnavailable: a named secret cannot be read.
            TerminalError: a secret cannot travel in a header (CR, LF, NUL, non-ASCII:
                ``secret_unusable``); the message names the reference, never the value.
        """

        def read(name: str, reference: str) -> str:
            value = named.resolve(reference)
            problem = checks.check_header_value(name, value, reference=reference)
            if problem:
                raise TerminalError(problem, detail={"code": "secret_unusable"})
            return value

        headers = {
            name: read(name, value) if value.startswith(("env:", "file:")) else value
            for name, value in self.contract.headers.items()
        }
        auth = self.contract.auth
        if auth:
            secret = read(auth.get("header", "Authorization"), auth["secret"])
            if auth["scheme"] == "bearer":
                headers["Authorization"] = f"Bearer {secret}"
            elif auth["scheme"] == "basic":
                user, _, password = secret.partition(":")
                token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
                headers["Authorization"] = f"Basic {token}"  # RFC 7617 §2
            else:
                headers[auth["header"]] = secret
        return headers

    def execute(self, call: ExecutionCall) -> ExecutionResult:
        """Send the call as the contract says: the body (the arguments, or the ``body`` template
        rendered from them) as JSON or form fields, our key in the contract's key header (none
        for ``"keys": "none"``), the credentials read from their named secrets; the whole call
        within ``min(call.deadline_seconds, timeout_seconds)`` seconds and the answer under
        ``PROVIDER_RESPONSE_MAX_BYTES``.

        Returns:
            ``ExecutionResult(provider_reference=body[id_field], or the idempotency key when a
            readable JSON object (or a 204) has no id: the provider accepted it and knows it by
            our key; detail={"status", "id_from_body"}, replayed=Idempotent-Replayed header)``.

        Raises:
            RetryableError: a named secret cannot be read (``secret_unavailable``: nothing
                sent), and the table's retryable rows.
            TerminalError: the URL or body names a value the intent lacks
                (``template_value_missing``: nothing sent), and the table's terminal rows.
            AmbiguousOutcome: by the table in ``http_classifier`` (an unreadable 2xx, a
                redirect, a 409 in progress, a 5xx and a deadline or size cap hit after sending
                are ambiguous; a 409 ``stale_fence`` is ``NewerAttemptExists``). Whether the
                engine may then resend under the same key is the contract's
                ``keys.deduplicates`` (``Capabilities.same_key_retry_safe``), never this method.
        """
        contract, values = self.contract, _values(call)
        try:
            headers = self._headers()
            url = render_url(contract.url, values)
            body = call.arguments if contract.body is None else render(contract.body, values)
        except named.SecretUnavailable as exc:
            raise RetryableError(str(exc), detail={"code": "secret_unavailable"}) from exc
        except TemplateValueMissing as exc:
            raise TerminalError(str(exc), detail={"code": "template_value_missing"}) from exc
        if contract.keys.header:
            headers[contract.keys.header] = call.idempotency_key
        if self.config.get("fence_header"):
            headers[str(self.config["fence_header"])] = str(call.fence)
        form = form_pairs(body) if contract.encoding == "form" else None
        answer = http.send(
            contract.method,
            url,
            deadline_seconds=self._timeout(call),
            json=None if form is not None else body,
            form=form,
            headers=headers,
        )
        reply = answers.expect_success(answer, allow_no_content=True)
        provider_id = body_reference(reply.get(self.config.get("id_field", "id")))
        return answers.success_result(
            answer,
            provider_reference=provider_id if provider_id is not None else call.idempotency_key,
            detail={"id_from_body": provider_id is not None},
        )

    def lookup(self, call: ExecutionCall) -> LookupResult:
        """Ask the provider for the effects of ``call`` as the contract's ``lookup`` says
        (``operations.adapters.declared_lookup.read_lookup``); UNSUPPORTED without one. Never
        raises."""
        if self.contract.lookup is None:
            return LookupResult(status=LookupStatus.UNSUPPORTED)
        try:
            headers = self._headers()
        except (named.SecretUnavailable, TerminalError) as exc:
            code = "secret_unavailable" if isinstance(exc, named.SecretUnavailable) else "secret_unusable"
            return LookupResult(status=LookupStatus.INCONCLUSIVE, detail={"code": code, "error": str(exc)})
        return read_lookup(
            self.contract.lookup, call, _values(call), headers=headers, deadline_seconds=self._timeout(call)
        )

    def compensation_arguments(
        self, action: str, arguments: dict[str, Any], provider_reference: str
    ) -> dict[str, Any]:
        """The compensation's arguments: its ``arguments`` template rendered from the original's
        arguments and ``{provider_reference}`` (the effect to undo).

        Raises:
            NotImplementedError: the contract declares no compensation.
            TemplateValueMissing: the template names a value the original lacks.
        """
        compensation = self.contract.compensation
        if compensation is None:
            raise NotImplementedError(f"{action} declares no compensation")
        rendered = render(compensation.arguments, {**arguments, "provider_reference": provider_reference})
        return cast(dict[str, Any], rendered)


def _host(url: str) -> str:
    """The host and port of ``url`` only: a URL's user:password@ and query must never reach a page."""
    parts = urlsplit(url)
    return f"{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}"


def _values(call: ExecutionCall) -> dict[str, Any]:
    """What a template may name for ``call``: its arguments and its call values."""
    reference = call.reference or call.arguments.get("reference") or ""
    return {
        **call.arguments,
        "idempotency_key": call.idempotency_key,
        "reference": reference,
        "intent_id": call.intent_id,
        "fence": call.fence,
    }
