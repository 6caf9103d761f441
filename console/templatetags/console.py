"""Template filters of the console: money, JSON, durations, status badges."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone

from console.permissions import reader_scope
from operations import selectors
from operations.audit.request_integrity import MISMATCH_HOLD
from operations.idempotency import key_digest as _key_digest
from operations.money import format_money
from operations.services.assignment import assignment_active
from operations.services.failover import RESTORE_GUARD_HOLD

register = template.Library()


@register.filter
def tenant_scope(user: Any) -> str:
    """The tenants ``user`` reads in the console, for the header: ``every tenant`` or their names."""
    scope = reader_scope(user)
    return "every tenant" if scope.every else ", ".join(sorted(scope.names)) or "no tenant"


@register.filter
def reads_every_tenant(user: Any) -> bool:
    """Whether ``user`` holds a console role on every tenant (the pages of no tenant: drills)."""
    return reader_scope(user).every


@register.filter
def money(amount: Any, currency: str | None = "") -> str:
    """Integer minor units in the operator's locale, by the currency's ISO 4217 exponent
    (``operations.money.format_money``): en_US ``4990, "EUR"`` -> ``€49.90``, ``125000, "JPY"``
    -> ``¥125,000``, ``1234, "KWD"`` -> ``KWD1.234``; de_DE ``4990, "EUR"`` -> ``49,90 €``.
    Blank when no amount; the raw minor units when no currency is named."""
    if not isinstance(amount, int) or isinstance(amount, bool):
        return ""
    if not currency:
        return f"{amount} minor units"
    return format_money(amount, currency)


#: What a money column shows when the action moves no money (or names no currency).
NO_AMOUNT = "—"


@register.filter
def amount(arguments: Any) -> str:
    """The money in an intent's ``arguments``, for lists that mix every action kind.

    ``{"amount": 4990, "currency": "EUR", ...}`` -> ``€49.90`` in en_US (as ``money``). Anything
    else -> ``—``: no ``amount``, an amount that is not an integer (a bool is not one), no
    ``currency`` or an empty one (an email, a reservation, a generic action whose ``amount``
    is a count), or arguments that are not a mapping.

    It takes the whole dict on purpose: ``{{ x.amount|money:x.currency }}`` raises
    ``VariableDoesNotExist`` (an HTTP 500) when ``currency`` is missing, because Django
    resolves a filter's argument strictly, unlike the value it filters.
    """
    if not isinstance(arguments, Mapping):
        return NO_AMOUNT
    value, currency = arguments.get("amount"), arguments.get("currency")
    if not isinstance(value, int) or isinstance(value, bool) or not isinstance(currency, str) or not currency:
        return NO_AMOUNT
    return money(value, currency)


@register.filter
def pretty_json(value: Any) -> str:
    """Indented JSON with sorted keys, for payloads and snapshots."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


@register.filter
def mismatch_hold(hold_reason: str) -> bool:
    """Whether a HELD intent's ``hold_reason`` says its stored request no longer hashes to its
    request_hash (``operations.audit.request_integrity``), rather than that it is not served here."""
    return isinstance(hold_reason, str) and hold_reason.startswith(MISMATCH_HOLD)


@register.filter
def restore_hold(hold_reason: str) -> bool:
    """Whether a HELD intent was held by the restore guard after a failover or restore (the
    provider cannot tell whether a forgotten timeline sent it, or cancelled it), rather than
    because it is not served here."""
    return isinstance(hold_reason, str) and hold_reason.startswith(RESTORE_GUARD_HOLD)


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


@register.filter
def assignee(intent: Any) -> Any:
    """Who is on ``intent`` ("I'm on it") and since when, or None when nobody is or their
    assignment lapsed (``operations.services.assignment_active``)."""
    return assignment_active(intent)


#: What the customer/target column shows when an action names no target.
NO_TARGET = "—"


@register.filter
def target(intent: Any) -> str:
    """Who or what ``intent`` affects (a customer, a charge, a recipient, a resource), as its
    action's adapter declares it (``operations.selectors.intent_target``); ``—`` when none."""
    return (
        selectors.intent_target(getattr(intent, "action", ""), getattr(intent, "arguments", None))
        or NO_TARGET
    )
