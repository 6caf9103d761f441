"""The inbox for provider events (issue 19).

Receiving (``receive_provider_event``, called by ``POST /providers/<source>/events``): the
source's adapter verifies the signature on the raw body before anything reads it, then reads
the body; a refusal stores nothing. A new event is stored once per (source, event id)
(``INSERT ... ON CONFLICT DO NOTHING`` on the unique constraint) with an outbox message in the
same transaction; a redelivery finds the row and changes nothing. The answer does not wait for
processing (``reconciliation.events.process_provider_event``, the outbox's task).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from django.db import connection, transaction

from operations import metrics
from operations.adapters.base import Adapter
from operations.adapters.events import EventInvalid, EventSignatureInvalid, check_storable
from operations.adapters.registry import evidence_sources
from operations.adapters.secrets import PUBLISHED_SECRETS
from operations.idempotency import canonical_json
from operations.statements import run_together
from operations.workers.outbox import Handoff, enqueue_statement, handoff_after_commit
from reconciliation.models import ProviderEvent

#: The Celery task that processes a stored event (``reconciliation.tasks``).
PROCESS_TASK = "reconciliation.process_provider_event"


class UnknownEventSource(LookupError):
    """No served adapter declares this event source (answered 404)."""


@dataclass(frozen=True)
class Received:
    """The answer to one delivery: the stored event's id and whether this delivery stored it."""

    event_pk: int
    created: bool


def event_source(source: str) -> Adapter:
    """The adapter that declares ``source``.

    Raises:
        UnknownEventSource: no served adapter declares it.
    """
    adapter = evidence_sources().get(source)
    if adapter is None or not adapter.receives_events():
        raise UnknownEventSource(f"no event source {source!r}")
    return adapter


_INSERT = f"""
    INSERT INTO {ProviderEvent._meta.db_table}
        (source, event_id, event_type, occurred_at, received_at, payload, idempotency_key,
         reference, provider_reference, amount, currency, intent_id, result, processed_at, detail)
    VALUES (%s, %s, %s, %s, statement_timestamp(), %s, %s, %s, %s, %s, %s, NULL, %s, NULL, '{{}}')
    ON CONFLICT (source, event_id) DO NOTHING
    RETURNING id
"""


def receive_provider_event(*, source: str, body: bytes, headers: Mapping[str, str]) -> Received:
    """Verify, read and store one delivery of a provider event; nothing is stored on a refusal.

    Args:
        source: the event source slug from the URL (``sandbox-payments``).
        body: the raw request body, exactly as received (the signature covers these bytes).
        headers: the request headers (``webhook-id``, ``webhook-timestamp``,
            ``webhook-signature`` for Standard Webhooks).

    Returns:
        ``Received``: the stored event's id, and ``created`` False for a redelivery (same
        source and event id: nothing changed).

    Raises:
        UnknownEventSource: no adapter declares ``source`` (404).
        EventSignatureInvalid: missing, wrong or stale signature (401), checked first; or a
            real provider's source whose secret is a published one (``PUBLISHED_SECRETS``:
            anyone could sign with it).
        EventInvalid: a signed body that is not such an event (400): malformed, a type or
            object the source does not send, a negative amount, ``created`` outside
            2000-01-01..2100-01-01 UTC, a NUL or text not encodable as UTF-8 in any string.
    """
    try:
        adapter = event_source(source)
        if not adapter.test_endpoint and adapter.event_secret() in PUBLISHED_SECRETS:
            raise EventSignatureInvalid("this source's secret is published; set its own (issue 33 item 6)")
        webhook_id = adapter.verify_event(body, headers)
        facts = adapter.parse_event(body, webhook_id=webhook_id)
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise EventInvalid("the body is not JSON") from exc
        check_storable(payload)  # whatever the adapter's reader: jsonb takes no NUL, no surrogate
    except UnknownEventSource:
        metrics.PROVIDER_EVENTS_REFUSED.labels(reason="unknown_source").inc()
        raise
    except EventSignatureInvalid:
        metrics.PROVIDER_EVENTS_REFUSED.labels(reason="signature").inc()
        raise
    except EventInvalid:
        metrics.PROVIDER_EVENTS_REFUSED.labels(reason="invalid").inc()
        raise
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                _INSERT,
                [
                    source,
                    facts.event_id,
                    facts.event_type,
                    facts.occurred_at,
                    json.dumps(payload),
                    facts.idempotency_key,
                    facts.reference,
                    facts.provider_reference,
                    facts.amount,
                    facts.currency,
                    ProviderEvent.Result.PENDING,
                ],
            )
            row = cursor.fetchone()
        if row is None:  # a redelivery: the first delivery's row and message stand
            event_pk = ProviderEvent.objects.filter(source=source, event_id=facts.event_id).values_list(
                "id", flat=True
            )[0]
            metrics.PROVIDER_EVENTS_RECEIVED.labels(source=source, delivery="redelivery").inc()
            return Received(event_pk=event_pk, created=False)
        event_pk = int(row[0])
        message_id = uuid.uuid4()
        handoff = Handoff(
            id=message_id,
            task=PROCESS_TASK,
            body=canonical_json(
                {"message_id": str(message_id), "provider_event_id": event_pk, "task": PROCESS_TASK}
            ).decode(),
        )
        (countdown,) = run_together(enqueue_statement(handoff, intent_id=None))
        handoff_after_commit(handoff, countdown)
    metrics.PROVIDER_EVENTS_RECEIVED.labels(source=source, delivery="new").inc()
    return Received(event_pk=event_pk, created=True)
