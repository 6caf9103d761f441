"""The outbox: committed rows become Celery messages, each consumed once by a claim.

A row written with a state change is handed to the broker right after its transaction commits,
by the process that wrote it (``handoff_after_commit``), without another database write: the
row was stamped ``sent_at`` in its own INSERT (``enqueue_statement``). The claim that consumes
the intent acknowledges its rows (``acked_at``) in the claim's own transaction (issue 13: three
write transactions per intent). The periodic relay publishes what the hand-off did not:

- rows never handed over: due later than ``MAX_COUNTDOWN_SECONDS`` when written (a retry's
  backoff, C15), or whose hand-off failed (the broker was down: the writer cleared ``sent_at``
  and recorded ``last_error``, C04);
- rows handed over but unacknowledged after ``operations.workers.delivery.stalled_ready_seconds()``
  (the writer died between commit and publication, or the broker lost the message), published
  again once per that bound while their intent is still READY and execution is not paused
  (issue 22: the recovery that resumes it re-dispatches every READY intent);
- a row whose intent is no longer READY is obsolete (the intent was claimed through another
  message, cancelled, held): the relay acknowledges it without publishing.

Rows are claimed with ``FOR UPDATE SKIP LOCKED`` in bounded batches, published, and marked in
the same transaction. A crash between publish and commit publishes the row again later:
consumers are idempotent (the claim's compare-and-swap absorbs the duplicate). Every
publication of a row carries the row's id as the task id and its frozen body as the task's
keyword arguments, so re-sends are byte-identical (shared/cases C08).
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass

from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F

from operations import metrics
from operations.models import OutboxMessage
from operations.statements import Statement
from operations.workers.delivery import MAX_COUNTDOWN_SECONDS, bounded_countdown, stalled_ready_seconds

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Handoff:
    """An outbox row as published: its id (the task id), task name and frozen body."""

    id: uuid.UUID
    task: str
    body: str


def _publish(message: Handoff, countdown: float) -> None:
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


#: Rows the relay may publish: never handed over, or handed over and unacknowledged for longer
#: than the stalled bound, due within the countdown bound; at most a batch of each kind, oldest
#: first. Served by the partial indexes outbox_due_q and outbox_unacked.
_RELAY_CANDIDATES = f"""
    SELECT o.id, o.task, o.body,
           EXTRACT(EPOCH FROM (o.due_at - statement_timestamp())) AS wait,
           (o.intent_id IS NULL OR i.status = 'READY') AS live
    FROM {OutboxMessage._meta.db_table} o
    LEFT JOIN operations_intent i ON i.id = o.intent_id
    WHERE o.id IN (
        (SELECT id FROM {OutboxMessage._meta.db_table}
         WHERE acked_at IS NULL AND sent_at IS NULL
           AND due_at <= statement_timestamp() + make_interval(secs => %(bound)s)
         ORDER BY due_at LIMIT %(batch)s)
        UNION ALL
        (SELECT id FROM {OutboxMessage._meta.db_table}
         WHERE acked_at IS NULL AND sent_at < statement_timestamp() - make_interval(secs => %(stalled)s)
           AND due_at <= statement_timestamp() + make_interval(secs => %(bound)s)
           -- while execution is paused no claim can consume them; recovery re-dispatches
           AND NOT EXISTS (SELECT 1 FROM operations_executioncontrol WHERE paused_at IS NOT NULL)
         ORDER BY sent_at LIMIT %(batch)s)
    )
    ORDER BY o.due_at
    FOR UPDATE OF o SKIP LOCKED
"""

#: The named rows, when not marked sent and due within the countdown bound (a kick, a drill).
_RELAY_NAMED = f"""
    SELECT id, task, body, EXTRACT(EPOCH FROM (due_at - statement_timestamp())) AS wait, true AS live
    FROM {OutboxMessage._meta.db_table}
    WHERE id = ANY(%(ids)s) AND sent_at IS NULL
      AND due_at <= statement_timestamp() + make_interval(secs => %(bound)s)
    ORDER BY due_at
    FOR UPDATE SKIP LOCKED
