"""The outbox relay: turns committed outbox rows into Celery messages.

Rows are claimed with ``FOR UPDATE SKIP LOCKED`` in bounded batches, published, and marked
sent in the same transaction. A crash between publish and commit publishes the row again
later: consumers are idempotent (the claim's compare-and-swap absorbs the duplicate). Every
publication of a row carries the row's id as the task id and its frozen body as the task's
keyword arguments, so re-sends are byte-identical (shared/cases C08). Delays stay in the
database: a row is published only within ``MAX_COUNTDOWN_SECONDS`` of its ``due_at`` (C15).
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now

from operations import metrics
from operations.delivery import MAX_COUNTDOWN_SECONDS, bounded_countdown
from operations.models import OutboxMessage

logger = logging.getLogger(__name__)


def _publish(message: OutboxMessage, countdown: float) -> None:
    # Celery's current app: the project's (console/celery.py makes it the default of every
    # thread); the ledger does not import the project package.
    kwargs = json.loads(message.body)
    kwargs.pop("task", None)
    bounded = bounded_countdown(countdown)
    current_app.send_task(
        message.task,
        kwargs=kwargs,
        task_id=str(message.id),
        countdown=bounded if bounded > 0 else None,
        retry=False,
    )


def outbox_relay(*, batch: int | None = None, message_ids: list[uuid.UUID] | None = None) -> int:
    """Publish up to ``batch`` due outbox rows, earliest due first. Returns how many were sent.

    A row is due ``MAX_COUNTDOWN_SECONDS`` (30 s) before its ``due_at`` (a retry's backoff,
    copied from the intent's ``not_before``) and is published with a countdown of what remains,
    so the broker never holds a message longer than that bound. A row due later stays pending
    and is not lag (shared/cases C15). When the broker refuses a publication, the row stays
    pending with ``last_error`` set and the pass stops; the next pass tries again (C04).

    Args:
        batch: rows per pass (default ``EFFECT_LEDGER["OUTBOX_BATCH"]``).
        message_ids: only these rows (the post-commit kick), if still pending and due.
    """
    size = batch or settings.EFFECT_LEDGER["OUTBOX_BATCH"]
    sent: list[uuid.UUID] = []
    with transaction.atomic():
        # Served by the partial index outbox_due_q: O(batch) however many rows wait for later.
        queryset = (
            OutboxMessage.objects.select_for_update(skip_locked=True)
            .filter(sent_at__isnull=True, due_at__lte=Now() + timedelta(seconds=MAX_COUNTDOWN_SECONDS))
            .annotate(wait=RawSQL("EXTRACT(EPOCH FROM (due_at - statement_timestamp()))", []))
        )
        if message_ids is not None:
            queryset = queryset.filter(id__in=message_ids)
        rows = list(queryset.order_by("due_at")[:size])
        if not rows:
            return 0
        for row in rows:
            try:
                _publish(row, float(row.wait))
            except Exception as exc:  # the broker is down or refused: keep the row pending
                metrics.OUTBOX_PUBLISH_ERRORS.inc()
                logger.warning(
                    "outbox publish failed", extra={"message_id": str(row.id), "error": str(exc)[:200]}
                )
                OutboxMessage.objects.filter(id=row.id).update(last_error=str(exc)[:1000])
                break
            sent.append(row.id)
        if sent:
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE operations_outboxmessage SET sent_at = statement_timestamp(), publish_count = publish_count + 1,"
                    " last_error = '' WHERE id = ANY(%s)",
                    [sent],
                )
    metrics.OUTBOX_PUBLISHED.inc(len(sent))
    return len(sent)


def kick_relay(message_id: uuid.UUID | None = None) -> None:
    """After a commit, publish the new message now for latency. Never raises: if the broker is
    down the row stays pending and the periodic relay (Celery beat) sends it later."""
    try:
        outbox_relay(message_ids=[message_id] if message_id else None)
    except Exception:  # noqa: BLE001 - the safety net is the periodic relay
        logger.warning("outbox kick failed; the periodic relay will publish", exc_info=True)
