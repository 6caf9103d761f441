"""Periodic reconciliation (scheduled by Celery beat, see ``console/celery.py``)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from operations.services import periodic_job_run
from reconciliation.services import reconcile_pass


@shared_task(name="reconciliation.reconcile")
def reconcile() -> dict[str, Any]:
    """One reconciliation pass (see ``reconciliation.services.reconcile_pass``); the run is
    recorded for the health page (``operations.services.periodic_job_run``)."""
    with periodic_job_run("reconciliation.reconcile"):
        return reconcile_pass()
