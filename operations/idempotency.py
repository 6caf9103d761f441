"""Canonical JSON, request hashes and idempotency keys: the identity of an intent.

* Canonical JSON follows RFC 8785 (JSON Canonicalization Scheme): sorted keys, no
  insignificant whitespace, I-JSON numbers. Integers outside +/-(2**53 - 1) and non-finite
  floats cannot be canonicalised and are refused.
* ``request_hash`` is sha256 over the canonical *request fingerprint*: ``{tenant, action,
  action_version, arguments, reference}`` (fingerprint version 2; intents submitted before
  reference took part carry version 1, without it). Only metadata is left out, so volatile
  fields cannot change it (cases C06).
* Arguments must come back from PostgreSQL's ``jsonb`` in the same canonical form: a number
  whose magnitude exceeds 2**53 - 1 is refused at submission, floats included
  (``storage_problems``), because ``jsonb`` keeps numbers as ``numeric`` and prints ``1e16`` as
  the integer ``10000000000000000``, which has no canonical form any more.
* The provider idempotency key is derived ONCE, at submission, from tenant, principal, the
  client's Idempotency-Key, action and version (what survives the loss of the intent's row),
  then stored and re-sent verbatim on every attempt; it is never recomputed.
"""

from __future__ import annotations

import hashlib
import math
import re
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


#: The request fingerprint new intents are hashed with: 2 covers the reference, 1 (intents
#: submitted before it did) does not. Stored per intent (``Intent.fingerprint_version``) and
#: recorded in its ``submitted`` audit event, so a stored hash is re-derived the way it was made.
FINGERPRINT_VERSION = 2
FINGERPRINT_VERSIONS = (1, 2)


def fingerprint_document(
    *, tenant: str, action: str, action_version: int, arguments: Any, reference: str, fingerprint_version: int
) -> dict[str, Any]:
    """The request fingerprint that ``request_hash`` hashes: ``{tenant, action, action_version,
    arguments, reference}`` for version 2, the same without ``reference`` for version 1.
    Metadata never takes part.

    Raises:
        ValueError: an unknown ``fingerprint_version``.
    """
    if fingerprint_version not in FINGERPRINT_VERSIONS:
        raise ValueError(f"unknown fingerprint version {fingerprint_version!r}")
    document = {"tenant": tenant, "action": action, "action_version": action_version, "arguments": arguments}
    if fingerprint_version >= 2:
        document["reference"] = reference
    return document


def request_hash(
    *, tenant: str, action: str, action_version: int, arguments: Any, reference: str, fingerprint_version: int
) -> str:
    """Return sha256 hex (64 characters) over the RFC 8785 canonical ``fingerprint_document``.

    This is what an approval binds to, what the approval and the worker re-derive from the
    stored intent before acting, and what decides "same request" for a replayed client key
    (draft-ietf-httpapi-idempotency-key-header, section 2.6: same key, different payload is an
    error).

    Args:
        reference: the business reference stored on the intent (hashed from version 2 on).
        fingerprint_version: ``FINGERPRINT_VERSION`` for a new intent; the intent's own for a
            stored one.

    Raises:
        CanonicalizationError: ``arguments`` cannot be canonicalised.
        ValueError: an unknown ``fingerprint_version``.
    """
    document = fingerprint_document(
        tenant=tenant,
        action=action,
        action_version=action_version,
        arguments=arguments,
        reference=reference,
        fingerprint_version=fingerprint_version,
    )
    return fingerprint_hash(document)


def fingerprint_hash(document: dict[str, Any]) -> str:
    """The ``request_hash`` of a ``fingerprint_document``: sha256 hex over its RFC 8785 form.

    Raises:
        CanonicalizationError: the document cannot be canonicalised.
    """
    return sha256_hex(canonical_json(document))


