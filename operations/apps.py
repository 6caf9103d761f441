"""App config for the ledger."""

from __future__ import annotations

from django.apps import AppConfig


class OperationsConfig(AppConfig):
    """The ledger: intents, attempts, outcomes, approvals, outbox, audit."""

    name = "operations"
    default_auto_field = "django.db.models.BigAutoField"
