"""App config for the operator console."""

from __future__ import annotations

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The operator console: approvals, UNKNOWN queue, intents, audit, dashboard."""

    name = "console"

    def ready(self) -> None:
        """Import the Celery app so it is the current app of every Django process (the web
        server's ``delay()`` calls, the commands) before any task is sent (``console/__init__``
        no longer imports it)."""
        import console.celery  # noqa: F401
