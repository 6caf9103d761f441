"""A generic HTTP/JSON adapter for any API that honours an ``Idempotency-Key`` header.

Configured per action in ``settings.EFFECT_LEDGER_GENERIC_HTTP``::

    EFFECT_LEDGER_GENERIC_HTTP = {
        "acme.transfer": {
            "url": "https://api.acme.test/v1/transfers",          # required; POSTed as JSON
            "lookup_url": "https://api.acme.test/v1/transfers?idempotency_key={idempotency_key}",
            "schema": {...},                                       # JSON Schema of the arguments
            "timeout_seconds": 10,                                 # caps call.deadline_seconds (whole call)
            "headers": {"Authorization": "Bearer ..."},           # extra request headers
            "id_field": "id",                                      # optional, default "id"
            "fence_header": "X-Fencing-Token",                     # optional: send the fence
            "method": "POST",                                      # optional
            "versions": [1],                                       # optional: action_version values served
            "target_field": "account",                             # optional: the argument naming who
                                                                   # or what is affected (console lists)
            "events": {                                            # optional: the provider's signed events
                "source": "acme-pay",                              # slug: POST /providers/acme-pay/events
                "secret": "whsec_...",                             # Standard Webhooks secret (or set it in
                                                                   # EFFECT_LEDGER_PROVIDER_EVENT_SECRETS)
                "proving_types": ["transfer.succeeded"],           # optional; default: every type
                                                                   # ending in ".succeeded"
                "types": ["transfer.created", "transfer.succeeded"],  # optional: every type it
            },                                                     # sends; others refused (400)
        },
    }

Every configured action is registered to this adapter (``registry.py``). The arguments are sent
as the JSON body; the stored idempotency key goes in ``Idempotency-Key``. Outcomes follow the
classification table in ``http_classifier``. With ``lookup_url`` the lookup is treated as
authoritative (the API must answer by key from its committed state); without it, none.

Events (issue 19): with ``events`` the provider's events are received at
``POST /providers/<source>/events``, signed with Standard Webhooks (headers ``webhook-id``,
``webhook-timestamp``, ``webhook-signature``; a timestamp more than 5 minutes off is refused),
and must have the sandbox provider's body shape (``operations.adapters.events``)::

    {"id": "<event id == webhook-id>", "type": "transfer.succeeded", "created": "<RFC 3339>",
     "data": {"object": "transfer", "id": "<provider reference>", "idempotency_key": "<our key>",
              "reference": "<business reference>", "amount": 1200, "currency": "EUR"}}

``data.idempotency_key`` (the ``Idempotency-Key`` we sent), ``data.reference`` or ``data.id``
(the id our execute recorded, ``id_field``) match it to its intent. A type in
``proving_types`` proves the action's effect exists; other types are recorded only. With
``types`` (every type the provider sends; ``proving_types`` must be among them) an event of
another type is refused 400 and nothing is stored; without it any type is accepted, but only
the proving types prove anything. ``data.object`` is not checked (the configuration names no
objects).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from functools import cache
from typing import Any, ClassVar, cast
from urllib.parse import quote, urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from operations.adapters import http_classifier as answers
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
)
from operations.adapters.events import EventFacts, parse_event_body

#: An action without a ``schema`` accepts any JSON object.
ANY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


def generic_http_config() -> dict[str, dict[str, Any]]:
    """Return ``settings.EFFECT_LEDGER_GENERIC_HTTP`` (``{}`` when unset).

    Raises:
        ImproperlyConfigured: the setting is not a mapping of action → ``{"url": ..., ...}``.
    """
    config = getattr(settings, "EFFECT_LEDGER_GENERIC_HTTP", None) or {}
    if not isinstance(config, dict):
        raise ImproperlyConfigured("EFFECT_LEDGER_GENERIC_HTTP must be a dict of action -> config")
    for action, entry in config.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("url"), str) or not entry["url"]:
            raise ImproperlyConfigured(f"EFFECT_LEDGER_GENERIC_HTTP[{action!r}] needs a 'url'")
        if "events" in entry:
            _check_events(action, entry["events"])
        if "statements" in entry:
            _check_statements(action, entry)
    return config


_SLUG = re.compile(r"[a-z0-9][a-z0-9-]{0,59}")


def _check_statements(action: str, entry: dict[str, Any]) -> None:
    """Refuse a malformed ``statements`` entry: ``{"source": slug}``, the same source as
    ``events.source`` when both are given (an action has one evidence source)."""
    where = f"EFFECT_LEDGER_GENERIC_HTTP[{action!r}]['statements']"
    statements = entry["statements"]
    if not isinstance(statements, dict) or set(statements) != {"source"}:
        raise ImproperlyConfigured(f"{where} must be {{'source': slug}}")
    source = statements["source"]
    if not isinstance(source, str) or not _SLUG.fullmatch(source):
        raise ImproperlyConfigured(f"{where}['source'] must be a slug (a-z, 0-9, '-'; up to 60)")
    events = entry.get("events")
    if isinstance(events, dict) and events.get("source") != source:
        raise ImproperlyConfigured(
            f"{where}['source'] must be the same as its events' source {events.get('source')!r}: "
            "an action has one evidence source"
        )


def _check_events(action: str, events: Any) -> None:
    """Refuse a malformed ``events`` entry: ``{"source": slug, "secret": "whsec_...",
    "proving_types": [type, ...], "types": [type, ...]}`` (all but source optional; with
    ``types``, every proving type must be one of them)."""
    where = f"EFFECT_LEDGER_GENERIC_HTTP[{action!r}]['events']"
    if not isinstance(events, dict) or set(events) - {"source", "secret", "proving_types", "types"}:
        raise ImproperlyConfigured(f"{where} must be {{'source', 'secret', 'proving_types', 'types'}}")
    source = events.get("source")
    if not isinstance(source, str) or not _SLUG.fullmatch(source):
        raise ImproperlyConfigured(f"{where}['source'] must be a slug (a-z, 0-9, '-'; up to 60)")
    secret = events.get("secret", "")
    if not isinstance(secret, str) or (secret and not secret.startswith("whsec_")):
        raise ImproperlyConfigured(f"{where}['secret'] must be a Standard Webhooks secret 'whsec_...'")
    types = events.get("proving_types", [])
    if not isinstance(types, list) or not all(isinstance(t, str) and t for t in types):
        raise ImproperlyConfigured(f"{where}['proving_types'] must be a list of event types")
    if "types" in events:
        sent = events["types"]
        if not isinstance(sent, list) or not sent or not all(isinstance(t, str) and t for t in sent):
            raise ImproperlyConfigured(f"{where}['types'] must be a non-empty list of event types")
        if set(types) - set(sent):
            raise ImproperlyConfigured(f"{where}['proving_types'] must be among its 'types'")


class GenericHttpAdapter(Adapter):
    """Execute one configured action by POSTing its arguments with an ``Idempotency-Key``.

    Use ``generic_http_adapter(action)`` to get the instance for an action: each action gets
    its own subclass so its capabilities and schema reflect its configuration.
    """

    action_name: ClassVar[str] = ""
    config: ClassVar[dict[str, Any]] = {}
    capabilities = Capabilities(idempotency_keys=True, lookup=LookupKind.NONE)

    def receives_events(self) -> bool:
        """Only with an ``events`` entry: ``statements`` alone declares no inbox."""
        return "events" in self.config

    def event_secret(self) -> str:
        """The configuration's ``events.secret``, else
        ``EFFECT_LEDGER_PROVIDER_EVENT_SECRETS[source]`` ("" refuses every event)."""
        configured = str((self.config.get("events") or {}).get("secret", ""))
        return configured or super().event_secret()

    def parse_event(self, body: bytes, *, webhook_id: str) -> EventFacts:
        """Read the body (module docstring); a type in ``events.proving_types`` (default: any
        type ending in ``.succeeded``) proves this action's effect. With ``events.types`` a type
        not listed there is refused; without it, any type is read.

        Raises:
            EventInvalid: the body is not such an event, or of a type not in ``events.types``.
        """
        sent = (self.config.get("events") or {}).get("types") or []
        facts = parse_event_body(body, webhook_id=webhook_id, proving={}, types=dict.fromkeys(sent, ""))
        listed = (self.config.get("events") or {}).get("proving_types")
        proves = facts.event_type in listed if listed else facts.event_type.endswith(".succeeded")
        return replace(facts, proves_action=self.action_name) if proves else facts

    def _timeout(self, call: ExecutionCall) -> float:
        configured = self.config.get("timeout_seconds")
        return min(call.deadline_seconds, float(configured)) if configured else call.deadline_seconds

    def preview(self, action: str, arguments: dict[str, Any]) -> Preview:
        """Describe the request that ``execute`` would send; nothing is sent."""
        method, url = self.config.get("method", "POST"), self.config["url"]
        amount, currency = arguments.get("amount"), arguments.get("currency")
        return Preview(
            summary=f"{action}: {method} {url}",
            target=url,
            amount_minor=amount if isinstance(amount, int) and not isinstance(amount, bool) else None,
            currency=currency if isinstance(currency, str) else None,
            scope="one request to the configured endpoint, deduplicated by its Idempotency-Key",
        )

    def target_for(self, action: str, arguments: dict[str, Any]) -> str:
        """The argument the configuration's ``target_field`` names; without one, the host the
        request goes to (``api.acme.test``): every intent of the action affects that endpoint."""
        name = self.config.get("target_field")
        if isinstance(name, str) and name:
            value = arguments.get(name) if isinstance(arguments, dict) else None
            return "" if isinstance(value, bool) or not isinstance(value, str | int) else str(value)
        # The host and port only: a URL's user:password@ must never reach a page.
        parts = urlsplit(str(self.config["url"]))
        return f"{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}"

    def execute(self, call: ExecutionCall) -> ExecutionResult:
        """Send the arguments as JSON with ``Idempotency-Key: call.idempotency_key``, the whole
        call (connect, send, headers, body) within ``min(call.deadline_seconds,
        timeout_seconds)`` seconds and the answer under ``PROVIDER_RESPONSE_MAX_BYTES``.

        Returns:
            ``ExecutionResult(provider_reference=body[id_field], or the idempotency key when a
            readable JSON object (or a 204) has no id: the provider accepted it and knows it by
            our key; detail={"status", "id_from_body"}, replayed=Idempotent-Replayed header)``.

        Raises:
            RetryableError, TerminalError, AmbiguousOutcome: by the table in
            ``http_classifier`` (an unreadable 2xx, a redirect, a 409 in progress, a 5xx and a
            deadline or size cap hit after sending are ambiguous; a 409 ``stale_fence`` is
            ``NewerAttemptExists``, ambiguous too: a newer attempt exists; 429 and not sent are
            retryable; other 4xx, 422 key reused and 400 missing key are terminal).
        """
        headers = {**self.config.get("headers", {}), "Idempotency-Key": call.idempotency_key}
        if self.config.get("fence_header"):
            headers[str(self.config["fence_header"])] = str(call.fence)
        answer = http.send(
            str(self.config.get("method", "POST")),
            self.config["url"],
            deadline_seconds=self._timeout(call),
            json=call.arguments,
            headers=headers,
        )
        body = answers.expect_success(answer, allow_no_content=True)
        provider_id = _body_reference(body.get(self.config.get("id_field", "id")))
        return answers.success_result(
            answer,
            provider_reference=provider_id if provider_id is not None else call.idempotency_key,
            detail={"id_from_body": provider_id is not None},
        )

    def lookup(self, call: ExecutionCall) -> LookupResult:
        """GET ``lookup_url`` (``{idempotency_key}`` substituted, URL-quoted). Never raises.

        200 with ``{"data": [...]}`` → FOUND (non-empty, every id) or ABSENT (empty); 200 with an
        object → FOUND; 404 → ABSENT; 410 → WITHDRAWN; errors, and a 2xx that is not a JSON
        object (``http_classifier.json_object``) → INCONCLUSIVE; no ``lookup_url`` →
        UNSUPPORTED.
        """
        template = self.config.get("lookup_url")
        if not template:
            return LookupResult(status=LookupStatus.UNSUPPORTED)
        url = str(template).format(idempotency_key=quote(call.idempotency_key, safe=""))
        try:
            response = http.send(
                "GET", url, deadline_seconds=self._timeout(call), headers=self.config.get("headers", {})
            )
        except AdapterError as exc:
            detail = {**exc.detail, "error": str(exc)[:300]}
            return LookupResult(status=LookupStatus.INCONCLUSIVE, detail=detail)
        if response.status_code == 404:
            return LookupResult(status=LookupStatus.ABSENT, detail={"status": 404})
        if response.status_code == 410:
            return LookupResult(status=LookupStatus.WITHDRAWN, detail={"status": 410})
        if not response.is_success:
            return LookupResult(
                status=LookupStatus.INCONCLUSIVE,
                detail={"status": response.status_code, "code": answers.error_code(response)},
            )
        body, id_field = answers.json_object(response), self.config.get("id_field", "id")
        if body is None:
            return LookupResult(
                status=LookupStatus.INCONCLUSIVE,
                detail={"status": response.status_code, "code": "unreadable_success"},
            )
        if isinstance(body.get("data"), list):
            found = (_body_reference(i.get(id_field)) for i in body["data"] if isinstance(i, dict))
            ids = tuple(i for i in found if i is not None)
            if not ids:
                return LookupResult(status=LookupStatus.ABSENT, detail={"status": response.status_code})
            return LookupResult(status=LookupStatus.FOUND, provider_references=ids)
        provider_id = _body_reference(body.get(id_field))
        references = (provider_id,) if provider_id is not None else ()
        return LookupResult(status=LookupStatus.FOUND, provider_references=references)


def _body_reference(value: Any) -> str | None:
    """The provider's id for an effect as found in its JSON body: a string as is, an integer
    as its decimal text, None when absent or empty. Any other value (an object, a list, a
    float, a boolean) is passed on unchanged, typed as text only nominally, so that the engine's
    and the lookups' one check (``operations.bounds.reference_problem``) records it as an
    unstorable reference (UNKNOWN, escalated; an inconclusive lookup) instead of a Python repr
    standing in for an id the provider never gave."""
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return cast(str, value)


def _versions(action: str, config: dict[str, Any]) -> tuple[int, ...]:
    versions = config.get("versions", [1])
    if (
        not isinstance(versions, list | tuple)
        or not versions
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in versions)
    ):
        raise ImproperlyConfigured(
            f"EFFECT_LEDGER_GENERIC_HTTP[{action!r}]['versions'] must be a list of integers >= 1"
        )
    return tuple(versions)


@cache
def _adapter_for(action: str, config_json: str) -> GenericHttpAdapter:
    config = json.loads(config_json)
    lookup = LookupKind.AUTHORITATIVE if config.get("lookup_url") else LookupKind.NONE
    cls = type(
        f"GenericHttpAdapter[{action}]",
        (GenericHttpAdapter,),
        {
            "__doc__": f"Generic HTTP adapter for {action} ({config['url']}).",
            "action_name": action,
            "actions": (action,),
            "config": config,
            "capabilities": Capabilities(
                idempotency_keys=True, lookup=lookup, fences=bool(config.get("fence_header"))
            ),
            "argument_schemas": {action: config.get("schema") or ANY_OBJECT_SCHEMA},
            "versions": {action: _versions(action, config)},
            # The evidence source it declares (issue 19): ``events.source`` or ``statements.source``.
            "evidence_source": str(
                (config.get("events") or {}).get("source")
                or (config.get("statements") or {}).get("source")
                or ""
            ),
        },
    )
    adapter: GenericHttpAdapter = cls()
    return adapter


def generic_http_adapter(action: str) -> GenericHttpAdapter | None:
    """Return the adapter instance for ``action`` from ``EFFECT_LEDGER_GENERIC_HTTP``, or
    ``None`` when the action is not configured there. Instances are cached per configuration,
    so a changed setting (e.g. in a test) yields a new instance.

    Raises:
        ImproperlyConfigured: the setting is malformed.
    """
    config = generic_http_config().get(action)
    if config is None:
        return None
    return _adapter_for(action, json.dumps(config, sort_keys=True, default=str))
