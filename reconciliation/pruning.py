"""The pruning pass (issue 36): what is no evidence of an intent's history leaves once settled,
a bounded batch at a time. The beat runs it every ``PRUNE_PERIOD_SECONDS`` (task
``reconciliation.prune``); notices and reconciliation runs are pruned by their own passes
(``operations.services.notifications.notifications_prune``, ``reconciliation.services
.prune_reconciliation_runs``), and settled intents leave by the archive, not here.

- acknowledged outbox rows past ``OUTBOX_RETENTION_SECONDS`` (``operations.services.pruning``);
- settled webhook deliveries past ``WEBHOOK_DELIVERY_RETENTION_DAYS`` (same module);
- the bodies of processed provider events past ``RAW_BODY_RETENTION_DAYS`` (here: the table is
  reconciliation's, and the ledger imports nothing of reconciliation).

It lives in reconciliation because it is the lowest layer that may import both.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.db.models.functions import Now

from operations.idempotency import CanonicalizationError, canonical_json, sha256_hex
from operations.services.pruning import outbox_prune, webhook_deliveries_prune
from reconciliation.models import ProviderEvent, ProviderFinding

#: Seconds a pass keeps starting new batches; what is left waits for the next period.
PASS_SECONDS = 120.0

#: Provider event bodies cleared per transaction at most, whatever ``PRUNE_BATCH`` says: each
#: body is read into memory to take its digest (a body may be up to the request size limit).
BODY_BATCH_MAX = 100


def _batch_checked(batch: object) -> int:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"a pruning batch must be an integer of at least 1, not {batch!r}")
    return batch


def body_digest(payload: object) -> str:
    """The hex SHA-256 of ``payload``'s RFC 8785 canonical JSON (``operations.idempotency
    .canonical_json``): what ``ProviderEvent.body_sha256`` keeps. Anyone holding the event's
    body (the provider's copy, an archive) checks it with ``sha256(JCS(json.loads(body)))``.
    Empty when the payload cannot be canonicalised (an integer beyond 2**53 - 1): the body is
    removed all the same and the page says it has no digest."""
    try:
        return sha256_hex(canonical_json(payload))
    except CanonicalizationError:
        return ""


def provider_event_bodies_prune(*, batch: int) -> int:
    """Empty the body (``payload`` becomes ``{}``) of up to ``min(batch, BODY_BATCH_MAX)``
    provider events processed more than ``EFFECT_LEDGER["RAW_BODY_RETENTION_DAYS"]`` (default
    30) days ago, oldest first (index ``provider_event_body_kept``); returns how many.

    Kept: the row, its parsed fields (event id and type, key, references, amount, result,
    detail) and a digest of the body (``body_sha256``, ``body_digest``); ``body_removed_at``
    records when. Never touched: an event not processed yet (processing re-reads the body,
    ``reconciliation.events._facts``, and a deferred event is decided again), and an event with
    an open or compensating finding (an operator is still deciding about it). Rows another
    transaction holds are skipped.

    Raises:
        ValueError: ``batch`` is not an integer of at least 1 (nothing changed).
    """
    _batch_checked(batch)
    days = float(settings.EFFECT_LEDGER["RAW_BODY_RETENTION_DAYS"])
    undecided = ProviderFinding.objects.filter(
        event=OuterRef("pk"), state__in=[ProviderFinding.State.OPEN, ProviderFinding.State.COMPENSATING]
    )
    with transaction.atomic():
        events = list(
            ProviderEvent.objects.select_for_update(skip_locked=True)
            .filter(
                processed_at__isnull=False,
                body_removed_at__isnull=True,
                processed_at__lt=Now() - timedelta(days=days),
            )
            .exclude(Exists(undecided))
            .order_by("processed_at")
            .only("id", "payload")[: min(batch, BODY_BATCH_MAX)]
        )
        for event in events:
            ProviderEvent.objects.filter(id=event.id).update(
                payload={}, body_sha256=body_digest(event.payload), body_removed_at=Now()
            )
    return len(events)


#: The kinds a pass prunes, in order: (name in the pass's result, one batch of it).
KINDS: tuple[tuple[str, Callable[..., int]], ...] = (
    ("outbox", outbox_prune),
    ("webhook_deliveries", webhook_deliveries_prune),
    ("provider_event_bodies", provider_event_bodies_prune),
)


def prune_pass(*, batch: int | None = None, budget_seconds: float = PASS_SECONDS) -> dict[str, int]:
    """Prune every kind (``KINDS``): batches of each until one comes back short or the pass has
    run ``budget_seconds`` (every kind gets one batch at least, so a slow kind never starves
    the next); returns how many rows of each kind were pruned (bodies: cleared).
    Each batch is its own transaction, so a pass stopped anywhere (a kill, a deploy) has lost
    nothing and the next one goes on where it stopped.

    Args:
        batch: rows per batch (default ``EFFECT_LEDGER["PRUNE_BATCH"]``, 1000).
        budget_seconds: seconds after which no new batch starts (default ``PASS_SECONDS``).

    Raises:
        ValueError: ``batch`` is not an integer of at least 1 (nothing pruned).
    """
    size = _batch_checked(int(settings.EFFECT_LEDGER["PRUNE_BATCH"]) if batch is None else batch)
    deadline = time.monotonic() + budget_seconds
    counts = dict.fromkeys((name for name, _ in KINDS), 0)
    for name, prune in KINDS:
        full = min(size, BODY_BATCH_MAX) if prune is provider_event_bodies_prune else size
        while True:
            done = prune(batch=size)
            counts[name] += done
            if done < full or time.monotonic() >= deadline:
                break
    return counts
