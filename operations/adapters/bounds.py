"""Provider-supplied values made storable before anything records them.

A provider (or a misbehaving adapter) decides what comes back: ids of any length, error
messages with NUL characters, JSON nested ten thousand deep, ``NaN``, lone surrogates from a
``\\ud800`` escape. PostgreSQL refuses some of them (``text`` and ``jsonb`` reject U+0000,
``jsonb`` rejects ``NaN``, a ``varchar(200)`` rejects 201 characters, UTF-8 has no lone
surrogates), and a refused write must never be what decides an intent's state. Everything an
adapter returns passes through here first; what cannot be stored faithfully is replaced by
evidence about it (its sha256, length and a prefix), never silently dropped.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

from operations.adapters.base import LookupResult, LookupStatus
from operations.idempotency import MAX_SAFE_NUMBER

#: Characters of a provider reference we store (``Outcome.provider_reference`` is varchar(200)).
REFERENCE_MAX_CHARS = 200
#: Characters of an error message kept on an attempt, the intent's ``last_error`` and audit reasons.
ERROR_MAX_CHARS = 2000
#: Characters kept of any one string inside a JSON detail.
DETAIL_STRING_MAX_CHARS = 2000
#: Nesting kept inside a JSON detail; deeper values become a marker.
DETAIL_MAX_DEPTH = 8
#: Keys kept per object and items kept per list inside a JSON detail.
DETAIL_MAX_ITEMS = 100
_SURROGATES = re.compile("[\ud800-\udfff]")
#: Characters of a prefix kept as evidence of a value that could not be stored whole.
EVIDENCE_PREFIX_CHARS = 64


def clean_text(value: Any, limit: int = ERROR_MAX_CHARS) -> str:
    """``value`` as text PostgreSQL accepts: NUL characters removed, lone surrogates replaced by
    U+FFFD, cut to ``limit`` characters (a cut ends with ``…``). Non-strings go through ``str``."""
    text = value if isinstance(value, str) else str(value)
    if "\x00" in text:
        text = text.replace("\x00", "")
    text = _SURROGATES.sub("\ufffd", text) if _has_surrogates(text) else text
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def unstorable_evidence(value: Any) -> dict[str, Any]:
    """What we keep of a value that cannot be stored as it is: ``{"sha256": hex of its UTF-8
    bytes (surrogates escaped), "length": characters, "prefix": the first 64 characters, cleaned}``;
    a value that is not text is taken as its JSON text (``json.dumps``)."""
    # JSON text for what came from JSON (as the provider wrote it, give or take spacing), so
    # an operator can match it against the provider's answer; repr for anything else.
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=repr)
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return {
        "sha256": digest,
        "length": len(text),
        "prefix": clean_text(text[:EVIDENCE_PREFIX_CHARS], EVIDENCE_PREFIX_CHARS),
    }


def reference_problem(reference: Any) -> str | None:
    """Why ``reference`` cannot be stored faithfully as a provider reference, or None when it can.

    A reference is an identifier: it must be a string of at most ``REFERENCE_MAX_CHARS``
    characters without NUL characters or lone surrogates. Cleaning it would store an id the
    provider never gave, so the caller treats a problem as unstorable evidence instead.
    """
    if not isinstance(reference, str):
        return f"the provider reference is a {type(reference).__name__}, not text"
    if len(reference) > REFERENCE_MAX_CHARS:
        return f"the provider reference has {len(reference)} characters; at most {REFERENCE_MAX_CHARS} can be stored"
    if "\x00" in reference or _has_surrogates(reference):
        return "the provider reference contains characters PostgreSQL cannot store (NUL or a lone surrogate)"
    return None


def clean_json(value: Any, *, depth: int = 0) -> Any:
    """``value`` as JSON that ``jsonb`` accepts and ``json.dumps`` can write: strings cleaned
    (``clean_text``, ``DETAIL_STRING_MAX_CHARS``), keys made strings, non-finite floats and
    values of other types turned into text, integers beyond ±(2^53 − 1) too (the audit chain
    hashes RFC 8785 canonical JSON, which has no exact form for them: RFC 7493 §2.2), at most
    ``DETAIL_MAX_ITEMS`` keys or items per level (``"…": n`` names the rest) and
    ``DETAIL_MAX_DEPTH`` levels."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) <= MAX_SAFE_NUMBER else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return clean_text(value, DETAIL_STRING_MAX_CHARS)
    if depth >= DETAIL_MAX_DEPTH and isinstance(value, dict | list | tuple):
        return f"<nested deeper than {DETAIL_MAX_DEPTH} levels: not stored>"
    if isinstance(value, dict):
        items = list(value.items())
        cleaned = {
            clean_text(key, 200): clean_json(item, depth=depth + 1) for key, item in items[:DETAIL_MAX_ITEMS]
        }
        if len(items) > DETAIL_MAX_ITEMS:
            cleaned["…"] = f"{len(items) - DETAIL_MAX_ITEMS} more keys not stored"
        return cleaned
    if isinstance(value, list | tuple):
        kept = [clean_json(item, depth=depth + 1) for item in value[:DETAIL_MAX_ITEMS]]
        if len(value) > DETAIL_MAX_ITEMS:
            kept.append(f"… {len(value) - DETAIL_MAX_ITEMS} more items not stored")
        return kept
    return clean_text(repr(value), DETAIL_STRING_MAX_CHARS)


def clean_detail(detail: Any) -> dict[str, Any]:
    """A provider's detail as a storable JSON object (``clean_json``); anything that is not a
    mapping is kept under ``"value"``."""
    if detail is None:
        return {}
    cleaned = clean_json(detail)
    return cleaned if isinstance(cleaned, dict) else {"value": cleaned}


def storable_lookup(result: Any) -> LookupResult:
    """A lookup's answer made storable before anything records or acts on it.

    The detail is cleaned (``clean_detail``). A FOUND whose references cannot all be stored
    faithfully (``reference_problem``) becomes INCONCLUSIVE with each bad one's evidence under
    ``detail["unstorable_references"]``: nobody resolves an intent automatically on an id we
    cannot keep. A value that is not a ``LookupResult`` at all (an adapter bug) is INCONCLUSIVE.
    """
    if not isinstance(result, LookupResult):
        return LookupResult(
            status=LookupStatus.INCONCLUSIVE,
            detail={"error": clean_text(f"the adapter's lookup returned {type(result).__name__}", 300)},
        )
    detail = clean_detail(result.detail)
    references = tuple(result.provider_references)
    bad = [ref for ref in references if reference_problem(ref)]
    if bad:
        detail["unstorable_references"] = [unstorable_evidence(ref) for ref in bad[:DETAIL_MAX_ITEMS]]
        detail["reported_status"] = clean_text(result.status, 50)
        good = tuple(ref for ref in references if not reference_problem(ref))
        return LookupResult(status=LookupStatus.INCONCLUSIVE, provider_references=good, detail=detail)
    return LookupResult(status=result.status, provider_references=references, detail=detail)
