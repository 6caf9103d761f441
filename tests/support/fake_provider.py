"""A fake HTTP provider on a loopback port that answers the way real providers, proxies and
gateways do, told per request how to answer: the conformance suite's other side.

It is a real server (``http.server.ThreadingHTTPServer`` in a thread), so the adapters' whole
transport runs: sockets, timeouts, streaming, connection drops. Requests are keyed by their
``Idempotency-Key`` header (else ``Message-ID``); an answer that *applies* the effect honours the
key the way the Idempotency-Key draft describes (a repeat is replayed with
``Idempotent-Replayed: true``; a repeat while the first is still executing gets the draft's 409
problem without a ``code``). Faults that do not reach the provider (a gateway's 504, a portal's
HTML page, a 429) apply nothing.

Use the ``fake_provider`` fixture and ``script(...)`` the answers: request *n* gets answer *n*,
and the last one repeats.
"""

from __future__ import annotations

import json
import select
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

DRAFT_TYPE = "https://fake-provider.test/docs/idempotency"
DRAFT_TITLES = {
    400: "Idempotency-Key is missing",
    409: "A request is outstanding for this Idempotency-Key",
    422: "Idempotency-Key is already used",
}


@dataclass(frozen=True)
class Answer:
    """How to answer one request.

    kinds: ``ok`` (apply once per key, 200 JSON with an id; ``seconds``: work before applying),
    ``no_id`` (apply, 200 ``{"status": "accepted"}``), ``object_id`` (apply, 200 with an ``id``
    that is a JSON object), ``html`` (200 text/html, nothing applied),
    ``problem`` (``status`` with the draft's problem+json and no ``code``, nothing applied),
    ``coded`` (``status`` with ``{"error": {"code": code}}``, nothing applied), ``retry_after``
    (``status`` 429/503 with ``Retry-After: retry_after``; ``date+N`` sends the HTTP-date N
    seconds after the answer; nothing applied), ``after_effect``
    (apply, then ``status`` with a small text body), ``gateway`` (``status`` every time, nothing
    applied), ``redirect`` (307 to ``/elsewhere``), ``trickle`` (apply, headers, then the body one
    byte every ``seconds``), ``huge`` (apply, then a 200 body of ``size`` bytes), ``drop``
    (apply, then close the connection without an answer).
    """

    kind: str
    status: int = 200
    seconds: float = 0.0
    retry_after: str = ""
    code: str = ""
    size: int = 0


@dataclass
class Seen:
    """One request as the provider saw it; ``ended`` is when its answer ended or the client left."""

    key: str
    method: str
    path: str
    body: dict[str, Any]
    answer: str
    started: float
    ended: float = 0.0
    bytes_sent: int = 0
    status: int = 0  # the status it was answered with (0: none, the connection was dropped)


