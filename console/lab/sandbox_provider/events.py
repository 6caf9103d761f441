"""Signed events to the ledger: what a real provider's webhooks do, with fault modes.

Every effect records its events in the transaction that applies it (``record``), so an effect
whose HTTP handler dies right afterwards is still told; a background thread (``EventSender``)
POSTs them, at least once. Contract: issue 19 ("Events: sandbox -> ledger").

* Where: ``<events URL>/<source>/events`` with the source of the product (``SOURCES``); no
  events URL (``--events-url``, ``SANDBOX_EVENTS_URL`` or ``POST /_sandbox/events {"url"}``)
  means no events are recorded at all.
* Signature: Standard Webhooks (https://www.standardwebhooks.com), headers ``webhook-id`` (the
  event id), ``webhook-timestamp`` (Unix seconds of this attempt) and ``webhook-signature``
  (``v1,<base64 HMAC-SHA256>``), signed afresh on every attempt with the events secret.
* Body: ``{"id": "evt_…", "type", "created": RFC 3339 UTC, "data": {"object", "id",
  "idempotency_key", "message_id", "reference", "amount", "currency", "status"}}`` (fields that
  do not apply to the object are ``null``; money in integer minor units).
* Delivery: a 2xx answer delivers; any other answer or no answer is retried after
  ``BACKOFF_BASE_SECONDS * 2**attempts`` (at most ``BACKOFF_CAP_SECONDS``) until the event is
  ``GIVE_UP_AFTER_SECONDS`` old (24 hours, then ``failed``).
* Fault modes (``POST /_sandbox/events``, ``EventFaults``): ``lag_seconds`` holds each event
  back; ``duplicates`` delivers each one that many extra times (same id and body);
  ``reorder`` sends an effect's events newest first; ``loss`` (0..1) is the chance an event is
  never sent (state ``lost``; ``POST /_sandbox/events/redeliver`` still sends it).
"""

from __future__ import annotations

import base64
import json
import logging
import random
import threading
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from psycopg import Connection
from psycopg.rows import DictRow
from standardwebhooks.webhooks import Webhook

from console.lab.sandbox_provider import event_store
from console.lab.sandbox_provider.replies import BadRequest
from console.lab.sandbox_provider.store import Pool, new_id

logger = logging.getLogger("console.lab.sandbox_provider.events")

#: The event source (the ledger's adapter slug, the URL segment) of each product.
SOURCES = {"payments": "sandbox-payments", "email": "sandbox-email", "reservations": "sandbox-reservations"}
#: Every event type the sandbox sends.
EVENT_TYPES = (
    "charge.created",
    "charge.succeeded",
    "charge.refunded",
    "refund.succeeded",
    "email.sent",
    "email.delivered",
    "reservation.created",
    "reservation.cancelled",
)

#: The public default secret of the sandbox (settings ``SANDBOX_EVENTS_SECRET``'s default):
#: ``whsec_`` + base64 of ``b"effect-ledger-sandbox-events-secret"``.
DEFAULT_SECRET = "whsec_ZWZmZWN0LWxlZGdlci1zYW5kYm94LWV2ZW50cy1zZWNyZXQ="

BACKOFF_BASE_SECONDS = 0.5
BACKOFF_CAP_SECONDS = 60.0
GIVE_UP_AFTER_SECONDS = 24 * 3600.0
#: Seconds the sender waits for a receiver's answer.
SEND_TIMEOUT_SECONDS = 10.0
#: Seconds the sender sleeps when nothing is due.
POLL_SECONDS = 0.1
#: At most this many duplicates per event (a typo must not flood the receiver).
MAX_DUPLICATES = 10

#: ``(type, data)`` pairs an effect emits, in their natural order.
Emitted = list[tuple[str, dict[str, Any]]]


def event_data(
    obj: str,
    object_id: str,
    *,
    status: str,
    reference: str | None,
    idempotency_key: str | None = None,
    message_id: str | None = None,
    amount: int | None = None,
    currency: str | None = None,
) -> dict[str, Any]:
    """The ``data`` of an event: ``obj`` is ``charge``, ``refund``, ``email`` or
    ``reservation``; ``object_id`` the provider's id (``ch_…``); ``amount`` in minor units;
    ``reference`` ``""`` when the effect has none."""
    return {
        "object": obj,
        "id": object_id,
        "idempotency_key": idempotency_key,
        "message_id": message_id,
        "reference": reference or "",
        "amount": amount,
        "currency": currency,
        "status": status,
    }


@dataclass
class EventFaults:
    """The event fault modes (see the module docstring); all off by default."""

    lag_seconds: float = 0.0
    duplicates: int = 0
    reorder: bool = False
    loss: float = 0.0


