"""Pruning of the ledger's rows that are no evidence of an intent's history (issue 36): the
outbox rows a claim consumed, and the webhook deliveries that are settled. What an intent did
stays in its audit chain, attempts and outcomes; these rows only carried messages.

Each function deletes one bounded batch in one statement (its own short transaction), oldest
first, on a partial index, and skips rows another transaction holds (``SKIP LOCKED``): it never
waits for a writer and a writer never waits long for it. The pass that repeats them per period
is ``reconciliation.pruning.prune_pass`` (it also clears provider event bodies, a table of
reconciliation's, which the ledger does not import).

Why deleting these is safe (read before changing what "settled" means):

- **outbox**: a row is read by the relay, the stalled-READY sweep and the health page only while
  unacknowledged (``acked_at IS NULL``: the indexes ``outbox_due_q`` and ``outbox_unacked``).
  Duplicate deliveries are absorbed by the claim's compare-and-swap on the intent, not by the
  outbox row (``operations.services.claims``); a late ``_ack`` of a pruned row updates nothing;
  recovery and failover write fresh rows, never read old ones (``operations.services.recovery``).
- **webhook deliveries**: the unique ``(intent, audit_seq, agent)`` only stops a retried
  transaction from announcing one event twice, within that transaction; a delivered or failed
  row is read by the console's list and its re-send, nothing else.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction

from operations.models import OutboxMessage, WebhookDelivery

#: One batch of consumed outbox rows past the window, oldest consumed first (index outbox_acked).
_OUTBOX_PRUNE = f"""
    DELETE FROM {OutboxMessage._meta.db_table}
    WHERE id IN (
        SELECT id FROM {OutboxMessage._meta.db_table}
        WHERE acked_at IS NOT NULL AND acked_at < statement_timestamp() - make_interval(secs => %(seconds)s)
        ORDER BY acked_at
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED
    )
"""

#: One batch of settled webhook deliveries whose last activity is past the window, oldest
#: created first (index webhook_created, read backwards). The last activity: the delivery, else
#: the last entry of ``history`` (the last attempt, or a re-send), else the creation.
_WEBHOOK_PRUNE = f"""
    DELETE FROM {WebhookDelivery._meta.db_table}
    WHERE id IN (
        SELECT id FROM {WebhookDelivery._meta.db_table}
        WHERE state IN (%(delivered)s, %(failed)s)
          AND created_at < statement_timestamp() - make_interval(secs => %(seconds)s)
          AND COALESCE(delivered_at, (history -> -1 ->> 'at')::timestamptz, created_at)
              < statement_timestamp() - make_interval(secs => %(seconds)s)
        ORDER BY created_at, id
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED
    )
"""


def _batch_checked(batch: int) -> int:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"a pruning batch must be an integer of at least 1, not {batch!r}")
    return batch


def outbox_prune(*, batch: int) -> int:
    """Delete up to ``batch`` outbox rows consumed (``acked_at`` set) more than
    ``EFFECT_LEDGER["OUTBOX_RETENTION_SECONDS"]`` (default 3600) ago, by the database clock;
    returns how many. A row not yet acknowledged is never deleted, however old: the relay still
    owes it a publication (module docstring: why nothing else reads a consumed row).

    Raises:
        ValueError: ``batch`` is not an integer of at least 1 (nothing deleted).
    """
    size = _batch_checked(batch)
    seconds = float(settings.EFFECT_LEDGER["OUTBOX_RETENTION_SECONDS"])
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_OUTBOX_PRUNE, {"seconds": seconds, "batch": size})
        return int(cursor.rowcount)


def webhook_deliveries_prune(*, batch: int) -> int:
    """Delete up to ``batch`` webhook deliveries that are settled (``delivered``, or ``failed``
    after their last attempt) and whose last activity (delivery, last attempt or re-send) is more
    than ``EFFECT_LEDGER["WEBHOOK_DELIVERY_RETENTION_DAYS"]`` (default 7) days old; returns how
    many. A pending delivery is never deleted; a deleted one can no longer be re-sent from the
    console.

    Raises:
        ValueError: ``batch`` is not an integer of at least 1 (nothing deleted).
    """
    size = _batch_checked(batch)
    days = float(settings.EFFECT_LEDGER["WEBHOOK_DELIVERY_RETENTION_DAYS"])
    params: dict[str, str | float | int] = {
        "delivered": WebhookDelivery.State.DELIVERED.value,
        "failed": WebhookDelivery.State.FAILED.value,
        "seconds": timedelta(days=days).total_seconds(),
        "batch": size,
    }
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_WEBHOOK_PRUNE, params)
        return int(cursor.rowcount)
