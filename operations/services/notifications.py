"""Notifications to approvers and operators: written with the event, sent by the beat, digested
and rate-limited per recipient (docs/reference/console.md, "Notifications to approvers and operators").

Three steps, each its own transaction, so nothing is lost and no network call holds a lock:

1. **Enqueue**, in the event's own transaction: a ``Notification`` row (an outbox row) when an
   intent enters AWAITING_APPROVAL (``notification_statements``, called by
   ``transitions.transition`` and by submission), when it is escalated (``intent_escalate``),
   and, found by a periodic scan, when its approval request is about to expire
   (``notifications_enqueue_expiring``, once per approval round).
2. **Fan out** (``notifications_fan_out``): claim unprocessed rows (``FOR UPDATE SKIP
   LOCKED``), drop those whose intent moved on, resolve the recipients *now*
   (``operations.selectors.notifications``) and write one ``NotificationDelivery`` per
   recipient (each email address; the Slack webhook when configured).
3. **Deliver** (``notifications_deliver``): claim each recipient whose rate limit allows a
   message and that has pending deliveries (``SKIP LOCKED`` plus a lease, since the send runs
   after commit), drop the obsolete ones, send one message carrying all the others (a digest
   when several), then mark them sent and hold the recipient for ``NOTIFY_INTERVAL_SECONDS``;
   on failure the deliveries stay pending and the recipient waits ``backoff_seconds``.

Delivery is at least once: a sender that dies between the send and the mark leaves the lease
to lapse, and the same notices go out again in the next message.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q
from django.db.models.functions import Now

from operations import metrics
from operations.engine.backoff import backoff_seconds
from operations.models import Intent, Notification, NotificationDelivery, NotificationRecipient
from operations.notifications.channels import send_email, send_slack
from operations.notifications.messages import notice_for, render_message
from operations.selectors.notifications import notification_obsolete, notification_recipients
from operations.statements import Statement, insert_statement

logger = logging.getLogger(__name__)

#: A message lists at most this many notices; the others wait for the recipient's next message.
DIGEST_MAX_ITEMS = 100

Channel = NotificationRecipient.Channel

# The unique index ``notification_once_per_round`` (one approval notice of a kind per round).
_ON_CONFLICT = (
    "ON CONFLICT (intent_id, kind, approval_round) "
    "WHERE kind IN ('approval_requested', 'approval_expiring') DO NOTHING"
)

_APPROVAL_REQUESTED_SQL = f"""
INSERT INTO operations_notification (kind, intent_id, approval_round, created_at, outcome)
SELECT %s, id, approval_round, statement_timestamp(), '' FROM operations_intent WHERE id = %s
{_ON_CONFLICT}
"""

_EXPIRING_SQL = f"""
INSERT INTO operations_notification (kind, intent_id, approval_round, created_at, outcome)
SELECT %s, i.id, i.approval_round, statement_timestamp(), '' FROM operations_intent i
WHERE i.status = 'AWAITING_APPROVAL'
  AND i.approval_expires_at > statement_timestamp()
  AND i.approval_expires_at <= statement_timestamp() + make_interval(secs => %s)
  -- A request that was itself sent inside the warning window already says when it expires.
  AND NOT EXISTS (
      SELECT 1 FROM operations_notification n
      WHERE n.intent_id = i.id AND n.kind = %s AND n.approval_round = i.approval_round
        AND n.created_at > i.approval_expires_at - make_interval(secs => %s)
  )
{_ON_CONFLICT}
"""


def notification_statements(*, intent_id: uuid.UUID, to_status: str) -> list[Statement]:
    """The writes that queue a notice for a transition of ``intent_id`` to ``to_status``, to run
    in the transition's own statement (``transitions.transition``): entering AWAITING_APPROVAL
    queues an ``approval_requested`` notice for the intent's (new) approval round; other
    statuses queue nothing. It reads the intent row as the transition's UPDATE left it."""
    if to_status != Intent.Status.AWAITING_APPROVAL:
        return []
    return [Statement(_APPROVAL_REQUESTED_SQL, (Notification.Kind.APPROVAL_REQUESTED, intent_id))]


def submission_notification_statement(intent: Intent) -> Statement:
    """The INSERT of the ``approval_requested`` notice of a gated intent being submitted (round
    0), to run in the statement that inserts the intent (``submission._insert``)."""
    return insert_statement(
        Notification(kind=Notification.Kind.APPROVAL_REQUESTED, intent_id=intent.id, approval_round=0)
    )


def notification_escalated(*, intent_id: uuid.UUID) -> None:
    """Queue an ``escalated`` notice for the operators, in the caller's transaction
    (``resolution.intent_escalate``)."""
    Notification.objects.create(kind=Notification.Kind.ESCALATED, intent_id=intent_id)