def _number(body: dict[str, Any], name: str) -> float:
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{name} must be a number", param=name)
    return float(value)


def parse_event_settings(body: dict[str, Any]) -> dict[str, Any]:
    """Validate ``POST /_sandbox/events`` JSON: any of ``lag_seconds`` (seconds >= 0),
    ``duplicates`` (integer 0..``MAX_DUPLICATES``), ``reorder`` (boolean), ``loss`` (0..1) and
    ``url`` (an ``http(s)://`` events base URL, or ``null`` / ``""`` for no events).

    Returns:
        the changes, by name.

    Raises:
        BadRequest: an unknown field or a value out of range; nothing is changed then.
    """
    unknown = sorted(set(body) - {"lag_seconds", "duplicates", "reorder", "loss", "url"})
    if unknown:
        raise BadRequest(
            f"unknown field(s) {', '.join(unknown)}; known: lag_seconds, duplicates, reorder, loss, url",
            param=unknown[0],
        )
    changes: dict[str, Any] = {}
    if "lag_seconds" in body:
        if (lag := _number(body, "lag_seconds")) < 0:
            raise BadRequest("lag_seconds must be a non-negative number of seconds", param="lag_seconds")
        changes["lag_seconds"] = lag
    if "duplicates" in body:
        duplicates = body["duplicates"]
        if (
            isinstance(duplicates, bool)
            or not isinstance(duplicates, int)
            or not 0 <= duplicates <= MAX_DUPLICATES
        ):
            raise BadRequest(f"duplicates must be an integer from 0 to {MAX_DUPLICATES}", param="duplicates")
        changes["duplicates"] = duplicates
    if "reorder" in body:
        if not isinstance(body["reorder"], bool):
            raise BadRequest("reorder must be true or false", param="reorder")
        changes["reorder"] = body["reorder"]
    if "loss" in body:
        if not 0.0 <= (loss := _number(body, "loss")) <= 1.0:
            raise BadRequest("loss must be a probability from 0 to 1", param="loss")
        changes["loss"] = loss
    if "url" in body:
        url = body["url"] or ""
        if not isinstance(url, str) or url and not url.startswith(("http://", "https://")):
            raise BadRequest("url must be an http(s) URL, or null for no events", param="url")
        changes["url"] = url
    return changes


def check_secret(secret: str) -> str:
    """Return ``secret`` when it is a usable Standard Webhooks secret: ``whsec_`` and non-empty
    strict base64 (the package itself skips characters that are not base64).

    Raises:
        ValueError: otherwise.
    """
    encoded = secret.removeprefix("whsec_")
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except ValueError:
        key = b""
    if not secret.startswith("whsec_") or not key:
        raise ValueError("the events secret must be whsec_ followed by non-empty base64")
    Webhook(secret)
    return secret


def event_url(base: str, source: str) -> str:
    """``base`` joined with ``<source>/events``: ``http://h/providers/`` and ``sandbox-email``
    give ``http://h/providers/sandbox-email/events`` (a missing final slash is added)."""
    return f"{base.rstrip('/')}/{source}/events"


@dataclass
class EventSettings:
    """Where events go, how they are signed and the fault modes; changeable at runtime and safe
    to use from many threads. ``reset`` restores the startup ``url`` and clears the faults."""

    initial_url: str
    secret: str
    url: str = ""
    faults: EventFaults = field(default_factory=EventFaults)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.url = self.initial_url

    def snapshot(self) -> tuple[str, EventFaults]:
        """The current ``(url, faults)``."""
        with self._lock:
            return self.url, EventFaults(**asdict(self.faults))

    def as_json(self) -> dict[str, Any]:
        """The settings as JSON (the secret is not shown): ``{"url": str | None, **faults}``."""
        url, faults = self.snapshot()
        return {"url": url or None, **asdict(faults)}

    def update(self, changes: dict[str, Any]) -> None:
        """Apply ``parse_event_settings``'s changes."""
        with self._lock:
            if "url" in changes:
                self.url = changes.pop("url")
            self.faults = EventFaults(**{**asdict(self.faults), **changes})

    def reset(self) -> None:
        """Back to the startup URL, no faults."""
        with self._lock:
            self.url = self.initial_url
            self.faults = EventFaults()