"""


def outbox_relay(*, batch: int | None = None, message_ids: list[uuid.UUID] | None = None) -> int:
    """Publish up to ``batch`` due outbox rows of each kind (never handed over; handed over but
    unacknowledged past ``stalled_ready_seconds()``), earliest due first. Returns how many
    were published.

    A row is due ``MAX_COUNTDOWN_SECONDS`` (30 s) before its ``due_at`` (a retry's backoff,
    copied from the intent's ``not_before``) and is published with a countdown of what remains,
    so the broker never holds a message longer than that bound. A row due later stays pending
    and is not lag (shared/cases C15). When the broker refuses a publication, the row stays
    pending with ``last_error`` set and the pass stops; the next pass tries again (C04). A row
    whose intent is no longer READY is acknowledged, not published.

    Args:
        batch: rows per pass and kind (default ``EFFECT_LEDGER["OUTBOX_BATCH"]``).
        message_ids: only these rows, if not marked sent and due, whether acknowledged or not
            (an operator's or a drill's re-send; the claim absorbs a duplicate).
    """
    size = batch or settings.EFFECT_LEDGER["OUTBOX_BATCH"]
    sent: list[uuid.UUID] = []
    obsolete: list[uuid.UUID] = []
    with transaction.atomic(), connection.cursor() as cursor:
        if message_ids is None:
            params = {"bound": MAX_COUNTDOWN_SECONDS, "batch": size, "stalled": stalled_ready_seconds()}
            cursor.execute(_RELAY_CANDIDATES, params)
        else:
            cursor.execute(_RELAY_NAMED, {"ids": message_ids, "bound": MAX_COUNTDOWN_SECONDS})
        rows = cursor.fetchall()
        for message_id, task, body, wait, live in rows:
            if not live:
                obsolete.append(message_id)
                continue
            try:
                _publish(Handoff(id=message_id, task=task, body=body), float(wait))
            except Exception as exc:  # the broker is down or refused: keep the row pending
                metrics.OUTBOX_PUBLISH_ERRORS.inc()
                logger.warning(
                    "outbox publish failed", extra={"message_id": str(message_id), "error": str(exc)[:200]}
                )
                cursor.execute(
                    f"UPDATE {OutboxMessage._meta.db_table} SET last_error = %s WHERE id = %s",
                    [str(exc)[:1000], message_id],
                )
                break
            sent.append(message_id)
        if sent:
            cursor.execute(
                f"UPDATE {OutboxMessage._meta.db_table} SET sent_at = statement_timestamp(),"
                " publish_count = publish_count + 1, last_error = '' WHERE id = ANY(%s)",
                [sent],
            )
        if obsolete:
            cursor.execute(
                f"UPDATE {OutboxMessage._meta.db_table} SET acked_at = statement_timestamp() WHERE id = ANY(%s)",
                [obsolete],
            )
    metrics.OUTBOX_PUBLISHED.inc(len(sent))
    return len(sent)


def enqueue_statement(handoff: Handoff, *, intent_id: uuid.UUID | None) -> Statement:
    """The INSERT of an outbox row for ``handoff`` (run it in the state change's transaction,
    e.g. in ``operations.statements.run_together``)::

        INSERT INTO operations_outboxmessage
            (id, intent_id, task, body, created_at, due_at, sent_at, publish_count, last_error)
        SELECT <id>, <intent>, <task>, <body>, statement_timestamp(), due.at,
               CASE WHEN due.at <= statement_timestamp() + 30 s THEN statement_timestamp() END, ...
        FROM (SELECT GREATEST((SELECT not_before FROM operations_intent WHERE id = <intent>),
                              statement_timestamp()) AS at) AS due
        RETURNING <seconds until due, when handed over at commit, else NULL>

    ``due_at`` is the intent's ``not_before`` when later than now (the relay keeps the row until
    then, C15); a row due within ``MAX_COUNTDOWN_SECONDS`` is stamped ``sent_at`` and
    ``publish_count`` 1 for the hand-off after commit (``handoff_after_commit``), whose
    countdown is the value returned. The intent's ``not_before`` is read as of the statement's
    snapshot: set it in an earlier statement of the transaction.

    ``intent_id`` None: a message about no intent (a provider event to process, issue 19): due
    now, and the relay publishes it until its task acknowledges it (``acked_at``).
    """
    table = OutboxMessage._meta.db_table
    sql = f"""
        INSERT INTO {table} (id, intent_id, task, body, created_at, due_at, sent_at, publish_count, last_error)
        SELECT %s, %s, %s, %s, statement_timestamp(), due.at,
               CASE WHEN due.at <= statement_timestamp() + make_interval(secs => %s) THEN statement_timestamp() END,
               CASE WHEN due.at <= statement_timestamp() + make_interval(secs => %s) THEN 1 ELSE 0 END, ''
        FROM (SELECT GREATEST(
            (SELECT not_before FROM operations_intent WHERE id = %s), statement_timestamp()) AS at) AS due
        RETURNING CASE WHEN sent_at IS NOT NULL THEN EXTRACT(EPOCH FROM (due_at - statement_timestamp())) END
    """
    params = (handoff.id, intent_id, handoff.task, handoff.body, MAX_COUNTDOWN_SECONDS, MAX_COUNTDOWN_SECONDS, intent_id)  # fmt: skip
    return Statement(sql, params, returns=True)


def handoff_after_commit(handoff: Handoff, countdown: float | None) -> None:
    """After the writing transaction commits, publish its outbox row (``countdown`` None: the
    row is due later; the relay publishes it when due). Nothing is written when the broker
    takes it; when it refuses, ``sent_at`` is cleared with ``last_error`` set, so the next relay
    pass publishes it (C04). Never raises. Nothing is published before commit, and nothing at
    all when the transaction rolls back (C03)."""
    if countdown is None:
        return

    def publish() -> None:
        try:
            _publish(handoff, countdown)
        except Exception as exc:  # noqa: BLE001 - the relay is the safety net
            metrics.OUTBOX_PUBLISH_ERRORS.inc()
            logger.warning(
                "outbox hand-off failed; the relay will publish",
                extra={"message_id": str(handoff.id), "error": str(exc)[:200]},
            )
            try:
                OutboxMessage.objects.filter(id=handoff.id, acked_at__isnull=True).update(
                    sent_at=None, publish_count=F("publish_count") - 1, last_error=str(exc)[:1000]
                )
            except Exception:  # noqa: BLE001 - then the stalled bound re-publishes it
                logger.warning("could not mark the outbox row unsent", exc_info=True)
            return
        metrics.OUTBOX_PUBLISHED.inc()

    transaction.on_commit(publish)
