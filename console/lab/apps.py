"""App config for the lab."""

from __future__ import annotations

from django.apps import AppConfig


class LabConfig(AppConfig):
    """The lab: sandbox provider, crash lab, drills, benchmark and process harness."""

    name = "console.lab"
    label = "lab"
    default_auto_field = "django.db.models.BigAutoField"
