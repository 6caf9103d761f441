"""JSON pointers (RFC 6901): naming one value inside a JSON document, e.g. ``/data/object/id``.

Used to say where a provider's event body keeps each fact (``operations.adapters.event_schemes``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

_ARRAY_INDEX = re.compile(r"0|[1-9][0-9]{0,17}")
_BAD_ESCAPE = re.compile(r"~(?![01])")


def pointer_tokens(pointer: str) -> list[str]:
    """The reference tokens of a JSON pointer, unescaped (RFC 6901 sections 3 and 4: ``~1`` is
    ``/``, then ``~0`` is ``~``). ``""`` is the whole document (no tokens).

    Raises:
        ValueError: not "" and not starting with ``/``, or a ``~`` not followed by 0 or 1.
    """
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise ValueError("a JSON pointer is empty or starts with '/'")
    tokens = pointer[1:].split("/")
    if any(_BAD_ESCAPE.search(token) for token in tokens):
        raise ValueError("in a JSON pointer '~' must be followed by 0 or 1")
    return [token.replace("~1", "/").replace("~0", "~") for token in tokens]


def pointer_from_tokens(tokens: Iterable[str]) -> str:
    """The JSON pointer of ``tokens`` (member names or array indexes), escaped (RFC 6901)."""
    return "".join("/" + token.replace("~", "~0").replace("/", "~1") for token in tokens)


def is_pointer(value: object) -> bool:
    """Whether ``value`` is a well-formed JSON pointer (``pointer_tokens`` accepts it)."""
    if not isinstance(value, str):
        return False
    try:
        pointer_tokens(value)
    except ValueError:
        return False
    return True


def resolve_pointer(document: Any, pointer: str, default: Any = None) -> Any:
    """The value ``pointer`` refers to in the parsed JSON ``document``, or ``default`` when it
    refers to nothing: a missing member, an index past the end or not written as RFC 6901
    section 4 requires (``0`` or digits without a leading zero; ``-`` is never an element), or a
    token applied to a string, number, boolean or null.

    Raises:
        ValueError: ``pointer`` is not a JSON pointer (``pointer_tokens``).
    """
    value = document
    for token in pointer_tokens(pointer):
        if isinstance(value, dict):
            if token not in value:
                return default
            value = value[token]
        elif isinstance(value, list):
            if not _ARRAY_INDEX.fullmatch(token) or int(token) >= len(value):
                return default
            value = value[int(token)]
        else:
            return default
    return value
