"""Delivering the signed webhooks to agents that ``operations.services.webhooks`` wrote: the
frozen body, claims, POSTs, results and re-sends (docs/reference/webhooks.md).

* ``webhooks_deliver_due`` (the task's) claims due rows with ``FOR UPDATE SKIP LOCKED`` in a
  bounded batch, pushing ``next_attempt_at`` forward as a lease, and commits; POSTs each row
  outside any transaction (``operations.notifications.webhook_sender``); records each result with a
  compare-and-swap on the claimed attempt number (a worker whose lease lapsed records nothing).
* A 2xx is delivered; anything else is retried after ``backoff_seconds`` and ``failed`` after
  ``WEBHOOK_MAX_ATTEMPTS``. ``webhook_resend`` makes a delivered or failed row pending again
  with the same message id and body.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import F, JSONField, Q, Value
from django.db.models.expressions import CombinedExpression
from django.db.models.functions import Now

from operations import metrics
from operations.engine.backoff import backoff_seconds
from operations.exceptions import WebhookResendRefused
from operations.idempotency import canonical_json
from operations.models import AuditEvent, Intent, Outcome, WebhookDelivery
from operations.notifications.webhook_sender import AttemptResult, post_webhook
from operations.services.leases import lease_release, lease_try_acquire
from operations.services.webhooks import webhook_kick_after_commit

#: Seconds a claim holds a row: longer than a POST may take (connect + read timeouts) and the
#: recording after it; a worker that died mid-attempt leaves the row due again after it.
LEASE_MARGIN_SECONDS = 30.0


# --- the body --------------------------------------------------------------------------------


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def webhook_body(delivery: WebhookDelivery) -> str:
    """The canonical JSON (RFC 8785) body of ``delivery``, Standard Webhooks' recommended shape
    ``{"type", "timestamp", "data"}``. ``data``: ``intent_id``, ``status`` (the one announced),
    ``action``, ``action_version``, ``reference``, the ``outcome`` (``provider_reference``) when
    an effect is recorded, the ``error`` of a FAILED intent, and the ``resolution`` (who and why)
    when a person decided. Never the arguments: the agent sent them and reads them with
    ``GET /api/v1/intents/{id}``; a receiver's logs need not hold a customer's data again."""
    intent = delivery.intent
    data: dict[str, Any] = {
        "intent_id": str(intent.id),
        "status": delivery.status,
        "action": intent.action,
        "action_version": intent.action_version,
        "reference": intent.reference,
        "url": f"/api/v1/intents/{intent.id}",
    }
    outcome = Outcome.objects.filter(intent_id=intent.id).order_by("-created_at", "-id").first()
    if outcome is not None and delivery.status in {"SUCCEEDED", "COMPENSATED", "UNKNOWN", "COMPENSATING"}:
        data["outcome"] = {"provider_reference": outcome.provider_reference, "source": outcome.source}
    if delivery.status == Intent.Status.FAILED and intent.last_error:
        data["error"] = intent.last_error
    event = AuditEvent.objects.filter(intent_id=intent.id, seq=delivery.audit_seq).first()
    if event is not None and event.actor.startswith("user:"):
        data["resolution"] = {"by": event.actor, "event": event.event, "reason": event.reason}
    body = {"type": delivery.event_type, "timestamp": _iso(delivery.event_at), "data": data}
    return canonical_json(body).decode()


# --- delivery --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claimed:
    """A row claimed for one attempt: what to send, where, and the attempt number it holds."""

    id: int
    attempt: int
    message_id: str
    body: str
    url: str
    secret: str


def _lease_seconds() -> float:
    conf = settings.EFFECT_LEDGER
    return (
        float(conf["WEBHOOK_CONNECT_TIMEOUT_SECONDS"] + conf["WEBHOOK_TIMEOUT_SECONDS"])
        + LEASE_MARGIN_SECONDS
    )


def webhooks_claim_due(*, batch: int | None = None, ids: list[int] | None = None) -> list[Claimed]:
    """Claim up to ``batch`` due pending rows (default ``WEBHOOK_BATCH``), earliest first,
    ``FOR UPDATE SKIP LOCKED``: each gets its attempt number and is due again only after the
    lease (``_lease_seconds``). A body is frozen now if the row has none. Commits."""
    batch = batch or settings.EFFECT_LEDGER["WEBHOOK_BATCH"]
    with transaction.atomic():
        due = WebhookDelivery.objects.filter(state=WebhookDelivery.State.PENDING, next_attempt_at__lte=Now())
        if ids is not None:
            due = due.filter(id__in=ids)
        # The race this stops: two delivery tasks sending the same row at once.
        rows = list(
            due.select_related("intent", "agent")
            .select_for_update(skip_locked=True, of=("self",))
            .order_by("next_attempt_at")[:batch]
        )
        if not rows:
            return []
        WebhookDelivery.objects.filter(id__in=[r.id for r in rows]).update(
            attempts=F("attempts") + 1, next_attempt_at=Now() + timedelta(seconds=_lease_seconds())
        )
        claimed = []
        for row in rows:
            if not row.body:
                row.body = webhook_body(row)
                WebhookDelivery.objects.filter(id=row.id, body="").update(body=row.body)
            claimed.append(
                Claimed(
                    row.id,
                    row.attempts + 1,
                    row.message_id,
                    row.body,
                    row.agent.callback_url,
                    row.agent.callback_secret,
                )
            )
    return claimed


def _append(entry: dict[str, Any]) -> CombinedExpression:
    return CombinedExpression(F("history"), "||", Value([entry], JSONField()), output_field=JSONField())


def webhook_record(*, claimed: Claimed, result: AttemptResult) -> str:
    """Record one attempt's ``result``: ``delivered`` on a 2xx; else ``failed`` when it was the
    ``WEBHOOK_MAX_ATTEMPTS``-th, or pending again after ``backoff_seconds(attempt_no=n,
    base=WEBHOOK_BACKOFF_BASE_SECONDS, cap=WEBHOOK_BACKOFF_CAP_SECONDS)``. Returns the result
    counted (``delivered``, ``retry``, ``failed``), or ``stale`` when the row moved meanwhile
    (its lease lapsed and another claim holds it, or an operator re-sent it): nothing written."""
    conf = settings.EFFECT_LEDGER
    entry = {
        "at": _iso(datetime.now(UTC)),
        "attempt": claimed.attempt,
        "status_code": result.status_code,
        "error": result.error,
        "duration_ms": result.duration_ms,
    }
    updates: dict[str, Any] = {
        "last_status_code": result.status_code,
        "last_error": result.error,
        "history": _append(entry),
    }
    if result.delivered:
        outcome = "delivered"
        updates |= {"state": WebhookDelivery.State.DELIVERED, "delivered_at": Now(), "next_attempt_at": None}
    elif claimed.attempt >= conf["WEBHOOK_MAX_ATTEMPTS"]:
        outcome = "failed"
        updates |= {"state": WebhookDelivery.State.FAILED, "next_attempt_at": None}
    else:
        outcome = "retry"
        wait = backoff_seconds(
            attempt_no=claimed.attempt,
            base=conf["WEBHOOK_BACKOFF_BASE_SECONDS"],
            cap=conf["WEBHOOK_BACKOFF_CAP_SECONDS"],
        )
        updates["next_attempt_at"] = Now() + timedelta(seconds=wait)
    # The race this stops: a worker whose lease lapsed recording over a newer claim's attempt.
    moved = WebhookDelivery.objects.filter(
        id=claimed.id, state=WebhookDelivery.State.PENDING, attempts=claimed.attempt
    ).update(**updates)
    if not moved:
        return "stale"
    metrics.WEBHOOK_ATTEMPTS.labels(result=outcome).inc()
    return outcome


def webhook_attempt(claimed: Claimed) -> str:
    """POST one claimed row (outside any transaction) and record the result (``webhook_record``)."""
    if not claimed.url or not claimed.secret:
        result = AttemptResult(None, "not sent: the agent has no callback URL any more", 0)
    else:
        result = post_webhook(
            url=claimed.url, secret=claimed.secret, message_id=claimed.message_id, body=claimed.body
        )
    return webhook_record(claimed=claimed, result=result)


#: The lease (``operations.services.leases``) held by the one delivery pass that runs.
DELIVERY_PASS_LEASE = "webhook-delivery-pass"


def _attempt_on_own_connection(claimed: Claimed) -> str:
    try:
        return webhook_attempt(claimed)
    finally:
        connection.close()  # this thread's own connection (Django's are per thread)


def webhooks_deliver_due(*, batch: int | None = None, budget_seconds: float | None = None) -> dict[str, int]:
    """One pass of the delivery task: rounds of claiming up to ``batch`` due rows
    (``webhooks_claim_due``; default ``WEBHOOK_BATCH``) and POSTing them concurrently, one thread
    each, until nothing is due or ``budget_seconds`` (``WEBHOOK_PASS_SECONDS``) have passed.
    Returns counts by result; ``{}`` at once when another pass runs.

    One pass at a time in the whole system: the pass holds the lease ``DELIVERY_PASS_LEASE`` (a
    row, not a session advisory lock, which a pooler in transaction mode would leave on a pooled
    server connection), released at the end; a worker that dies mid-pass leaves it to expire
    after the pass's budget plus one claim's lease. The running pass takes every due row. So agents' receivers, however
    slow, occupy one worker process at most and intents keep executing on the others (a
    reviewer's receiver holding each POST 60 s had delayed another tenant's intents by 19 s,
    when every commit's kick started a pass of its own). A round's POSTs run together, so each
    ends within its claim's lease (``_lease_seconds``) and no row is claimed twice.

    Call outside any transaction (the task does): each claim commits before its POSTs, and each
    result is recorded in its own transaction. Inside one (a test's), the POSTs run one by one on
    this thread, since other connections could not see the rows.
    """
    batch = batch or settings.EFFECT_LEDGER["WEBHOOK_BATCH"]
    budget = settings.EFFECT_LEDGER["WEBHOOK_PASS_SECONDS"] if budget_seconds is None else budget_seconds
    held = lease_try_acquire(name=DELIVERY_PASS_LEASE, ttl_seconds=budget + _lease_seconds())
    if held is None:
        return {}
    counts: dict[str, int] = {}
    deadline = time.monotonic() + budget
    try:
        with ThreadPoolExecutor(max_workers=batch, thread_name_prefix="webhook") as pool:
            attempt = webhook_attempt if connection.in_atomic_block else _attempt_on_own_connection
            while time.monotonic() < deadline:
                claimed = webhooks_claim_due(batch=batch)
                if not claimed:
                    break
                outcomes = map(attempt, claimed) if attempt is webhook_attempt else pool.map(attempt, claimed)
                for outcome in outcomes:
                    counts[outcome] = counts.get(outcome, 0) + 1
    finally:
        with contextlib.suppress(DatabaseError):
            lease_release(held)  # if this fails, the lease expires on its own
    return counts


def webhook_resend(*, delivery_id: int, actor: str, scope: Q | None = None) -> WebhookDelivery:
    """Make a delivered or failed delivery pending again, due now, with the same message id and
    body and a fresh attempt budget (``attempts`` back to 0; ``history`` keeps every attempt and
    notes the re-send and who asked). ``scope`` limits which rows ``actor`` may reach.

    Raises:
        WebhookDelivery.DoesNotExist: no such delivery in ``scope``.
        WebhookResendRefused: it is pending already.
    """
    rows = WebhookDelivery.objects.filter(scope or Q())
    delivery = rows.get(id=delivery_id)
    # The race this stops: two operators re-sending at once, or a re-send while it is pending.
    moved = rows.filter(
        id=delivery_id, state__in=[WebhookDelivery.State.DELIVERED, WebhookDelivery.State.FAILED]
    ).update(
        state=WebhookDelivery.State.PENDING,
        attempts=0,
        next_attempt_at=Now(),
        delivered_at=None,
        history=_append({"at": _iso(datetime.now(UTC)), "resent_by": actor}),
    )
    if not moved:
        raise WebhookResendRefused(f"delivery {delivery.message_id} is pending already: it is sent when due")
    webhook_kick_after_commit()
    delivery.refresh_from_db()
    return delivery
