"""The sandbox provider's HTTP server: request parsing, fault application and the answers; the
routes and the provider's state (``SandboxApp``) are in ``routes.py``, with the list of routes.

Faults (``faults.FaultMode``) come from the queue or the per-request header ``X-Sandbox-Fault``
(with ``X-Sandbox-Fault-Delay`` seconds). Before-effect faults act as soon as the request is
read, so nothing reaches the product (no key is claimed); ``delay_after_effect`` sleeps after
the key is claimed and before the effect; after-effect faults act on the product's reply.
Malformed requests get a 400 with an error body; no request can take the server down.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from psycopg_pool import PoolTimeout

from console.lab.sandbox_provider import events, store
from console.lab.sandbox_provider.faults import Fault, FaultMode, parse_mode, parse_seconds
from console.lab.sandbox_provider.replies import BadRequest, Reply, RequestContext, error_reply
from console.lab.sandbox_provider.routes import (
    ProductPost,
    SandboxApp,
    product_posts,
    route_control_post,
    route_get,
)

logger = logging.getLogger("console.lab.sandbox_provider")

MAX_BODY_BYTES = 1024 * 1024


class DropConnection(Exception):
    """Close the connection without writing any response."""


class SandboxHandler(BaseHTTPRequestHandler):
    """One request: parse, route, apply faults, answer (or drop the connection)."""

    server: SandboxHTTPServer
    protocol_version = "HTTP/1.0"
    server_version = "EffectLedgerSandbox/1"

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        """Serve a read route."""
        self._serve(lambda path, query: route_get(self.server.app, path, query))

    def do_POST(self) -> None:  # noqa: N802
        """Serve a product write or a control-plane command."""
        self._serve(lambda path, query: self._post(path))

    def do_DELETE(self) -> None:  # noqa: N802
        """``DELETE /_sandbox/faults`` clears the queued faults."""

        def delete(path: str, query: dict[str, list[str]]) -> Reply:
            if path == "/_sandbox/faults":
                self.server.app.faults.clear()
                return Reply(200, {"faults": []})
            return error_reply(404, "route_not_found", f"No route DELETE {path}")

        self._serve(delete)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (signature of the base class)
        """Route http.server's access log to the ``console.lab.sandbox_provider`` logger at DEBUG."""
        logger.debug("%s " + format, self.address_string(), *args)

    def _serve(self, route: Callable[[str, dict[str, list[str]]], Reply]) -> None:
        url = urlsplit(self.path)
        try:
            reply = route(url.path.rstrip("/") or "/", parse_qs(url.query))
        except DropConnection:
            self.close_connection = True
            return
        except BadRequest as exc:
            reply = exc.reply()
        except PoolTimeout:
            reply = error_reply(503, "database_unavailable", "No database connection available; retry later.")
        except Exception:
            logger.exception("sandbox request failed: %s %s", self.command, self.path)
            reply = error_reply(500, "internal_error", "The sandbox provider failed on this request.")
        self._write(reply)

    def _write(self, reply: Reply) -> None:
        payload = json.dumps(reply.body, default=str).encode()
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("Connection", "close")
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            logger.info("client went away before the answer to %s %s", self.command, self.path)

    def _body(self) -> dict[str, Any]:
        raw_length = self.headers.get("Content-Length") or "0"
        if not raw_length.isdigit():
            raise BadRequest("Content-Length must be a non-negative integer")
        length = int(raw_length)
        if length > MAX_BODY_BYTES:
            raise BadRequest(f"the body is larger than {MAX_BODY_BYTES} bytes", code="body_too_large")
        raw = self.rfile.read(length) if length else b""
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise BadRequest("the body is not valid JSON", code="invalid_json") from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object", code="invalid_json")
        return body

    def _post(self, path: str) -> Reply:
        app = self.server.app
        body = self._body()
        control = route_control_post(app, path, body)
        if control is not None:
            return control
        for pattern, product, handler in product_posts(app):
            if match := pattern.fullmatch(path):
                return self._product_post(product, path, body, handler, match)
        return error_reply(404, "route_not_found", f"No route POST {path}")

    def _fault_for(self, product: str, reference: str | None) -> Fault | None:
        header = self.headers.get("X-Sandbox-Fault")
        if header:
            delay = parse_seconds(
                self.headers.get("X-Sandbox-Fault-Delay") or None, param="X-Sandbox-Fault-Delay"
            )
            return Fault(product, parse_mode(header.strip()), delay_seconds=delay)
        return self.server.app.faults.take(product, reference)

    def _product_post(
        self, product: str, path: str, body: dict[str, Any], handler: ProductPost, match: re.Match[str]
    ) -> Reply:
        app = self.server.app
        headers = {name.lower(): value for name, value in self.headers.items()}
        reference = body.get("reference") if isinstance(body.get("reference"), str) else None
        fault = self._fault_for(product, reference)
        fence = headers.get("x-fencing-token", "")
        store.log_request(
            app.pool,
            product=product,
            method="POST",
            path=path,
            idempotency_key=headers.get("idempotency-key"),
            message_id=headers.get("message-id"),
            reference=reference,
            fence=int(fence) if fence.lstrip("-").isdigit() else None,
            fault=str(fault.mode) if fault else None,
        )
        mode = fault.mode if fault else None
        if fault is not None:
            logger.info("sandbox fault %s on POST %s (reference %s)", mode, path, reference)
        if mode is FaultMode.CRASH_BEFORE_EFFECT:
            raise DropConnection
        if mode is FaultMode.ERROR_500_BEFORE_EFFECT:
            return error_reply(500, "internal_error", "Injected failure before the effect.")
        if mode is FaultMode.IN_PROGRESS:
            return error_reply(
                409, "request_in_progress", "A request with this idempotency key is in progress."
            )
        if fault is not None and mode is FaultMode.HOLD_BEFORE_EFFECT:
            app.wait(fault.seconds)
            raise DropConnection
        ctx = RequestContext(
            headers=headers, emit=lambda conn, emitted: events.record(conn, app.events, product, emitted)
        )
        if fault is not None and mode is FaultMode.DELAY_AFTER_EFFECT:
            seconds = fault.seconds
            ctx.before_apply = lambda: app.wait(seconds)
        reply = handler(ctx, body, match)
        if mode is FaultMode.CRASH_AFTER_EFFECT:
            raise DropConnection
        if mode is FaultMode.ERROR_500_AFTER_EFFECT:
            return error_reply(500, "internal_error", "Injected failure after the effect.")
        if fault is not None and mode is FaultMode.HOLD_AFTER_EFFECT:
            app.wait(fault.seconds)
            raise DropConnection
        if fault is not None and mode is FaultMode.HOLD_ANSWER:
            app.wait(fault.seconds)
        return reply


class SandboxHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server that carries the ``SandboxApp``."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], app: SandboxApp) -> None:
        super().__init__(address, SandboxHandler)
        self.app = app


def run_provider(
    *,
    host: str,
    port: int,
    dsn: str,
    email_lag_seconds: float,
    stop: threading.Event,
    on_ready: Callable[[str], None],
    events_url: str = "",
    events_secret: str = events.DEFAULT_SECRET,
) -> None:
    """Run the provider until ``stop`` is set, then shut down cleanly.

    Args:
        host, port: where to listen; port 0 picks a free port (the URL passed to ``on_ready``
            carries the real one).
        dsn: libpq connection string of the database holding the ``sandbox`` schema.
        email_lag_seconds: initial email lookup lag.
        stop: set it (e.g. from a signal handler) to stop.
        on_ready: called once with ``http://HOST:PORT`` when requests can be served.
        events_url: the events base URL (``http://127.0.0.1:8000/providers/``); ``""``: no events
            until ``POST /_sandbox/events {"url"}`` sets one.
        events_secret: the Standard Webhooks secret events are signed with (``whsec_…``).

    Raises:
        psycopg_pool.PoolTimeout: the database is unreachable at start.
        OSError: the address is in use.
    """
    pool = store.open_pool(dsn)
    try:
        store.ensure_schema(pool)
        app = SandboxApp(
            pool, email_lag_seconds=email_lag_seconds, events_url=events_url, events_secret=events_secret
        )
        server = SandboxHTTPServer((host, port), app)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
        thread.start()
        sender = events.EventSender(pool, app.events, app.stopping)
        sender.start()
        url_host = host if host not in ("", "0.0.0.0") else "127.0.0.1"
        on_ready(f"http://{url_host}:{server.server_address[1]}")
        stop.wait()
        app.stopping.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        sender.thread.join(timeout=5)
    finally:
        pool.close(timeout=5)
