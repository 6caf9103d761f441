"""App config for the ledger."""

from __future__ import annotations

from django.apps import AppConfig


class OperationsConfig(AppConfig):
    """The ledger: intents, attempts, outcomes, approvals, outbox, audit."""

    name = "operations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from operations import checks  # noqa: F401  (registers the system checks)