def rfc3339_now() -> str:
    """The current UTC time as RFC 3339 with microseconds, e.g. ``2026-12-02T05:40:01.123456Z``."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def record(conn: Connection[DictRow], settings: EventSettings, product: str, emitted: Emitted) -> None:
    """Store the events of one effect on ``conn``, in the effect's own transaction.

    Nothing is stored when no events URL is set. The fault modes in force now apply: each event
    gets ``1 + duplicates`` copies, its first attempt after ``lag_seconds``, is ``lost`` with
    probability ``loss``, and with ``reorder`` the effect's events are sent newest first.

    Args:
        product: ``payments``, ``email`` or ``reservations`` (its source is ``SOURCES[product]``).
        emitted: ``(type, data)`` pairs in their natural order (see ``event_data``).
    """
    url, faults = settings.snapshot()
    if not url:
        return
    count = len(emitted)
    for index, (event_type, data) in enumerate(emitted):
        event_id = new_id("evt")
        body = {"id": event_id, "type": event_type, "created": rfc3339_now(), "data": data}
        event_store.insert_event(
            conn,
            event_id=event_id,
            source=SOURCES[product],
            event_type=event_type,
            object_id=data["id"],
            body=json.dumps(body, separators=(",", ":")),
            state="lost" if faults.loss and random.random() < faults.loss else "pending",  # noqa: S311
            copies=1 + faults.duplicates,
            send_order=count - 1 - index if faults.reorder else index,
            delay_seconds=faults.lag_seconds,
        )


def backoff_seconds(attempts: int) -> float:
    """Seconds before the next try after ``attempts`` failed ones (0.5, 1, 2, 4 … capped at 60)."""
    return float(min(BACKOFF_BASE_SECONDS * 2 ** max(attempts - 1, 0), BACKOFF_CAP_SECONDS))


def signed_headers(secret: str, event_id: str, body: str) -> dict[str, str]:
    """The Standard Webhooks headers for ``body`` signed now with ``secret``."""
    now = datetime.now(UTC)
    return {
        "content-type": "application/json",
        "webhook-id": event_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(secret).sign(event_id, now, body),
    }


def send(pool: Pool, client: httpx.Client, settings: EventSettings, row: dict[str, Any]) -> int | None:
    """POST one claimed event once and record the attempt.

    Returns:
        the receiver's status code, or ``None`` when there is no events URL (the event stays
        pending) or the receiver could not be reached.
    """
    url, _ = settings.snapshot()
    if not url:
        event_store.record_attempt(
            pool, row["seq"], status=None, error="no events URL configured",
            retry_in_seconds=POLL_SECONDS * 10, give_up_after_seconds=GIVE_UP_AFTER_SECONDS,
        )  # fmt: skip
        return None
    status: int | None = None
    error: str | None = None
    try:
        response = client.post(
            event_url(url, row["source"]),
            content=row["body"].encode(),
            headers=signed_headers(settings.secret, row["id"], row["body"]),
        )
        status = response.status_code
        if not 200 <= status < 300:
            error = response.text[:500]
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"[:500]
    if error is not None:
        logger.info("event %s (%s) not delivered: %s %s", row["id"], row["type"], status, error)
    event_store.record_attempt(
        pool,
        row["seq"],
        status=status,
        error=error,
        retry_in_seconds=backoff_seconds(row["attempts"] + 1),
        give_up_after_seconds=GIVE_UP_AFTER_SECONDS,
    )
    return status


def redeliver(pool: Pool, settings: EventSettings, event_id: str) -> dict[str, Any] | None:
    """Send event ``event_id`` once more now, synchronously: same id and body, fresh signature.

    A failed attempt leaves it pending, retried like any other.

    Returns:
        ``{"id", "status_code": int | None}``, or ``None`` when no such event exists.
    """
    row = event_store.claim_event_for_redelivery(pool, event_id)
    if row is None:
        return None
    with httpx.Client(timeout=SEND_TIMEOUT_SECONDS) as client:
        status = send(pool, client, settings, row)
    return {"id": event_id, "status_code": status}


class EventSender:
    """The background thread that sends due events until ``stopping`` is set."""

    def __init__(self, pool: Pool, settings: EventSettings, stopping: threading.Event) -> None:
        self.pool = pool
        self.settings = settings
        self.stopping = stopping
        self.thread = threading.Thread(target=self.run, name="sandbox-event-sender", daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self.thread.start()

    def run(self) -> None:
        """Send what is due, sleep ``POLL_SECONDS`` when nothing is; never dies on an error."""
        with httpx.Client(timeout=SEND_TIMEOUT_SECONDS) as client:
            while not self.stopping.is_set():
                sent = 0
                try:
                    if self.settings.snapshot()[0]:
                        for row in event_store.claim_due_events(self.pool):
                            if self.stopping.is_set():
                                break
                            send(self.pool, client, self.settings, row)
                            sent += 1
                except Exception:
                    logger.exception("the event sender failed; retrying")
                    self.stopping.wait(1.0)
                if not sent:
                    self.stopping.wait(POLL_SECONDS)
