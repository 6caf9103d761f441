"""The sandbox provider's routes and the state they act on (``SandboxApp``: the database pool,
the fault queue, the runtime settings). The HTTP server (``server.py``) parses each request,
applies faults around the product writes and writes the answer.

Routes (all JSON; money in integer minor units):

Products
    ``POST /v1/charges``, ``POST /v1/refunds`` (``Idempotency-Key`` required, ``X-Fencing-Token``
    optional), ``GET /v1/charges?idempotency_key=K``, ``GET /v1/charges/{id}``, same for refunds;
    ``POST /v1/emails`` (header ``Message-ID``), ``GET /v1/emails?message_id=M``,
    ``GET /v1/emails/{id}``; ``POST /v1/reservations``, ``GET /v1/reservations?reference=R``,
    ``GET /v1/reservations/{id}``, ``POST /v1/reservations/{id}/cancel``;
    ``GET /v1/statements?date=YYYY-MM-DD&product=P`` (``statements.py``).
Control plane
    ``POST /_sandbox/faults`` / ``GET`` / ``DELETE``, ``POST /_sandbox/withdraw``
    ``{"product", "id"}``, ``POST /_sandbox/reset``, ``GET|POST /_sandbox/config``
    ``{"email_lookup_lag_seconds"}``, ``GET /_sandbox/requests?since=ID&product=P``,
    ``GET /ledger?product=P&reference=R``, ``GET /healthz``.
Events (``events.py``; sent to ``<events URL>/<source>/events`` when an events URL is set)
    ``GET /_sandbox/events?source=S&type=T`` (``{"settings", "events"}``: the event settings and
    every event generated with its delivery state), ``POST /_sandbox/events`` ``{"url",
    "lag_seconds", "duplicates", "reorder", "loss"}`` (any of them), ``POST
    /_sandbox/events/redeliver`` ``{"id"}``.
Statements (``statements.py``)
    ``POST /_sandbox/statements/omit`` ``{"product", "id"}``, ``POST /_sandbox/statements/amount``
    ``{"product", "id", "amount"}``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from console.lab.sandbox_provider import (
    event_store,
    events,
    messaging,
    payments,
    reservations,
    statements,
    store,
)
from console.lab.sandbox_provider.faults import PRODUCTS, FaultBook, parse_fault, parse_seconds
from console.lab.sandbox_provider.replies import BadRequest, Reply, RequestContext, error_reply
from console.lab.sandbox_provider.store import Pool


class SandboxApp:
    """The provider's state: the database pool, the fault queue and the runtime settings."""

    def __init__(
        self,
        pool: Pool,
        *,
        email_lag_seconds: float = 0.0,
        events_url: str = "",
        events_secret: str = events.DEFAULT_SECRET,
    ) -> None:
        self.pool = pool
        self.faults = FaultBook()
        self.initial_email_lag = email_lag_seconds
        self.email = messaging.EmailSettings(email_lag_seconds)
        self.events = events.EventSettings(initial_url=events_url, secret=events_secret)
        self.stopping = threading.Event()

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds``, cut short when the server stops."""
        self.stopping.wait(seconds)

    def reset(self) -> None:
        """Truncate every sandbox table (events and statement adjustments too), clear the faults,
        restore the startup settings (events URL included; event fault modes off)."""
        store.truncate_all(self.pool)
        self.faults.clear()
        self.email.lookup_lag_seconds = self.initial_email_lag
        self.events.reset()

    def config(self) -> dict[str, Any]:
        """The runtime settings as JSON."""
        return {"email_lookup_lag_seconds": self.email.lookup_lag_seconds}


ProductPost = Callable[[RequestContext, dict[str, Any], re.Match[str]], Reply]


def product_posts(app: SandboxApp) -> list[tuple[re.Pattern[str], str, ProductPost]]:
    """The product write routes: ``(path pattern, product, handler)``, tried in order against
    the whole path; the handler applies the effect (faults are the server's business)."""
    pool = app.pool
    return [
        (
            re.compile(r"/v1/charges"),
            "payments",
            lambda ctx, body, m: payments.create_charge(pool, ctx, body),
        ),
        (
            re.compile(r"/v1/refunds"),
            "payments",
            lambda ctx, body, m: payments.create_refund(pool, ctx, body),
        ),
        (re.compile(r"/v1/emails"), "email", lambda ctx, body, m: messaging.send_email(pool, ctx, body)),
        (
            re.compile(r"/v1/reservations"),
            "reservations",
            lambda ctx, body, m: reservations.create_reservation(pool, ctx, body),
        ),
        (
            re.compile(r"/v1/reservations/(?P<id>[^/]+)/cancel"),
            "reservations",
            lambda ctx, body, m: reservations.cancel_reservation(pool, ctx, m["id"]),
        ),
    ]


def _query(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def route_get(app: SandboxApp, path: str, query: dict[str, list[str]]) -> Reply:
    """Answer ``GET path`` (``query`` as ``urllib.parse.parse_qs`` returns it); 404 for no route.

    Raises:
        BadRequest: a malformed parameter.
    """
    pool = app.pool
    if path == "/healthz":
        with pool.connection() as conn:
            conn.execute("SELECT 1")
        return Reply(200, {"status": "ok"})
    if path == "/ledger":
        return Reply(
            200,
            {
                "effects": store.ledger(
                    pool, product=_query(query, "product"), reference=_query(query, "reference")
                )
            },
        )
    if path == "/_sandbox/requests":
        since = _query(query, "since") or "0"
        if not since.isdigit():
            raise BadRequest("since must be a request log id (a non-negative integer)", param="since")
        return Reply(200, store.requests_since(pool, since=int(since), product=_query(query, "product")))
    if path == "/_sandbox/faults":
        return Reply(200, {"faults": app.faults.pending()})
    if path == "/_sandbox/config":
        return Reply(200, app.config())
    if path == "/_sandbox/events":
        return Reply(
            200,
            {
                "settings": app.events.as_json(),
                "events": event_store.list_events(
                    pool, source=_query(query, "source"), event_type=_query(query, "type")
                ),
            },
        )
    if path == "/v1/statements":
        return statements.get_statement(
            pool, day_text=_query(query, "date"), product_text=_query(query, "product")
        )
    if match := re.fullmatch(r"/v1/(charges|refunds)(?:/(?P<id>[^/]+))?", path):
        if match["id"]:
            return payments.get_item(pool, match[1], match["id"])
        return payments.list_items(
            pool,
            match[1],
            idempotency_key=_query(query, "idempotency_key"),
            reference=_query(query, "reference"),
        )
    if match := re.fullmatch(r"/v1/emails(?:/(?P<id>[^/]+))?", path):
        if match["id"]:
            return messaging.get_email(pool, match["id"])
        return messaging.list_emails(pool, app.email, message_id=_query(query, "message_id"))
    if match := re.fullmatch(r"/v1/reservations(?:/(?P<id>[^/]+))?", path):
        if match["id"]:
            return reservations.get_reservation(pool, match["id"])
        return reservations.list_reservations(pool, reference=_query(query, "reference"))
    return error_reply(404, "route_not_found", f"No route GET {path}")


def route_control_post(app: SandboxApp, path: str, body: dict[str, Any]) -> Reply | None:
    """Answer a control-plane ``POST path`` (``/_sandbox/...``) with JSON object ``body``;
    ``None`` when ``path`` is not a control-plane route.

    Raises:
        BadRequest: a malformed body.
    """
    if path == "/_sandbox/faults":
        fault = parse_fault(body)
        app.faults.add(fault)
        return Reply(200, {"fault": fault.as_json(), "faults": app.faults.pending()})
    if path == "/_sandbox/reset":
        app.reset()
        return Reply(200, {"reset": True})
    if path == "/_sandbox/config":
        if "email_lookup_lag_seconds" in body:
            lag = parse_seconds(body["email_lookup_lag_seconds"], param="email_lookup_lag_seconds")
            app.email.lookup_lag_seconds = lag or 0.0
        return Reply(200, app.config())
    if path == "/_sandbox/events":
        app.events.update(events.parse_event_settings(body))
        return Reply(200, {"settings": app.events.as_json()})
    if path == "/_sandbox/events/redeliver":
        event_id = body.get("id")
        if not isinstance(event_id, str) or not event_id:
            raise BadRequest("id must be an event id (evt_...)", param="id")
        if not app.events.snapshot()[0]:
            return error_reply(409, "no_events_url", "No events URL is configured: nowhere to deliver to.")
        result = events.redeliver(app.pool, app.events, event_id)
        if result is None:
            return error_reply(404, "resource_missing", f"No such event: {event_id!r}")
        return Reply(200, {"redelivered": result})
    if path == "/_sandbox/statements/omit":
        return statements.omit(app.pool, body)
    if path == "/_sandbox/statements/amount":
        return statements.set_amount(app.pool, body)
    if path == "/_sandbox/withdraw":
        product, item_id = body.get("product"), body.get("id")
        if product not in PRODUCTS:
            raise BadRequest(f"product must be one of {', '.join(PRODUCTS)}", param="product")
        if not isinstance(item_id, str) or not item_id:
            raise BadRequest("id must be a provider id", param="id")
        if not store.withdraw(app.pool, product=product, item_id=item_id):
            return error_reply(404, "resource_missing", f"No such {product} item: {item_id!r}")
        return Reply(200, {"withdrawn": {"product": product, "id": item_id}})
    return None