def derive_provider_key(
    *, tenant: str, principal: str, client_key: str, action: str, action_version: int
) -> str:
    """Derive the provider idempotency key, once per intent, from what the caller keeps: the
    tenant, the principal, the client's ``Idempotency-Key``, the action and its version.

    An intent's row can be lost while its effect is not: a failover to a replica that lagged, or
    a restore to an earlier point, drops intents submitted since (issue 22). The agent retries
    with the same ``Idempotency-Key``; the new intent gets a new intent_id but this same provider
    key, so a provider that deduplicates on it answers with the effect it already made instead
    of making a second one. (Keys that earlier releases derived from the intent_id stay valid:
    a key is stored with its intent and never recomputed, so no migration touches them.) No attempt
    number, timestamp, metadata or intent_id takes part, so every attempt sends the same key.
    The client key is unique per (tenant, principal) in the ledger, so two intents never share a
    provider key; a client reusing its key for another payload after a restore reaches the
    provider under the same key, which a keyed provider refuses (Stripe: 400
    ``idempotency_key_in_use`` / 422 for another body) rather than applying twice.

    Returns ``el_`` followed by 48 hex characters (51 characters; Stripe allows 255).
    """
    document = {
        "tenant": tenant,
        "principal": principal,
        "client_key": client_key,
        "action": action,
        "action_version": action_version,
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
#: The largest magnitude of a number in hashed arguments: I-JSON's exact integer range
#: (RFC 7493 section 2.2), which RFC 8785 section 3.2.2.3 serialises.
MAX_SAFE_NUMBER = 2**53 - 1


def number_problem(value: Any) -> str | None:
    """Why the number ``value`` cannot travel through ``jsonb`` and still hash the same, or None.

    The rule: a number (integer or float) in hashed arguments has a magnitude of at most
    ``MAX_SAFE_NUMBER`` (2**53 - 1) and is finite. PostgreSQL's ``jsonb`` stores numbers as
    ``numeric`` and prints a float such as ``1e16`` or ``1.5e300`` as an integer
    (``10000000000000000``), which RFC 8785 cannot canonicalise (RFC 7493 section 2.2); floats
    within the range, ``-0.0`` (stored as ``0``, canonical ``0`` either way) and small
    exponents (``1e-7`` comes back as ``0.0000001``, the same float) round-trip exactly.
    Booleans are not numbers here.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} is not a finite number (JSON has no NaN or Infinity)"
    if abs(value) > MAX_SAFE_NUMBER:
        # str() of a huge integer is refused past 4300 digits: name its size instead.
        shown = (
            repr(value)
            if isinstance(value, float) or value.bit_length() <= 96
            else f"of {value.bit_length()} bits"
        )
        return (
            f"the number {shown} is beyond ±(2^53−1): it cannot be stored and hashed exactly "
            "(send it as a string, or in smaller units)"
        )
    return None


def storage_problems(value: Any, *, field: str, depth: int = 0, hashed: bool = False) -> list[dict[str, str]]:
    """Why ``value`` cannot be stored and shown safely, as ``[{"field", "message"}]``.

    PostgreSQL's JSONB refuses the NUL character (U+0000) and lone UTF-16 surrogates; nesting
    deeper than ``MAX_JSON_DEPTH`` is refused so one small request cannot make huge pages.
    With ``hashed`` (the arguments), every number must also come back from ``jsonb`` with the
    same canonical form (``number_problem``), so the stored arguments still hash to the
    intent's ``request_hash``.
    """
    if depth > MAX_JSON_DEPTH:
        return [{"field": field, "message": f"nested deeper than {MAX_JSON_DEPTH} levels"}]
    if hashed:
        problem = number_problem(value)
        if problem:
            return [{"field": field, "message": problem}]
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
            problems += storage_problems(item, field=f"{field}.{key}", depth=depth + 1, hashed=hashed)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            problems += storage_problems(item, field=f"{field}.{index}", depth=depth + 1, hashed=hashed)
    return problems[:20]
