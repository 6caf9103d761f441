"""Template filters of the console: money, JSON, durations, status badges."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone

from operations.idempotency import key_digest as _key_digest

register = template.Library()


@register.filter
def money(amount: Any, currency: str | None = "") -> str:
    """``4990, "EUR"`` -> ``49.90 EUR`` (integer minor units, two decimals); blank when no amount."""
    if not isinstance(amount, int):
        return ""
    sign = "-" if amount < 0 else ""
    whole, cents = divmod(abs(amount), 100)
    return f"{sign}{whole:,}.{cents:02d} {currency or ''}".strip()


@register.filter
def pretty_json(value: Any) -> str:
    """Indented JSON with sorted keys, for payloads and snapshots."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


@register.filter
def key_digest(key: str) -> str:
    """The short digest of a provider idempotency key (never the key itself)."""
    return _key_digest(key) if key else ""


@register.filter
def duration(seconds: float | None) -> str:
    """``3725`` -> ``1 h 2 min``; ``42`` -> ``42 s``; blank for None."""
    if seconds is None:
        return ""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{hours // 24} d {hours % 24} h"


@register.filter
def age(moment: datetime | None) -> str:
    """Time since ``moment``, as ``duration``."""
    if moment is None:
        return ""
    return duration((timezone.now() - moment).total_seconds())


@register.filter
def remaining(moment: datetime | None) -> str:
    """Time until ``moment`` (``expired`` when past), as ``duration``."""
    if moment is None:
        return ""
    seconds = (moment - timezone.now()).total_seconds()
    return "expired" if seconds <= 0 else duration(seconds)


@register.filter
def status_class(status: str) -> str:
    """CSS class of a status badge."""
    return "status status-" + str(status).lower().replace("_", "-")
