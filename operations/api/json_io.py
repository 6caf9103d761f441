"""JSON of the API: ``orjson`` for rendering with DRF's exact bytes kept (parsing is
``operations.strict_json``).

``orjson`` writes NaN and Infinity as ``null`` (DRF's ``STRICT_JSON`` refuses
them) and ``1e-7`` where Python writes ``1e-07``, so data holding any float or Decimal (rare
in responses: only inside an intent's own arguments, metadata or outcome) is rendered by DRF's
``JSONRenderer``, and so is data ``orjson`` refuses (integers beyond 64 bits, keys that are
not text). Dates, times and lazy strings go through DRF's own encoder; U+2028/U+2029 are
escaped as DRF escapes them.
"""

from __future__ import annotations

import datetime
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
