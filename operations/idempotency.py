"""Canonical JSON, request hashes and idempotency keys: the identity of an intent.

* Canonical JSON follows RFC 8785 (JSON Canonicalization Scheme): sorted keys, no
  insignificant whitespace, I-JSON numbers. Integers outside +/-(2**53 - 1) and non-finite
  floats cannot be canonicalised and are refused.
* ``request_hash`` is sha256 over canonical ``{tenant, action, action_version, arguments}``;
  metadata is deliberately not part of it, so volatile fields cannot change it (cases C06).
* The provider idempotency key is derived ONCE, at submission, from tenant, action, version
  and intent_id, then stored and re-sent verbatim on every attempt; it is never recomputed.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from typing import Any

import rfc8785

# draft-ietf-httpapi-idempotency-key-header: the key is an opaque string; we accept 1-255
# printable ASCII characters (0x20-0x7E) so it can be logged and stored safely.
CLIENT_KEY_PATTERN = re.compile(r"^[\x20-\x7e]{1,255}$")


class CanonicalizationError(ValueError):
    """The value cannot be represented as RFC 8785 canonical JSON (huge integer, NaN, ...)."""


def canonical_json(value: Any) -> bytes:
    """Return the RFC 8785 canonical UTF-8 encoding of ``value``.

    Raises:
        CanonicalizationError: integers beyond 2**53 - 1, NaN/Infinity, or non-JSON types.
    """
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError, RecursionError) as exc:
        raise CanonicalizationError(str(exc)) from exc


def sha256_hex(data: bytes) -> str:
    """Return the lowercase hex sha256 of ``data`` (64 characters)."""
    return hashlib.sha256(data).hexdigest()


def request_hash(*, tenant: str, action: str, action_version: int, arguments: Any) -> str:
    """Return sha256 hex over canonical ``{tenant, action, action_version, arguments}``.

    This is what an approval binds to and what decides "same request" for a replayed client
    key (draft-ietf-httpapi-idempotency-key-header, section 2.6: same key, different payload
    is an error).

    Raises:
        CanonicalizationError: ``arguments`` cannot be canonicalised.
    """
    document = {"tenant": tenant, "action": action, "action_version": action_version, "arguments": arguments}
    return sha256_hex(canonical_json(document))


def derive_provider_key(*, tenant: str, action: str, action_version: int, intent_id: uuid.UUID) -> str:
    """Derive the provider idempotency key, once per intent, from stable identity only.

    Returns ``el_`` followed by 48 hex characters (51 characters; Stripe allows 255). No
    attempt number, timestamp or metadata takes part, so every attempt sends the same key.
    """
    document = {
        "tenant": tenant,
        "action": action,
        "action_version": action_version,
        "intent_id": str(intent_id),
    }
    return "el_" + sha256_hex(canonical_json(document))[:48]


def key_digest(key: str) -> str:
    """A short digest of a key for logs and the console (first 12 hex of its sha256)."""
    return sha256_hex(key.encode())[:12]


def is_valid_client_key(key: str | None) -> bool:
    """True when ``key`` is 1-255 printable ASCII characters."""
    return key is not None and bool(CLIENT_KEY_PATTERN.fullmatch(key))


#: Deepest nesting accepted in arguments and metadata (objects and arrays).
MAX_JSON_DEPTH = 32


def storage_problems(value: Any, *, field: str, depth: int = 0) -> list[dict[str, str]]:
    """Why ``value`` cannot be stored and shown safely, as ``[{"field", "message"}]``.

    PostgreSQL's JSONB refuses the NUL character (U+0000) and lone UTF-16 surrogates; nesting
    deeper than ``MAX_JSON_DEPTH`` is refused so one small request cannot make huge pages.
    """
    if depth > MAX_JSON_DEPTH:
        return [{"field": field, "message": f"nested deeper than {MAX_JSON_DEPTH} levels"}]
    if isinstance(value, str):
        if "\x00" in value:
            return [{"field": field, "message": "contains the NUL character (U+0000)"}]
        if any("\ud800" <= ch <= "\udfff" for ch in value):
            return [{"field": field, "message": "contains a lone UTF-16 surrogate"}]
        return []
    problems: list[dict[str, str]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            problems += storage_problems(str(key), field=f"{field} (key)", depth=depth)
            problems += storage_problems(item, field=f"{field}.{key}", depth=depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            problems += storage_problems(item, field=f"{field}.{index}", depth=depth + 1)
    return problems[:20]
