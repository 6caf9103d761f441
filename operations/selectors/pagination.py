"""Keyset pagination: opaque cursors naming the last row of a page, and the page itself.

Lists use the indexes the ledger already has: intents on ``(created_at DESC, id ASC)``
(``intent_created`` / ``intent_status_created``), audit events on ``(created_at DESC, id DESC)``
(``audit_created``), so a page costs the same at row one million as at row one.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

PAGE_SIZE = 50


def encode_cursor(created_at: datetime, row_id: Any) -> str:
    """An opaque cursor for the row after which the next page starts."""
    raw = json.dumps([created_at.isoformat(), str(row_id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> tuple[datetime, str] | None:
    """The (created_at, id) a cursor names, or None for a missing or malformed cursor."""
    if not cursor:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_raw, row_id = json.loads(raw)
        created_at = parse_datetime(created_raw)
    except (binascii.Error, ValueError, TypeError):
        return None
    if created_at is None:
        return None
    return created_at, str(row_id)


@dataclass
class Page:
    """One page of a keyset-paginated list; ``next_cursor`` is None on the last page."""

    rows: list[Any]
    next_cursor: str | None
