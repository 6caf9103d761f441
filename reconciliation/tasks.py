"""Periodic reconciliation (scheduled by Celery beat, see ``console/celery.py``)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from reconciliation.services import reconcile_pass


@shared_task(name="reconciliation.reconcile")
def reconcile() -> dict[str, Any]:
    """One reconciliation pass (see ``reconciliation.services.reconcile_pass``)."""
    return reconcile_pass()

