"""The start-up checks of a declared contract that concern what goes on the wire (issue 33):
URLs, header names and values, the argument schema, time limits and template placeholders.

Each check raises ``ImproperlyConfigured`` naming the configuration path; a value that could
be a secret is never echoed. What they keep out:

* a URL whose scheme, user, host or port an agent's arguments could choose (placeholders are
  allowed in the path and the query only; docs/reference/provider-contract.md: "the host never comes
  from the arguments"), a URL that is not absolute ``http``/``https``, and braces that are not a
  placeholder (``{tickets``, ``{title|title}``) that would otherwise be sent literally;
* header names that are not RFC 9110 tokens (§5.1), values holding CR, LF or NUL (§5.5) or
  text other than visible ASCII, the headers the transport owns (``Host``, ``Content-Length``,
  ``Transfer-Encoding``, ``Connection``), and a literal credential under any name that says
  it is one (``X-Auth-Token``, ``Private-Token``...);
* a ``schema`` that is not a JSON Schema (draft 2020-12), a ``timeout_seconds`` that is not a
  positive number of seconds, an ``id_field`` that is a path, a placeholder naming neither an
  argument the schema declares nor a call value.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from operations.adapters import secrets as named
from operations.adapters.templates import CALL_VALUES, PLACEHOLDER, placeholders

#: RFC 9110 §5.1: a field name is a token (tchar: visible ASCII but delimiters).
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,100}")
#: Visible ASCII, space and tab (RFC 9110 §5.5 without obs-text, which many servers refuse).
_FIELD_VALUE = re.compile(r"[\x20-\x7e\t]*")
#: Headers the transport writes itself: a configured one would contradict it.
TRANSPORT_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})
#: Words in a header's name that say its value is a credential (never written in the file).
_CREDENTIAL_WORDS = re.compile(r"auth|token|secret|password|api-?key|cookie", re.IGNORECASE)
#: The longest whole call a contract may ask for, in seconds (the engine's deadline caps it too).
MAX_TIMEOUT_SECONDS = 300.0
_ID_FIELD = re.compile(r"[A-Za-z0-9_.-]{1,100}")


def _fail(where: str, message: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"{where} {message}")


def check_template_text(where: str, text: str) -> None:
    """Refuse braces that are not a placeholder (``{tickets``, ``{title|title}``, ``}``).

    Raises:
        ImproperlyConfigured: naming ``where``.
    """
    if "{" in PLACEHOLDER.sub("", text) or "}" in PLACEHOLDER.sub("", text):
        raise _fail(where, "has braces that are not a placeholder: write {name} or {name|lower}/{name|upper}")


def check_url(where: str, url: str) -> None:
    """Refuse a URL template that is not absolute http(s), or whose scheme, user, host or port
    holds a placeholder (an agent's arguments would choose where the request goes).

    Raises:
        ImproperlyConfigured: naming ``where``.
    """
    check_template_text(where, url)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise _fail(where, "must be an absolute http:// or https:// URL")
    if "{" in parts.scheme or "{" in parts.netloc:
        raise _fail(
            where, "may hold placeholders in its path and query only, never in its host, port or user"
        )


def check_header(where: str, name: str, value: str | None) -> None:
    """Refuse a header name that is not a token, one the transport owns, or a value with CR,
    LF, NUL or text other than visible ASCII (``value`` None: a name only).

    Raises:
        ImproperlyConfigured: naming ``where`` (never the value).
    """
    if not _TOKEN.fullmatch(name):
        raise _fail(where, "is not a header name (RFC 9110 §5.1: letters, digits and !#$%&'*+-.^_`|~)")
    if name.lower() in TRANSPORT_HEADERS:
        raise _fail(where, f"names {name}, which the transport writes itself")
    if value is not None and not _FIELD_VALUE.fullmatch(value):
        raise _fail(where, "holds a character a header value cannot carry (CR, LF, NUL or non-ASCII)")


def is_credential_header(name: str) -> bool:
    """Whether a header's name says its value is a credential (then it must be a secret
    reference): ``Authorization``, ``X-Api-Key``, ``X-Auth-Token``, ``Private-Token``..."""
    return bool(_CREDENTIAL_WORDS.search(name))


def check_headers(where: str, headers: dict[str, str]) -> None:
    """Check every configured header (``check_header``); a credential's value must name a secret.

    Raises:
        ImproperlyConfigured: naming the header.
    """
    for name, text in headers.items():
        reference = text.startswith(("env:", "file:"))
        if is_credential_header(name) or reference:
            named.check_reference(text, where=f"{where}[{name!r}]")
        check_header(f"{where}[{name!r}]", name, None if reference else text)


def check_header_value(name: str, value: str, *, reference: str) -> str | None:
    """Why a secret read at send time cannot go in header ``name`` (CR, LF, NUL, non-ASCII), or
    None when it can. Names the reference, never the value."""
    if _FIELD_VALUE.fullmatch(value):
        return None
    return (
        f"the secret {reference} cannot be sent in the {name} header: it holds CR, LF, NUL or non-ASCII text"
    )


def check_schema(where: str, schema: Any) -> None:
    """Refuse a ``schema`` that is not a JSON Schema object (draft 2020-12 metaschema).

    Raises:
        ImproperlyConfigured: naming ``where`` and the schema error's path.
    """
    if not isinstance(schema, dict):
        raise _fail(where, "must be a JSON Schema object")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        path = "/".join(str(p) for p in exc.absolute_path)
        raise _fail(where, f"is not a JSON Schema (at /{path}: {exc.message})"[:300]) from exc


def check_timeout(where: str, value: Any) -> None:
    """Refuse a ``timeout_seconds`` that is not a number of seconds in (0, 300]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_TIMEOUT_SECONDS:
        raise _fail(where, f"must be a number of seconds, more than 0 and at most {MAX_TIMEOUT_SECONDS:g}")


def check_id_field(where: str, value: Any) -> None:
    """Refuse an ``id_field`` that is not a plain member name of the answer (``id``)."""
    if not isinstance(value, str) or not _ID_FIELD.fullmatch(value):
        raise _fail(where, "must be the name of a member of the provider's answer (e.g. 'id'), not a path")


def declared_arguments(schema: Any) -> set[str] | None:
    """The argument names ``schema`` declares, or None when it admits any (no ``properties``, or
    ``additionalProperties`` not false): then any placeholder may name an argument."""
    if not isinstance(schema, dict) or schema.get("additionalProperties", True) is not False:
        return None
    properties = schema.get("properties")
    return set(properties) if isinstance(properties, dict) else None


def check_placeholders(
    where: str, template: Any, arguments: set[str] | None, *, extra: tuple[str, ...] = ()
) -> None:
    """Refuse a placeholder that names neither an argument the schema declares nor a call value
    (every intent would fail), and braces that are not placeholders, anywhere in ``template``.

    Raises:
        ImproperlyConfigured: naming ``where`` and the placeholder.
    """
    stack = [template]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            check_template_text(where, value)
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    if arguments is None:
        return
    unknown = placeholders(template) - arguments - set(CALL_VALUES) - set(extra)
    if unknown:
        raise _fail(where, f"names {sorted(unknown)}, neither an argument of the schema nor a call value")
