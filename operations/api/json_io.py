"""JSON of the API: a strict parser, and ``orjson`` for rendering with DRF's exact bytes kept.

- parsing (``loads_strict``) is the standard library's ``json.loads`` with two refusals DRF's
  parser lacks: NaN/Infinity (RFC 8259 section 6 has no such numbers) and an object with the
  same member name twice (I-JSON, RFC 7493 section 2.3, which RFC 8785's canonical form assumes:
  a gateway that read the first of two ``amount`` members would see another request than the
  one we hashed). ``orjson`` cannot report duplicate names (the last one silently wins), so it
  is not used for parsing; the duplicate check costs about 15 microseconds on a typical body.
- rendering: ``orjson`` writes NaN and Infinity as ``null`` (DRF's ``STRICT_JSON`` refuses
  them) and ``1e-7`` where Python writes ``1e-07``, so data holding any float or Decimal (rare
  in responses: only inside an intent's own arguments, metadata or outcome) is rendered by DRF's
  ``JSONRenderer``, and so is data ``orjson`` refuses (integers beyond 64 bits, keys that are
  not text). Dates, times and lazy strings go through DRF's own encoder; U+2028/U+2029 are
  escaped as DRF escapes them.
"""

from __future__ import annotations

import datetime
import json
import uuid
from decimal import Decimal
from typing import Any

import orjson
from django.utils.functional import Promise
from rest_framework.renderers import JSONRenderer
from rest_framework.utils.encoders import JSONEncoder

_LINE_SEPARATORS = (b"\xe2\x80\xa8", b"\xe2\x80\xa9")  # U+2028, U+2029 in UTF-8
_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
_drf_default = JSONEncoder().default
_PLAIN = frozenset({str, int, bool, type(None)})
_EXACT = (str, int, type(None), datetime.date, datetime.time, uuid.UUID, Promise)


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


def _only_exact_types(value: Any) -> bool:
    """Whether ``value`` holds nothing but text, integers, booleans, None, dates, times, UUIDs
    and lazy strings in dicts, lists and tuples: the values ``orjson`` and DRF write alike.
    A float or Decimal (NaN, Infinity, ``1e-07``) or anything else answers False. Iterative, so
    deep nesting cannot overflow the stack."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in _PLAIN:
            continue
        if kind is dict:
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
        elif isinstance(item, float | Decimal):
            return False
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif not isinstance(item, _EXACT):
            return False
    return True


class FastJSONRenderer(JSONRenderer):
    """DRF's ``JSONRenderer`` (compact, UTF-8, strict) with ``orjson`` on the common path; the
    bytes are the same as DRF's (see the module docstring for the cases handed back to it)."""

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        """Render ``data`` to JSON bytes; ``b""`` for ``None``, as DRF does.

        Errors: ``ValueError`` for NaN/Infinity and ``TypeError`` for what DRF's encoder cannot
        write, both raised by DRF's renderer.
        """
        if data is None:
            return b""
        indented = (renderer_context or {}).get("indent") or "indent" in (accepted_media_type or "")
        if indented or self.ensure_ascii or not self.compact or not _only_exact_types(data):
            return self._drf_render(data, accepted_media_type, renderer_context)
        try:
            out = orjson.dumps(data, default=_drf_default, option=_OPTIONS)
        except (orjson.JSONEncodeError, ValueError):  # an integer beyond 64 bits, a key not text
            return self._drf_render(data, accepted_media_type, renderer_context)
        for separator in _LINE_SEPARATORS:
            if separator in out:
                # DRF escapes them for JavaScript (JSONP) safety
                out = out.replace(_LINE_SEPARATORS[0], b"\\u2028").replace(_LINE_SEPARATORS[1], b"\\u2029")
                break
        return out

    def _drf_render(self, data: Any, accepted_media_type: str | None, renderer_context: Any) -> bytes:
        rendered: bytes = super().render(data, accepted_media_type, renderer_context)
        return rendered
