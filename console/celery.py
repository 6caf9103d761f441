"""The Celery application (settings namespace ``CELERY``) and the beat schedule."""

from __future__ import annotations

import os

from celery import Celery
from django.conf import settings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("effect_ledger", include=["console.lab.bench.tasks"])
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# The periodic safety nets, declared in code. Each task claims a bounded batch, so a pass
# costs O(batch) whatever the table size. The periods (seconds) are settings, because the
# stalled-READY sweep derives its threshold from the relay's (operations.delivery).
app.conf.beat_schedule = {
    "relay-outbox": {
        "task": "operations.relay_outbox",
        "schedule": settings.EFFECT_LEDGER["RELAY_PERIOD_SECONDS"],
    },
    "reconcile": {
        "task": "reconciliation.reconcile",
        "schedule": settings.EFFECT_LEDGER["RECONCILE_PERIOD_SECONDS"],
    },
}
