"""The small languages of a declared provider (issue 33): request templates, form encoding and
JSON pointers into a provider's answer.

* **Templates** build a request body, a URL or a compensation's arguments from an intent.
  A string holding one placeholder and nothing else (``"{amount}"``) is replaced by the value
  with its JSON type (an integer stays an integer); placeholders inside longer text are written
  as text (``"Order {reference}"``). A placeholder names an argument or one of the call's
  values (``idempotency_key``, ``reference``, ``intent_id``, ``fence``, ``provider_reference``),
  optionally with one filter: ``{currency|lower}``, ``{currency|upper}``. A placeholder whose
  value is missing drops its key from an object (an optional argument not given); in longer
  text or a URL it is refused (``TemplateValueMissing``), never written as "None".
* **Form encoding** (``application/x-www-form-urlencoded``) of nested values the way Stripe's API
  reads them: ``metadata[reference]=...``, ``items[0][price]=...``, booleans as ``true``/``false``
  (Stripe API reference, "Form-encoded requests").

JSON pointers into an answer (RFC 6901) are ``operations.adapters.json_pointer``'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

#: ``{name}`` or ``{name|filter}``; names are argument names or the call's values.
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]{0,63})(?:\|(lower|upper))?\}")
#: The values a template may name besides the arguments.
CALL_VALUES = ("idempotency_key", "reference", "intent_id", "fence", "provider_reference")

_MISSING = object()


class TemplateValueMissing(Exception):
    """A placeholder inside text or a URL names a value the intent does not have."""


def _value(name: str, flt: str | None, values: Mapping[str, Any]) -> Any:
    value = values.get(name, _MISSING)
    if value is _MISSING or value is None or value == "":
        return _MISSING
    if flt and isinstance(value, str):
        value = value.lower() if flt == "lower" else value.upper()
    return value


def _text(template: str, values: Mapping[str, Any], *, quote_values: bool) -> str:
    def replace(match: re.Match[str]) -> str:
        value = _value(match.group(1), match.group(2), values)
        if value is _MISSING:
            raise TemplateValueMissing(f"the template names {{{match.group(1)}}}, which this intent lacks")
        text = str(value).lower() if isinstance(value, bool) else str(value)
        return quote(text, safe="") if quote_values else text

    return PLACEHOLDER.sub(replace, template)


def render(template: Any, values: Mapping[str, Any]) -> Any:
    """``template`` (any JSON value) with its placeholders replaced from ``values``.

    Args:
        template: a JSON value whose strings may hold placeholders (module docstring).
        values: the arguments and the call's values, by name.

    Returns:
        a new JSON value; an object's key whose whole-string placeholder has no value is left out.

    Raises:
        TemplateValueMissing: a placeholder inside longer text has no value.
    """
    if isinstance(template, str):
        whole = PLACEHOLDER.fullmatch(template)
        if whole:
            return _value(whole.group(1), whole.group(2), values)
        return _text(template, values, quote_values=False)
    if isinstance(template, dict):
        rendered = {key: render(item, values) for key, item in template.items()}
        return {key: item for key, item in rendered.items() if item is not _MISSING}
    if isinstance(template, list):
        return [item for item in (render(i, values) for i in template) if item is not _MISSING]
    return template


def render_url(template: str, values: Mapping[str, Any]) -> str:
    """``template`` with each placeholder replaced by its value, percent-encoded (RFC 3986 §2.1),
    so that a value can never add a path segment or a query parameter.

    Raises:
        TemplateValueMissing: a placeholder has no value.
    """
    return _text(template, values, quote_values=True)


def placeholders(template: Any) -> set[str]:
    """Every name a template's placeholders use (for start-up checks)."""
    if isinstance(template, str):
        return {m.group(1) for m in PLACEHOLDER.finditer(template)}
    if isinstance(template, dict):
        return set().union(*(placeholders(v) for v in template.values())) if template else set()
    if isinstance(template, list):
        return set().union(*(placeholders(v) for v in template)) if template else set()
    return set()


def form_pairs(value: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Flatten ``value`` into form fields the way Stripe reads them: nested objects as
    ``a[b]``, lists as ``a[0]``, booleans as ``true``/``false``, None left out; in order.

    >>> form_pairs({"amount": 1200, "metadata": {"reference": "ord-1"}, "capture": True})
    [('amount', '1200'), ('metadata[reference]', 'ord-1'), ('capture', 'true')]
    """
    pairs: list[tuple[str, str]] = []
    stack: list[tuple[str, Any]] = list(reversed(list(value.items())))
    while stack:
        name, item = stack.pop()
        if item is None:
            continue
        if isinstance(item, dict):
            stack.extend(reversed([(f"{name}[{k}]", v) for k, v in item.items()]))
        elif isinstance(item, list):
            stack.extend(reversed([(f"{name}[{i}]", v) for i, v in enumerate(item)]))
        elif isinstance(item, bool):
            pairs.append((name, "true" if item else "false"))
        else:
            pairs.append((name, str(item)))
    return pairs
