"""App config for reconciliation."""

from __future__ import annotations

from django.apps import AppConfig


class ReconciliationConfig(AppConfig):
    """Reconcilers, resolution services, compensation and periodic tasks."""

    name = "reconciliation"
    default_auto_field = "django.db.models.BigAutoField"
