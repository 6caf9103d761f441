"""Periodic reconciliation (scheduled by Celery beat, see ``console/celery.py``)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from celery import shared_task
from django.utils import timezone

from operations.services import periodic_job_run
from operations.tasks import period_claimed, periodic_result
from reconciliation.events import process_provider_event as process_event
from reconciliation.pruning import prune_pass
from reconciliation.services import reconcile_pass
from reconciliation.statement_sources import api_sources
from reconciliation.statement_uploads import statement_upload_import
from reconciliation.statements import fetch_and_run


@shared_task(name="reconciliation.reconcile")
def reconcile(claim_period: float | None = None) -> dict[str, Any]:
    """One reconciliation pass (see ``reconciliation.services.reconcile_pass``); the run is
    recorded for the health page (``operations.services.periodic_job_run``). The beat passes
    ``claim_period`` (seconds): one pass per period however many beats
    (``operations.tasks.period_claimed``); the pass's own batches are claimed with ``SKIP LOCKED``."""
    if not period_claimed("reconciliation.reconcile", claim_period):
        return {"skipped": True}
    with periodic_job_run("reconciliation.reconcile"):
        return periodic_result("reconciliation.reconcile", reconcile_pass())


@shared_task(name="reconciliation.reconcile_statements")
def reconcile_statements(claim_period: float | None = None) -> dict[str, Any]:
    """Reconcile yesterday's (UTC) statement of every source with a statement API
    (``reconciliation.statements.fetch_and_run``); recorded for the health page. A source whose
    provider cannot be read leaves a run with its error and does not stop the others.

    One scheduled run per source and day: the beat's run claims its period
    (``operations.tasks.period_claimed``), and each run is stored ``scheduled``, which a unique
    constraint allows once per source and day (a day already reconciled returns its run)."""
    if not period_claimed("reconciliation.reconcile_statements", claim_period):
        return {}
    with periodic_job_run("reconciliation.reconcile_statements"):
        day = (timezone.now() - dt.timedelta(days=1)).astimezone(dt.UTC).date()
        runs = {source: fetch_and_run(source=source, day=day, scheduled=True) for source in api_sources()}
        result = {source: {"run": r.id, "error": r.error} for source, r in runs.items()}
        return periodic_result("reconciliation.reconcile_statements", result, worked=bool(result))


@shared_task(name="reconciliation.prune")
def prune(claim_period: float | None = None) -> dict[str, int]:
    """One pruning pass (``reconciliation.pruning.prune_pass``: acknowledged outbox rows,
    settled webhook deliveries, old provider event bodies); returns how many of each. The beat
    passes ``claim_period`` (seconds, ``PRUNE_PERIOD_SECONDS``): one pass per period however
    many beats (``operations.tasks.period_claimed``). Recorded for the health page."""
    if not period_claimed("reconciliation.prune", claim_period):
        return {}
    with periodic_job_run("reconciliation.prune"):
        return periodic_result("reconciliation.prune", prune_pass())


@shared_task(name="reconciliation.process_provider_event")
def process_provider_event(*, message_id: str, provider_event_id: int) -> str:
    """Process one stored provider event and acknowledge its outbox message
    (``reconciliation.events.process_provider_event``)."""
    return process_event(event_pk=provider_event_id, message_id=uuid.UUID(message_id))


@shared_task(name="reconciliation.import_statement_upload")
def import_statement_upload(*, message_id: str, upload_id: int) -> str:
    """Import the next batches of an uploaded CSV statement, handing the rest to a new message
    when its time is up (``reconciliation.statement_uploads.statement_upload_import``); sent
    through the outbox by the upload and by the import itself."""
    return statement_upload_import(upload_id=upload_id, message_id=uuid.UUID(message_id))
