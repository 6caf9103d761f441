"""Which statements exist: the statement sources the served adapters declare, the actions whose
effects are a source's statement lines, and the day a statement is of (issue 19;
``reconciliation.statements`` reconciles one).
"""

from __future__ import annotations

import datetime as dt
import re

from django.utils import timezone

from operations.adapters.registry import evidence_source_actions, evidence_sources, get_adapter


class StatementRefused(ValueError):
    """A run that cannot start: an unknown source, or a source without a statement API.
    ``str()`` says which, for operators."""


_DAY = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")


def statement_day(text: str, *, today: dt.date | None = None) -> dt.date:
    """A statement's day from ``YYYY-MM-DD`` (only that form: not ``20261202`` nor
    ``2026-W49-3``, which ``date.fromisoformat`` also reads), at most ``today`` (UTC; no
    provider has a statement of a day to come).

    Raises:
        ValueError: not that form or no such date (``str()``: "is not a date (YYYY-MM-DD)"),
            or a day after today (``str()``: "is after today (UTC)").
    """
    text = text.strip()
    try:
        if not _DAY.match(text):
            raise ValueError(text)
        day = dt.date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text[:40]!r} is not a date (YYYY-MM-DD)") from None
    today = today or timezone.now().astimezone(dt.UTC).date()
    if day > today:
        raise ValueError(
            f"{day.isoformat()} is after today (UTC), {today.isoformat()}: no statement exists yet"
        )
    return day


def source_actions(source: str) -> list[str]:
    """Every served action whose adapter declares ``source`` as its ``evidence_source``, sorted.

    Raises:
        StatementRefused: no served action declares it (the known sources are named).
    """
    actions = evidence_source_actions(source)
    if not actions:
        known = ", ".join(sorted(evidence_sources())) or "none"
        raise StatementRefused(f"unknown statement source {source!r}; known sources: {known}")
    return list(actions)


def statement_actions(source: str) -> list[str]:
    """The actions of ``source`` whose effects are statement lines (``Adapter.statement_actions``),
    sorted: the intents a run matches lines to and reports missing.

    Raises:
        StatementRefused: an unknown source.
    """
    actions = source_actions(source)
    return sorted(action for action in actions if action in get_adapter(action).statement_actions())


def api_sources() -> list[str]:
    """The evidence sources whose adapter publishes a statement through an API (overrides
    ``Adapter.statement``), sorted: the ones the daily beat reconciles."""
    from operations.adapters.base import Adapter

    return sorted(
        slug
        for slug, adapter in evidence_sources().items()
        if type(adapter).statement is not Adapter.statement
    )
