"""Keyset pagination: opaque cursors naming the last row of a page, and the page itself.

Lists use the indexes the ledger already has: intents on ``(created_at DESC, id ASC)``
(``intent_created`` / ``intent_status_created``), audit events on ``(created_at DESC, id DESC)``
(``audit_created``), so a page costs the same at row one million as at row one.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

PAGE_SIZE = 50


def encode_cursor(created_at: datetime, row_id: Any, sort: str = "") -> str:
    """An opaque cursor for the row after which the next page starts.

    Args:
        sort: the list's sort when it is not the default one (issue 16 item 3): the cursor
            names it, and ``decode_cursor`` refuses it under another sort, whose next page
            would start at the wrong row.
    """
    position: list[str] = [created_at.isoformat(), str(row_id)]
    if sort:
        position.append(sort)
    raw = json.dumps(position).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


class InvalidCursor(ValueError):
    """A cursor was given but names no row: not ours, edited, or cut short (issue 12, item 4)."""


def cursor_time(raw: object) -> datetime:
    """The aware time a cursor's position names.

    Raises:
        InvalidCursor: not an ISO 8601 time with a zone, or one outside the calendar (month 13,
            hour 99, offset +99:00).
    """
    try:
        moment = parse_datetime(str(raw))
    except (ValueError, OverflowError) as exc:  # well-formed but impossible: 2026-13-01, +99:00
        raise InvalidCursor("malformed cursor") from exc
    if moment is None or moment.tzinfo is None:
        raise InvalidCursor("malformed cursor")
    return moment


def decode_cursor(
    cursor: str | None, *, row_id: Callable[[str], Any] = str, sort: str = ""
) -> tuple[datetime, Any] | None:
    """The (created_at, id) a cursor names, or None when there is no cursor.

    Args:
        row_id: turns the id back into the list's key (``uuid.UUID`` for intents, ``int`` for
            audit events); what it refuses is a malformed cursor.
        sort: the sort the list is read in (blank: its default); a cursor written under
            another sort is refused (``InvalidCursor``), since its position means another row.

    Raises:
        InvalidCursor: a cursor that is not one ``encode_cursor`` wrote (bad base64 or JSON,
            nesting too deep, a time without a zone or outside the calendar, an id of the wrong
            kind), or one written under another sort.
    """
    if not cursor:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_raw, row_raw, *rest = json.loads(raw)
        key = row_id(str(row_raw))
    except (binascii.Error, ValueError, TypeError, AttributeError, RecursionError) as exc:
        raise InvalidCursor("malformed cursor") from exc
    if rest != ([sort] if sort else []):
        raise InvalidCursor("a cursor of another sort")
    return cursor_time(created_raw), key


@dataclass
class Page:
    """One page of a keyset-paginated list; ``next_cursor`` is None on the last page."""

    rows: list[Any]
    next_cursor: str | None
