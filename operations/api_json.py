"""JSON of the API through ``orjson``, with the standard library's exact answers kept.

``orjson`` parses and renders in C without Python calls per value, but it differs from the
standard library (which DRF uses) on a few inputs; each is sent back to the standard library,
so the API answers exactly what it answered before, only faster on the common path:

- parsing: an integer beyond 64 bits is parsed by ``orjson`` as a lossy float (2**70 would
  become ``1.1805916207174113e+21``), so a body with a run of 19 or more digits is parsed by
  ``json.loads``; any body ``orjson`` refuses (malformed, NaN, non-UTF-8, deeper than 1024,
  ``1e400``, a lone surrogate escape) is parsed again by ``json.loads`` for today's verdict and
  message (some of those it accepts, and validation refuses them later with a 422).
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
import re
import uuid
from decimal import Decimal
from typing import Any

import orjson
from django.utils.functional import Promise
from rest_framework.renderers import JSONRenderer
from rest_framework.utils.encoders import JSONEncoder

# Integers of 19 digits or more may be beyond 64 bits (2**63 has 19); also matches inside
# strings and long fractions, which only costs the slower parser.
_LONG_DIGIT_RUN = re.compile(rb"\d{19}")
_LINE_SEPARATORS = (b"\xe2\x80\xa8", b"\xe2\x80\xa9")  # U+2028, U+2029 in UTF-8
_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
_drf_default = JSONEncoder().default
_PLAIN = frozenset({str, int, bool, type(None)})
_EXACT = (str, int, type(None), datetime.date, datetime.time, uuid.UUID, Promise)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads_strict(raw: bytes) -> Any:
    """Parse the UTF-8 JSON document ``raw`` exactly as ``json.loads`` would, NaN/Infinity
    refused (RFC 8259 section 6 has no such numbers).

    Errors:
        UnicodeDecodeError: ``raw`` is not UTF-8.
        ValueError: malformed JSON, or ``NaN``/``Infinity``/``-Infinity``.
        RecursionError: nesting deeper than the interpreter's recursion limit.
    """
    if not _LONG_DIGIT_RUN.search(raw):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # the standard library gives today's verdict and message
    return json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)


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
