"""The levels the health page judges by (green, amber, red) and its summary lines (``Signal``),
shared by every health reading (``operations.selectors.health``, ``broker_queues``,
``provider_calls``); thresholds are settings (``health_settings``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

GREEN, AMBER, RED = "green", "amber", "red"
_RANK = {GREEN: 0, AMBER: 1, RED: 2}


def worst(*levels: str) -> str:
    """The worst of ``levels`` (red > amber > green); green for none."""
    return max(levels, key=_RANK.__getitem__, default=GREEN)


def health_settings() -> dict[str, Any]:
    """``settings.EFFECT_LEDGER``, where the health thresholds are (``HEALTH_*``)."""
    config: dict[str, Any] = settings.EFFECT_LEDGER
    return config


@dataclass(frozen=True)
class Signal:
    """One line of the health summary: ``level`` (green/amber/red) and what it says."""

    key: str
    name: str
    level: str
    summary: str
