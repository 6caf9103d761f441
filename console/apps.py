"""App config for the operator console."""

from __future__ import annotations

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The operator console: approvals, UNKNOWN queue, intents, audit, dashboard."""

    name = "console"
