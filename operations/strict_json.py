"""JSON read strictly: what the API parses from agents and the adapters from providers.

``loads_strict`` is the standard library's ``json.loads`` with two refusals DRF's
parser lacks: NaN/Infinity (RFC 8259 section 6 has no such numbers) and an object with the
same member name twice (I-JSON, RFC 7493 section 2.3, which RFC 8785's canonical form assumes:
a gateway that read the first of two ``amount`` members would see another request than the
one we hashed). ``orjson`` cannot report duplicate names (the last one silently wins), so it
is not used for parsing; the duplicate check costs about 15 microseconds on a typical body.
"""

from __future__ import annotations

import json
from typing import Any


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class DuplicateMemberName(ValueError):
    """An object in the document names one member twice (RFC 7493 section 2.3)."""


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` of ``loads_strict``: the object as a dict, or ``DuplicateMemberName``
    naming the first repeated member."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise DuplicateMemberName(f"the member name {name!r} appears twice in one object (RFC 7493)")
            seen.add(name)
    return obj


def loads_strict(raw: bytes) -> Any:
    """Parse the UTF-8 JSON document ``raw`` as ``json.loads`` would (integers exact at any
    size), with NaN/Infinity and duplicate member names refused.

    Errors:
        UnicodeDecodeError: ``raw`` is not UTF-8.
        DuplicateMemberName (a ValueError): one object names a member twice.
        ValueError: malformed JSON, or ``NaN``/``Infinity``/``-Infinity``.
        RecursionError: nesting deeper than the interpreter's recursion limit.
    """
    return json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant, object_pairs_hook=_unique_members)