def notifications_enqueue_expiring() -> int:
    """Queue an ``approval_expiring`` notice for each intent whose approval request expires
    within ``NOTIFY_EXPIRY_WARNING_SECONDS`` (by the database clock), once per approval round
    (the unique index makes a repeat a no-op). Not when this round's request notice was itself
    written inside that window: it already says when the request expires. Returns how many."""
    warning = float(settings.EFFECT_LEDGER["NOTIFY_EXPIRY_WARNING_SECONDS"])
    with connection.cursor() as cursor:
        cursor.execute(
            _EXPIRING_SQL,
            (Notification.Kind.APPROVAL_EXPIRING, warning, Notification.Kind.APPROVAL_REQUESTED, warning),
        )
        return int(cursor.rowcount)


def _recipient_rows(keys: Sequence[tuple[str, str]]) -> list[NotificationRecipient]:
    """The recipient rows for ``keys`` ((channel, address) pairs), created when missing."""
    NotificationRecipient.objects.bulk_create(
        [NotificationRecipient(channel=channel, address=address) for channel, address in keys],
        ignore_conflicts=True,
    )
    wanted = set(keys)
    rows = NotificationRecipient.objects.filter(address__in=[address for _, address in keys])
    return [row for row in rows if (row.channel, row.address) in wanted]


def notifications_fan_out(*, batch: int) -> int:
    """Turn up to ``batch`` queued notices into one delivery per recipient; returns how many
    notices were processed.

    Recipients are resolved here, at send time, rather than when the event was written: the
    event's transaction (a submission, a transition) stays one INSERT with no reads of users
    and grants, and the notice goes to whoever holds the role now (a grant revoked meanwhile is
    honoured; a user added meanwhile is told). A notice whose intent already moved on is marked
    ``obsolete``; one that nobody can receive (no address, no webhook) ``no_recipient``.
    """
    slack = bool(settings.EFFECT_LEDGER["SLACK_WEBHOOK_URL"])
    with transaction.atomic():
        queued = list(
            Notification.objects.filter(fanned_out_at__isnull=True)
            .select_related("intent")
            .order_by("id")
            .select_for_update(skip_locked=True, of=("self",))[:batch]
        )
        for notification in queued:
            outcome = "delivering"
            if notification_obsolete(notification, notification.intent):
                outcome = "obsolete"
            else:
                keys = [(Channel.EMAIL.value, address) for address in notification_recipients(notification)]
                if slack:
                    keys.append((Channel.SLACK.value, Channel.SLACK.value))
                if not keys:
                    outcome = "no_recipient"
                else:
                    NotificationDelivery.objects.bulk_create(
                        [
                            NotificationDelivery(notification=notification, recipient=recipient)
                            for recipient in _recipient_rows(keys)
                        ],
                        ignore_conflicts=True,
                    )
            Notification.objects.filter(id=notification.id).update(fanned_out_at=Now(), outcome=outcome)
    return len(queued)


@dataclass
class _Claimed:
    """A recipient leased for one message, and the deliveries the message carries."""

    recipient: NotificationRecipient
    deliveries: list[NotificationDelivery] = field(default_factory=list)


def _lease_seconds() -> float:
    # Longer than any send can take (Slack's timeout per phase, SMTP's EMAIL_TIMEOUT), so a
    # live sender keeps its claim; a dead one's lapses and the notices go out again.
    return 60.0 + 4 * max(
        float(settings.EFFECT_LEDGER["NOTIFY_SEND_TIMEOUT_SECONDS"]), settings.EMAIL_TIMEOUT or 0
    )


def _claim(batch: int) -> list[_Claimed]:
    """Lease up to ``batch`` recipients that may receive a message now (``due_at`` passed, no
    live lease) and have pending deliveries; drop the obsolete deliveries. One transaction."""
    pending = NotificationDelivery.objects.filter(
        recipient=OuterRef("pk"), status=NotificationDelivery.Status.PENDING
    )
    claimed: list[_Claimed] = []
    with transaction.atomic():
        recipients = list(
            NotificationRecipient.objects.filter(Exists(pending), due_at__lte=Now())
            .filter(Q(lease_until__isnull=True) | Q(lease_until__lte=Now()))
            .order_by("due_at", "id")
            # The race this stops: two senders messaging the same recipient at once.
            .select_for_update(skip_locked=True)[:batch]
        )
        slack_off = not settings.EFFECT_LEDGER["SLACK_WEBHOOK_URL"]
        for recipient in recipients:
            dropped: list[int] = []
            item = _Claimed(recipient)
            for delivery in (
                NotificationDelivery.objects.filter(
                    recipient=recipient, status=NotificationDelivery.Status.PENDING
                )
                .select_related("notification__intent")
                .order_by("id")[:DIGEST_MAX_ITEMS]
            ):
                notification = delivery.notification
                # The intent was approved, rejected, expired or resolved since: not worth a word.
                # A webhook switched off since the fan-out: nowhere to send it.
                if notification_obsolete(notification, notification.intent) or (
                    recipient.channel == Channel.SLACK and slack_off
                ):
                    dropped.append(delivery.id)
                else:
                    item.deliveries.append(delivery)
            if dropped:
                NotificationDelivery.objects.filter(id__in=dropped).update(
                    status=NotificationDelivery.Status.DROPPED
                )
                metrics.NOTIFICATIONS.labels(channel=recipient.channel, result="dropped").inc(len(dropped))
            if item.deliveries:
                NotificationRecipient.objects.filter(id=recipient.id).update(
                    lease_until=Now() + timedelta(seconds=_lease_seconds())
                )
                claimed.append(item)
    return claimed


