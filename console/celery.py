"""The Celery application (settings namespace ``CELERY``) and the beat schedule."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("effect_ledger", include=["operations.bench.tasks"])
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# The periodic safety nets, declared in code. Each task claims a bounded batch, so a pass
# costs O(batch) whatever the table size.
def _period(name: str, default: float) -> float:
    return float(os.environ.get(name) or default)


app.conf.beat_schedule = {
    "relay-outbox": {
        "task": "operations.relay_outbox",
        "schedule": _period("EFFECT_LEDGER_RELAY_PERIOD_SECONDS", 2.0),
    },
    "reconcile": {
        "task": "reconciliation.reconcile",
        "schedule": _period("EFFECT_LEDGER_RECONCILE_PERIOD_SECONDS", 5.0),
    },
}
