"""The Celery application (settings namespace ``CELERY``)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("effect_ledger")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
