"""Periodic reconciliation (scheduled by Celery beat, see ``console/celery.py``)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from reconciliation.services import reconcile_pass


@shared_task(name="reconciliation.reconcile")
def reconcile() -> dict[str, Any]:
    """One reconciliation pass (see ``reconciliation.services.reconcile_pass``)."""
    return reconcile_pass()


# The crash lab's control executors must be importable by every worker.
from console.lab import drills  # noqa: E402, F401  (registers lab.run_drill)
from console.lab.crashlab import naive  # noqa: E402, F401