@dataclass
class FakeProvider:
    """The running fake provider: ``url``, the script, and what it saw and applied."""

    url: str = ""
    answers: list[Answer] = field(default_factory=lambda: [Answer("ok")])
    requests: list[Seen] = field(default_factory=list)
    effects: dict[str, dict[str, Any]] = field(default_factory=dict)
    in_progress: set[str] = field(default_factory=set)
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    idle: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.idle = threading.Condition(self.lock)

    def script(self, *answers: Answer) -> None:
        """Answer request n with ``answers[n]`` (the last one repeats)."""
        with self.lock:
            self.answers = list(answers)

    def keys(self) -> list[str]:
        """The key of every request, in order."""
        return [seen.key for seen in self.requests]

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Wait until no request is being handled (a slow first request has applied)."""
        with self.idle:
            assert self.idle.wait_for(lambda: self.in_flight == 0, timeout), "requests still in flight"

    def overlapping(self) -> bool:
        """Whether two requests were ever handled at the same time."""
        spans = sorted((seen.started, seen.ended or time.monotonic()) for seen in self.requests)
        return any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:], strict=False))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    seen: Seen

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        return

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def _handle(self) -> None:
        provider = self.server.provider
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        key = self.headers.get("Idempotency-Key") or self.headers.get("Message-ID") or ""
        with provider.lock:
            answer = provider.answers[min(len(provider.requests), len(provider.answers) - 1)]
            seen = Seen(key, self.command, self.path, body, answer.kind, time.monotonic())
            provider.requests.append(seen)
            provider.in_flight += 1
            provider.max_in_flight = max(provider.max_in_flight, provider.in_flight)
        self.close_connection = True
        self.seen = seen
        try:
            _ANSWERS[answer.kind](self, provider, seen, answer)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with provider.lock:
                seen.ended = time.monotonic()
                provider.in_flight -= 1
                provider.idle.notify_all()

    # --- writing ------------------------------------------------------------------------------

    def send_response(self, code: int, message: str | None = None) -> None:
        self.seen.status = code
        super().send_response(code, message)

    def reply(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def reply_json(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        content_type = "application/problem+json" if status >= 400 else "application/json"
        self.reply(status, json.dumps(body).encode(), content_type, headers)

    def client_gone(self, wait: float) -> bool:
        """Wait up to ``wait`` seconds; True as soon as the client closed its end."""
        readable, _, _ = select.select([self.connection], [], [], wait)
        return bool(readable) and self.connection.recv(1, 0) == b""


def _apply(handler: _Handler, provider: FakeProvider, seen: Seen, answer: Answer) -> dict[str, Any] | None:
    """Apply the effect once per key; None when a request with the key is still executing
    (the 409 was sent). Returns the stored object, ``replayed`` set on a repeat."""
    with provider.lock:
        if seen.key in provider.in_progress:
            busy = True
        elif seen.key in provider.effects:
            return {**provider.effects[seen.key], "replayed": True}
        else:
            busy = False
            provider.in_progress.add(seen.key)
    if busy:
        handler.reply_json(409, {"type": DRAFT_TYPE, "title": DRAFT_TITLES[409], "status": 409})
        return None
    time.sleep(answer.seconds if answer.kind == "ok" else 0)
    with provider.lock:
        effect = {
            "id": f"tr_{len(provider.effects) + 1}",
            "amount": seen.body.get("amount"),
            "replayed": False,
        }
        provider.effects[seen.key] = {k: v for k, v in effect.items() if k != "replayed"}
        provider.in_progress.discard(seen.key)
    return effect


def _replayed(effect: dict[str, Any]) -> dict[str, str]:
    return {"Idempotent-Replayed": "true"} if effect["replayed"] else {}


def _ok(handler: _Handler, provider: FakeProvider, seen: Seen, answer: Answer) -> None:
    effect = _apply(handler, provider, seen, answer)
    if effect is not None:
        body = {k: v for k, v in effect.items() if k != "replayed"}
        handler.reply_json(200, body, _replayed(effect))


def _no_id(handler: _Handler, provider: FakeProvider, seen: Seen, answer: Answer) -> None:
    effect = _apply(handler, provider, seen, answer)
    if effect is not None:
        handler.reply_json(200, {"status": "accepted"}, _replayed(effect))


def _object_id(handler: _Handler, provider: FakeProvider, seen: Seen, answer: Answer) -> None:
    effect = _apply(handler, provider, seen, answer)
    if effect is not None:
        handler.reply_json(200, {"id": {"nested": ["a", 1]}}, _replayed(effect))


def _html(handler: _Handler, provider: FakeProvider, seen: Seen, answer: Answer) -> None:
    page = b"<!doctype html><html><body><h1>Welcome to the portal</h1></body></html>"
    handler.reply(200, page, "text/html; charset=utf-8")


def _problem(handler: _Handler, provider: FakeProvider, seen: Seen, answer: Answer) -> None:
    body = {"type": DRAFT_TYPE, "title": DRAFT_TITLES[answer.status], "status": answer.status}
    handler.reply_json(answer.status, body)


def _coded(handler: _Handler, provider: FakeProvider, seen: Seen, answer: Answer) -> None:
    handler.reply_json(answer.status, {"error": {"code": answer.code, "message": answer.code}})


def _retry_after(handler: _Handler, provider: FakeProvider, seen: Seen, answer: Answer) -> None:
    value = answer.retry_after
    if value.startswith("date+"):  # an HTTP-date that many seconds after this answer
        value = http_date(float(value.removeprefix("date+")))
    handler.reply_json(answer.status, {"title": "slow down", "status": answer.status}, {"Retry-After": value})


def _after_effect(handler: _Handler, provider: FakeProvider, seen: Seen, answer: Answer) -> None:
    if _apply(handler, provider, seen, answer) is not None:
        handler.reply(answer.status, b"upstream error", "text/plain")


def _gateway(handler: _Handler, provider: FakeProvider, seen: Seen, answer: Answer) -> None:
    handler.reply(answer.status, b"<html>gateway</html>", "text/html")


def _redirect(handler: _Handler, provider: FakeProvider, seen: Seen, answer: Answer) -> None:
    handler.reply(307, b"", "text/plain", {"Location": f"{provider.url}/elsewhere"})


def _trickle(handler: _Handler, provider: FakeProvider, seen: Seen, answer: Answer) -> None:
    effect = _apply(handler, provider, seen, answer)
    if effect is None:
        return
    body = json.dumps({k: v for k, v in effect.items() if k != "replayed"}).encode()
    body = body[:-1] + b"," + b" " * max(0, answer.size - len(body)) + b"}"
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.flush()
    for index in range(len(body)):
        handler.wfile.write(body[index : index + 1])
        handler.wfile.flush()
        seen.bytes_sent += 1
        if handler.client_gone(answer.seconds):
            return


def _huge(handler: _Handler, provider: FakeProvider, seen: Seen, answer: Answer) -> None:
    """A body of ``answer.size`` bytes, with its Content-Length, or (``code="no_length"``)
    without one, delimited by closing the connection."""
    effect = _apply(handler, provider, seen, answer)
    if effect is None:
        return
    head = json.dumps({"id": effect["id"], "padding": ""}).encode()[:-2]
    chunk = b"x" * 65536
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    if answer.code == "no_length":
        handler.send_header("Connection", "close")
    else:
        handler.send_header("Content-Length", str(answer.size))
    handler.end_headers()
    handler.wfile.write(head)
    sent = len(head)
    while sent < answer.size:
        piece = chunk[: answer.size - sent]
        handler.wfile.write(piece)
        sent += len(piece)
        seen.bytes_sent = sent


def _drop(handler: _Handler, provider: FakeProvider, seen: Seen, answer: Answer) -> None:
    if _apply(handler, provider, seen, answer) is not None:
        handler.connection.shutdown(2)  # socket.SHUT_RDWR: no answer at all


_ANSWERS = {
    "ok": _ok,
    "no_id": _no_id,
    "object_id": _object_id,
    "html": _html,
    "problem": _problem,
    "coded": _coded,
    "retry_after": _retry_after,
    "after_effect": _after_effect,
    "gateway": _gateway,
    "redirect": _redirect,
    "trickle": _trickle,
    "huge": _huge,
    "drop": _drop,
}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    provider: FakeProvider

    def handle_error(self, request: Any, client_address: Any) -> None:
        return  # a client that hung up mid-answer is part of the script, not an error


def http_date(seconds_from_now: float) -> str:
    """An RFC 9110 IMF-fixdate ``seconds_from_now`` seconds ahead (for ``Retry-After``)."""
    return formatdate(time.time() + seconds_from_now, usegmt=True)


@pytest.fixture
def fake_provider() -> Iterator[FakeProvider]:
    """A fake provider on ``127.0.0.1:<free port>`` for one test (see the module docstring)."""
    server = _Server(("127.0.0.1", 0), _Handler)
    provider = FakeProvider(url=f"http://127.0.0.1:{server.server_address[1]}")
    server.provider = provider
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield provider
    finally:
        server.shutdown()
        server.server_close()
