"""Periodic reconciliation (scheduled by Celery beat, see ``console/celery.py``)."""

from __future__ import annotations

import uuid
from typing import Any

from celery import shared_task

from operations.services import periodic_job_run
from reconciliation.events import process_provider_event as process_event
from reconciliation.services import reconcile_pass


@shared_task(name="reconciliation.reconcile")
def reconcile() -> dict[str, Any]:
    """One reconciliation pass (see ``reconciliation.services.reconcile_pass``); the run is
    recorded for the health page (``operations.services.periodic_job_run``)."""
    with periodic_job_run("reconciliation.reconcile"):
        return reconcile_pass()


@shared_task(name="reconciliation.process_provider_event")
def process_provider_event(*, message_id: str, provider_event_id: int) -> str:
    """Process one stored provider event and acknowledge its outbox message
    (``reconciliation.events.process_provider_event``)."""
    return process_event(event_pk=provider_event_id, message_id=uuid.UUID(message_id))
