"""A provider's contract, declared in configuration (issue 33): what one HTTP action's provider
does about keys, bodies, credentials, lookups, undoing and events, read from one entry of
``settings.EFFECT_LEDGER_GENERIC_HTTP`` and checked once, with the action and the field named.

Every field but ``url`` is optional; an entry written before issue 33 (``url``, ``lookup_url``,
``headers``, ``events`` with a ``whsec_`` secret) means what it meant. The reference, with
Stripe and SMTP examples, is docs/how-to/connect-a-provider.md (field reference: docs/reference/provider-contract.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from operations.adapters import contract_checks as checks
from operations.adapters import event_bodies as bodies
from operations.adapters import event_schemes as schemes
from operations.adapters import secrets as named
from operations.adapters.json_pointer import is_pointer
from operations.adapters.templates import placeholders

#: The events' signature scheme of a source that names none (issue 19's).
STANDARD_WEBHOOKS = "standard-webhooks"
#: Fields a lookup's pointers may read from one item of the answer.
LOOKUP_FIELDS = ("id", "status", "amount", "currency", "reference", "idempotency_key")
#: Seconds a lookup that is not authoritative is assumed to lag when the entry does not say.
DEFAULT_LAG_SECONDS = 60.0
#: The most a declared window may be: one day (a provider that lags longer has no usable lookup).
MAX_LAG_SECONDS = 86_400.0

_ENTRY_KEYS = {
    "url", "method", "schema", "timeout_seconds", "headers", "id_field", "fence_header", "versions",
    "target_field", "events", "statements", "lookup_url", "lookup", "keys", "encoding", "auth", "body",
    "compensation", "test_mode",
}  # fmt: skip


@dataclass(frozen=True)
class Keys:
    """How the provider treats our idempotency key.

    Attributes:
        header: the request header our key is sent in ("" sends none).
        deduplicates: the provider answers a repeated key with the first answer and applies
            nothing again (Stripe: for 24 hours). Only then is a same-key retry safe.
    """

    header: str = "Idempotency-Key"
    deduplicates: bool = True


@dataclass(frozen=True)
class Lookup:
    """How to ask the provider whether an intent's effect exists.

    Attributes:
        url: a URL template (``{idempotency_key}``, ``{reference}``, an argument...), GET.
        by: what the URL finds effects by: ``key``, ``reference`` (a listing by our business
            reference; duplicates are visible) or ``id`` (the id our execute recorded).
        items: pointer to the list of effects in the answer; None: the answer is one effect.
        fields: pointer per field of one effect (``LOOKUP_FIELDS``), relative to the item.
        proving_statuses: statuses that prove the effect; empty: any listed item proves it.
        authoritative: the read path answers from committed state: an empty answer for our key
            is proof of absence (with a keyed provider).
        consistency_window_seconds: how long the read path may miss an effect that exists.
        legacy: the pre-issue-33 ``lookup_url`` (an object or ``{"data": [...]}``).
    """

    url: str
    by: str = "key"
    items: str | None = None
    fields: dict[str, str] = field(default_factory=dict)
    proving_statuses: tuple[str, ...] = ()
    authoritative: bool = False
    consistency_window_seconds: float = DEFAULT_LAG_SECONDS
    legacy: bool = False


@dataclass(frozen=True)
class Compensation:
    """The action that undoes this one and how its arguments come from the original's
    (a template over the original's arguments and ``{provider_reference}``)."""

    action: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Contract:
    """One declared action's provider contract (the module docstring)."""

    action: str
    url: str
    method: str = "POST"
    encoding: str = "json"
    keys: Keys = Keys()
    auth: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    lookup: Lookup | None = None
    compensation: Compensation | None = None
    test_mode: bool = False


def _fail(where: str, message: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"{where} {message}")


def _keys(where: str, value: Any) -> Keys:
    if value is None:
        return Keys()
    if value == "none":
        return Keys(header="", deduplicates=False)
    if not isinstance(value, dict) or set(value) - {"header", "deduplicates"}:
        raise _fail(where, "must be 'none' or {'header': name, 'deduplicates': true|false}")
    header = value.get("header", "Idempotency-Key")
    dedup = value.get("deduplicates", True)
    if not isinstance(header, str) or not header or not isinstance(dedup, bool):
        raise _fail(where, "needs a header name and deduplicates true or false")
    return Keys(header=header, deduplicates=dedup)


def _auth(where: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    schemes = {
        "bearer": {"scheme", "secret"},
        "basic": {"scheme", "secret"},
        "header": {"scheme", "secret", "header"},
    }
    scheme = value.get("scheme") if isinstance(value, dict) else None
    if scheme not in schemes or set(value) != schemes[scheme]:
        raise _fail(
            where,
            "must be {'scheme': 'bearer'|'basic', 'secret': ref} or {'scheme': 'header', 'header': name, 'secret': ref}",
        )
    named.check_reference(value["secret"], where=f"{where}['secret']")
    return dict(value)


def _headers(where: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise _fail(where, "must map header names to text")
    checks.check_headers(where, value)
    return dict(value)


def _versions(where: str, value: Any) -> None:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    ):
        raise _fail(where, "must be a list of integers >= 1")


def _wire(where: str, entry: dict[str, Any], keys: Keys) -> None:
    """The checks of what goes on the wire (``contract_checks``): URLs, headers, schema,
    timeout, id field, versions and every template's placeholders."""
    arguments = None
    if "schema" in entry:
        checks.check_schema(f"{where}['schema']", entry["schema"])
        arguments = checks.declared_arguments(entry["schema"])
    checks.check_url(f"{where}['url']", entry["url"])
    checks.check_placeholders(f"{where}['url']", entry["url"], arguments)
    if "body" in entry:
        checks.check_placeholders(f"{where}['body']", entry["body"], arguments)
    lookup: dict[str, Any] = entry["lookup"] if isinstance(entry.get("lookup"), dict) else {}
    for name, url in (("lookup_url", entry.get("lookup_url")), ("lookup']['url", lookup.get("url"))):
        if isinstance(url, str) and url:
            checks.check_url(f"{where}['{name}']", url)
            checks.check_placeholders(f"{where}['{name}']", url, arguments)
    compensation = entry.get("compensation")
    if isinstance(compensation, dict) and "arguments" in compensation:
        checks.check_placeholders(
            f"{where}['compensation']['arguments']",
            compensation["arguments"],
            arguments,
            extra=("provider_reference",),
        )
    if keys.header:
        checks.check_header(f"{where}['keys']['header']", keys.header, None)
    for name in ("fence_header",):
        if entry.get(name):
            checks.check_header(f"{where}[{name!r}]", str(entry[name]), None)
    auth = entry.get("auth")
    if isinstance(auth, dict) and auth.get("scheme") == "header":
        checks.check_header(f"{where}['auth']['header']", str(auth.get("header", "")), None)
    if "timeout_seconds" in entry:
        checks.check_timeout(f"{where}['timeout_seconds']", entry["timeout_seconds"])
    if "id_field" in entry:
        checks.check_id_field(f"{where}['id_field']", entry["id_field"])
    if "versions" in entry:
        _versions(f"{where}['versions']", entry["versions"])


def _window(where: str, value: Any, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_LAG_SECONDS:
        raise _fail(where, f"must be a number of seconds from 0 to {MAX_LAG_SECONDS:g}")
    return float(value)


def _lookup(where: str, entry: dict[str, Any]) -> Lookup | None:
    if "lookup" in entry and "lookup_url" in entry:
        raise _fail(where, "has both 'lookup' and 'lookup_url'; keep 'lookup'")
    if "lookup_url" in entry:
        url = entry["lookup_url"]
        if not isinstance(url, str) or not url:
            raise _fail(f"{where}['lookup_url']", "must be a URL")
        id_field = str(entry.get("id_field", "id"))
        return Lookup(url=url, by="key", items="/data", fields={"id": f"/{id_field}"}, authoritative=True,
                      consistency_window_seconds=0.0, legacy=True)  # fmt: skip
    value = entry.get("lookup")
    if value is None:
        return None
    where = f"{where}['lookup']"
    allowed = {
        "url",
        "by",
        "items",
        "fields",
        "proving_statuses",
        "authoritative",
        "consistency_window_seconds",
    }
    if not isinstance(value, dict) or set(value) - allowed:
        raise _fail(where, f"must be an object with {sorted(allowed)}")
    url, by = value.get("url"), value.get("by", "key")
    if not isinstance(url, str) or not url:
        raise _fail(f"{where}['url']", "must be a URL template")
    if by not in ("key", "reference", "id"):
        raise _fail(f"{where}['by']", "must be 'key', 'reference' or 'id'")
    items = value.get("items")
    if items is not None and not is_pointer(items):
        raise _fail(f"{where}['items']", "must be a JSON pointer ('/data') or absent")
    fields = value.get("fields", {"id": "/id"})
    if (
        not isinstance(fields, dict)
        or set(fields) - set(LOOKUP_FIELDS)
        or not all(map(is_pointer, fields.values()))
    ):
        raise _fail(
            f"{where}['fields']", f"must map {list(LOOKUP_FIELDS)} to JSON pointers ('/metadata/reference')"
        )
    if "id" not in fields:
        raise _fail(f"{where}['fields']", "needs 'id': where the provider's id of an effect is")
    statuses = value.get("proving_statuses", [])
    if not isinstance(statuses, list) or not all(isinstance(s, str) and s for s in statuses):
        raise _fail(f"{where}['proving_statuses']", "must be a list of statuses")
    if statuses and "status" not in fields:
        raise _fail(f"{where}['fields']", "needs 'status' when proving_statuses are given")
    authoritative = value.get("authoritative", False)
    if not isinstance(authoritative, bool):
        raise _fail(f"{where}['authoritative']", "must be true or false")
    window = _window(f"{where}['consistency_window_seconds']", value.get("consistency_window_seconds"),
                     0.0 if authoritative else DEFAULT_LAG_SECONDS)  # fmt: skip
    if by == "reference" and not ({"reference"} & placeholders(url) or "reference" in fields):
        raise _fail(
            f"{where}['url']", "lists by reference but neither names {reference} nor reads 'reference'"
        )
    return Lookup(url=url, by=by, items=items, fields=dict(fields), proving_statuses=tuple(statuses),
                  authoritative=authoritative, consistency_window_seconds=window)  # fmt: skip


def _compensation(where: str, value: Any, action: str) -> Compensation | None:
    if value is None:
        return None
    if (
        not isinstance(value, dict)
        or set(value) - {"action", "arguments"}
        or not isinstance(value.get("action"), str)
    ):
        raise _fail(where, "must be {'action': name, 'arguments': {...}}")
    if value["action"] == action:
        raise _fail(where, "names the action itself; an action cannot undo itself")
    arguments = value.get("arguments", {"charge": "{provider_reference}"})
    if not isinstance(arguments, dict):
        raise _fail(f"{where}['arguments']", "must be an object template")
    return Compensation(action=value["action"], arguments=arguments)


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
    """Refuse a malformed ``events`` entry: ``{"source": slug, "scheme": name, "secret": ...,
    "tolerance_seconds": n, "fields": {name: pointer}, "proving_types": [type, ...],
    "types": [type, ...]}`` (all but source optional; with ``types``, every proving type must be
    one of them). The secret is named (``env:NAME``, ``file:PATH``); a literal ``whsec_``
    secret is still read for a Standard Webhooks source configured before issue 33."""
    where = f"EFFECT_LEDGER_GENERIC_HTTP[{action!r}]['events']"
    allowed = {"source", "scheme", "secret", "tolerance_seconds", "fields", "proving_types", "types"}
    if not isinstance(events, dict) or set(events) - allowed:
        raise ImproperlyConfigured(f"{where} must be an object with {sorted(allowed)}")
    source = events.get("source")
    if not isinstance(source, str) or not _SLUG.fullmatch(source):
        raise ImproperlyConfigured(f"{where}['source'] must be a slug (a-z, 0-9, '-'; up to 60)")
    scheme = events.get("scheme", STANDARD_WEBHOOKS)
    schemes.check_scheme(scheme, f"{where}['scheme']")
    secret = events.get("secret", "")
    legacy_secret = scheme == STANDARD_WEBHOOKS and isinstance(secret, str) and secret.startswith("whsec_")
    if secret and not legacy_secret:
        named.check_reference(secret, where=f"{where}['secret']")
    tolerance = events.get("tolerance_seconds", schemes.DEFAULT_TOLERANCE_SECONDS)
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not 0 < tolerance <= 3600:
        raise ImproperlyConfigured(
            f"{where}['tolerance_seconds'] must be seconds, more than 0 and at most 3600"
        )
    if "fields" in events:
        bodies.check_fields(events["fields"], f"{where}['fields']")
    types = events.get("proving_types", [])
    if not isinstance(types, list) or not all(isinstance(t, str) and t for t in types):
        raise ImproperlyConfigured(f"{where}['proving_types'] must be a list of event types")
    if "types" in events:
        sent = events["types"]
        if not isinstance(sent, list) or not sent or not all(isinstance(t, str) and t for t in sent):
            raise ImproperlyConfigured(f"{where}['types'] must be a non-empty list of event types")
        if set(types) - set(sent):
            raise ImproperlyConfigured(f"{where}['proving_types'] must be among its 'types'")


def parse_contract(action: str, entry: Any) -> Contract:
    """Read and check one ``EFFECT_LEDGER_GENERIC_HTTP`` entry.

    Raises:
        ImproperlyConfigured: naming the action and the field, for an unknown field, a missing
            ``url``, a literal credential (``auth`` and credential headers take ``env:NAME`` or
            ``file:PATH``), a body encoding other than json/form, a malformed ``keys``,
            ``lookup``, ``compensation`` or ``body`` (a placeholder that is neither an argument
            nor a call value is allowed: arguments are the schema's; the call values are
            ``templates.CALL_VALUES``), a malformed ``events`` or ``statements`` entry.
    """
    where = f"EFFECT_LEDGER_GENERIC_HTTP[{action!r}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("url"), str) or not entry["url"]:
        raise _fail(where, "needs a 'url'")
    unknown = set(entry) - _ENTRY_KEYS
    if unknown:
        raise _fail(where, f"has unknown fields {sorted(unknown)}")
    method = entry.get("method", "POST")
    if method not in ("POST", "PUT", "PATCH", "DELETE", "GET"):
        raise _fail(f"{where}['method']", "must be POST, PUT, PATCH, DELETE or GET")
    encoding = entry.get("encoding", "json")
    if encoding not in ("json", "form"):
        raise _fail(f"{where}['encoding']", "must be 'json' or 'form' (application/x-www-form-urlencoded)")
    body = entry.get("body")
    if body is not None and not isinstance(body, dict):
        raise _fail(f"{where}['body']", "must be an object template ({'amount': '{amount}', ...})")
    test_mode = entry.get("test_mode", False)
    if not isinstance(test_mode, bool):
        raise _fail(f"{where}['test_mode']", "must be true or false")
    if "events" in entry:
        _check_events(action, entry["events"])
    if "statements" in entry:
        _check_statements(action, entry)
    keys = _keys(f"{where}['keys']", entry.get("keys"))
    _wire(where, entry, keys)
    if entry.get("fence_header") and not keys.deduplicates:
        raise _fail(
            f"{where}['fence_header']", "needs a provider that deduplicates keys (a fence is per key)"
        )
    return Contract(
        action=action,
        url=entry["url"],
        method=method,
        encoding=encoding,
        keys=keys,
        auth=_auth(f"{where}['auth']", entry.get("auth")),
        headers=_headers(f"{where}['headers']", entry.get("headers")),
        body=body,
        lookup=_lookup(where, entry),
        compensation=_compensation(f"{where}['compensation']", entry.get("compensation"), action),
        test_mode=test_mode,
    )