def _send(item: _Claimed) -> None:
    """Send ``item``'s one message (raises what the channel raises)."""
    notices = [notice_for(d.notification, d.notification.intent) for d in item.deliveries]
    subject, body = render_message(notices)
    recipient = item.recipient
    if recipient.channel == Channel.SLACK:
        send_slack(url=settings.EFFECT_LEDGER["SLACK_WEBHOOK_URL"], text=f"{subject}\n\n{body}")
    else:
        send_email(address=recipient.address, subject=subject, body=body)


def _record(item: _Claimed, error: Exception | None) -> None:
    """After the send: mark the deliveries sent and hold the recipient for the interval, or
    keep them pending and hold the recipient for a backoff (``operations.engine.backoff``)."""
    recipient = item.recipient
    ids = [delivery.id for delivery in item.deliveries]
    with transaction.atomic():
        if error is None:
            NotificationDelivery.objects.filter(
                id__in=ids, status=NotificationDelivery.Status.PENDING
            ).update(status=NotificationDelivery.Status.SENT, sent_at=Now())
            interval = float(settings.EFFECT_LEDGER["NOTIFY_INTERVAL_SECONDS"])
            NotificationRecipient.objects.filter(id=recipient.id).update(
                last_sent_at=Now(),
                due_at=Now() + timedelta(seconds=interval),
                failures=0,
                lease_until=None,
                last_error="",
            )
        else:
            failures = recipient.failures + 1
            wait = backoff_seconds(
                attempt_no=failures,
                base=float(settings.EFFECT_LEDGER["NOTIFY_RETRY_BASE_SECONDS"]),
                cap=float(settings.EFFECT_LEDGER["NOTIFY_RETRY_CAP_SECONDS"]),
            )
            for delivery in item.deliveries:
                NotificationDelivery.objects.filter(id=delivery.id).update(attempts=delivery.attempts + 1)
            NotificationRecipient.objects.filter(id=recipient.id).update(
                due_at=Now() + timedelta(seconds=wait),
                failures=failures,
                lease_until=None,
                last_error=f"{type(error).__name__}: {error}"[:1000],
            )
    metrics.NOTIFICATIONS.labels(
        channel=recipient.channel, result="sent" if error is None else "failed"
    ).inc()


def notifications_deliver(*, batch: int) -> int:
    """Send each recipient that may receive a message now one message with its pending notices
    (a digest when several), outside any transaction; returns how many messages were sent.

    Rate limit: at most one message per recipient per ``NOTIFY_INTERVAL_SECONDS``; what arrives
    meanwhile waits for the next message. A failed send (an SMTP error, a webhook answering
    non-2xx or not at all) leaves the notices pending and the recipient waiting
    ``backoff_seconds(failures)`` (``NOTIFY_RETRY_BASE_SECONDS`` doubling up to
    ``NOTIFY_RETRY_CAP_SECONDS``): never dropped for failing.
    """
    sent = 0
    for item in _claim(batch):
        try:
            _send(item)
        except Exception as exc:  # any channel error: keep the notices, try again later
            logger.warning(
                "notification not sent; retried later",
                extra={
                    "channel": item.recipient.channel,
                    "notices": len(item.deliveries),
                    "error": str(exc)[:200],
                },
            )
            _record(item, exc)
        else:
            _record(item, None)
            sent += 1
    return sent


def notifications_prune(*, batch: int) -> int:
    """Delete up to ``batch`` notices older than ``NOTIFY_RETENTION_DAYS`` with nothing pending
    (their deliveries go with them); returns how many. A notice never leaves while a delivery
    of it still waits for its recipient."""
    days = float(settings.EFFECT_LEDGER["NOTIFY_RETENTION_DAYS"])
    pending = NotificationDelivery.objects.filter(
        notification=OuterRef("pk"), status=NotificationDelivery.Status.PENDING
    )
    old = (
        Notification.objects.filter(fanned_out_at__lt=Now() - timedelta(days=days))
        .exclude(Exists(pending))
        .order_by("id")
        .values("id")[:batch]
    )
    _, by_model = Notification.objects.filter(id__in=list(old.values_list("id", flat=True))).delete()
    return by_model.get(Notification._meta.label, 0)


def notifications_send() -> int:
    """One pass of the sender (the beat's, every ``NOTIFY_PERIOD_SECONDS``): queue the expiry
    warnings, fan out queued notices, deliver, prune old ones. Returns how many messages were
    sent."""
    batch = int(settings.EFFECT_LEDGER["NOTIFY_BATCH"])
    notifications_enqueue_expiring()
    notifications_fan_out(batch=batch)
    sent = notifications_deliver(batch=batch)
    notifications_prune(batch=batch)
    return sent
