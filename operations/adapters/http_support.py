"""HTTP transport shared by the HTTP adapters: one request under a wall-clock deadline, with the
answer read by streaming up to a size cap.

What an answer *means* (success, refusal, retry, ambiguous) is decided in one place,
``operations.adapters.http_classifier``; this module owns only the rows of that table that
concern the transport: whether the request was sent, whether the deadline was hit, and whether
the body fitted under the cap.

* **Deadline** (``deadline_seconds``): one wall-clock bound for the whole call — pool, connect,
  send, headers and every byte of the body. Each phase's httpx timeout is the time remaining
  when the request is built; the time is checked again between body chunks; and a watchdog
  timer shuts the socket down when the deadline passes, so a provider that trickles its
  headers or body one byte at a time cannot hold the call past it (each httpx timeout bounds
  one read, not the call). Every request goes on a fresh connection (``Connection: close``, no
  idle keep-alive connections) so that the watchdog always knows the socket, and a pooled
  connection the server had already closed can no longer turn a request into a spurious
  ambiguous outcome.
* **Sent or not**: httpcore's ``trace`` extension tells when the request's first byte is about
  to be written. A failure before that (connect refused or timed out, no pooled connection,
  deadline hit while connecting) was never seen by the provider: ``RetryableError``. Anything
  after it may have been applied: ``AmbiguousOutcome``.
* **Size cap** (``EFFECT_LEDGER["PROVIDER_RESPONSE_MAX_BYTES"]``, default 1 MiB): the body is
  read in chunks (at most 64 KiB each, httpcore's read size) and kept only while it fits; past
  the cap (or when ``Content-Length`` already says so) reading stops, what was read is
  digested (sha256) and discarded, and the answer is ``AmbiguousOutcome`` whatever its status.
  ``Accept-Encoding: identity`` asks the provider not to compress, so the bytes counted are the
  bytes kept.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx
from django.conf import settings

from operations.adapters.errors import DEADLINE_EXCEEDED_CODE, AdapterError, AmbiguousOutcome, RetryableError

#: Default of ``EFFECT_LEDGER["PROVIDER_RESPONSE_MAX_BYTES"]``: 1 MiB.
DEFAULT_RESPONSE_MAX_BYTES = 1024 * 1024

_clients: dict[int, httpx.Client] = {}


def _client() -> httpx.Client:
    """One HTTP client per process (thread-safe; created after a fork, never inherited).

    Building a client costs tens of milliseconds (its TLS context), more than a loopback call,
    so it is made once. It keeps no idle connections: each request opens its own (see the
    module docstring), which lets the deadline's watchdog reach the socket.
    """
    pid = os.getpid()
    client = _clients.get(pid)
    if client is None:
        _clients.clear()
        client = _clients[pid] = httpx.Client(
            follow_redirects=False, limits=httpx.Limits(max_keepalive_connections=0)
        )
    return client


def response_max_bytes() -> int:
    """``EFFECT_LEDGER["PROVIDER_RESPONSE_MAX_BYTES"]`` (bytes; default 1 MiB)."""
    conf = getattr(settings, "EFFECT_LEDGER", {}) or {}
    return int(conf.get("PROVIDER_RESPONSE_MAX_BYTES", DEFAULT_RESPONSE_MAX_BYTES))


@dataclass(frozen=True)
class HttpAnswer:
    """A provider's complete answer, read within the deadline and under the size cap.

    Attributes:
        status_code: the HTTP status.
        headers: the response headers (case-insensitive).
        content: the whole body (at most the cap, in bytes).
        digest: sha256 hex of ``content``, as evidence.
        elapsed_seconds: wall-clock seconds from the start of the call to the last byte.
    """

    status_code: int
    headers: httpx.Headers
    content: bytes
    digest: str
    elapsed_seconds: float

    @property
    def is_success(self) -> bool:
        """Whether the status is 2xx."""
        return 200 <= self.status_code < 300


class _Deadline:
    """The call's wall clock, what the request reached (connected, first byte written), and
    the watchdog that shuts the socket down when the time is up."""

    def __init__(self, seconds: float) -> None:
        self.started = time.monotonic()
        self.ends_at = self.started + seconds
        self.expired = False
        self.connected = False
        self.sending = False
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()

    def remaining(self) -> float:
        return self.ends_at - time.monotonic()

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's ``trace`` extension: remember the socket, and when sending starts."""
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            with self._lock:
                self.connected = True
                self._socket = sock if isinstance(sock, socket.socket) else self._socket
                expired = self.expired
            if expired:
                self._shut_down()
        elif event == "http11.send_request_headers.started":
            self.sending = True

    def _fire(self) -> None:
        with self._lock:
            self.expired = True
        self._shut_down()

    def _shut_down(self) -> None:
        with self._lock:
            sock = self._socket
        if sock is None:
            return
        # socket.socket.shutdown, not SSLSocket.shutdown (which drops its TLS state under the
        # reading thread): wakes a blocked read at once and tells the provider.
        with suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)

    @contextmanager
    def watch(self) -> Iterator[None]:
        timer = threading.Timer(max(0.0, self.remaining()), self._fire)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def check(self) -> None:
        if self.remaining() <= 0:
            self.expired = True
            raise _DeadlineHit

    def failure(self, method: str, url: str, exc: Exception) -> AdapterError:
        """The adapter error for a transport failure ``exc`` (see the module docstring)."""
        where = f"{method} {url}"
        if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
            return RetryableError(f"{where}: bad provider URL ({exc})", detail={"code": "bad_url"})
        never_sent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout) or (
            self.connected and not self.sending
        )
        if never_sent:
            code = "deadline_before_send" if self.expired else "not_sent"
            return RetryableError(f"{where}: not sent ({exc!r})", detail={"code": code})
        if self.expired or isinstance(exc, _DeadlineHit | httpx.TimeoutException):
            return AmbiguousOutcome(
                f"{where}: no complete answer within the {self.ends_at - self.started:.1f} s deadline",
                detail={"code": DEADLINE_EXCEEDED_CODE},
            )
        if isinstance(exc, httpx.RemoteProtocolError):
            return AmbiguousOutcome(
                f"{where}: connection dropped without a complete response",
                detail={"code": "connection_dropped"},
            )
        return AmbiguousOutcome(f"{where}: transport error {exc!r}", detail={"code": "transport_error"})


class _DeadlineHit(Exception):
    """The deadline passed between two chunks of the body."""


def _read_capped(response: httpx.Response, deadline: _Deadline, max_bytes: int) -> bytes:
    """Read the body chunk by chunk within the deadline; past ``max_bytes`` stop and raise."""
    declared = response.headers.get("Content-Length", "")
    hasher, parts, read = hashlib.sha256(), [], 0
    if not (declared.isascii() and declared.isdigit() and int(declared) > max_bytes):
        for chunk in response.iter_bytes():
            read += len(chunk)
            hasher.update(chunk)
            if read > max_bytes:
                break
            parts.append(chunk)
            deadline.check()
        else:
            return b"".join(parts)
    raise AmbiguousOutcome(
        f"provider answered {response.status_code} with more than {max_bytes} bytes; "
        "not read further (the part read is digested, not stored)",
        detail={
            "code": "response_too_large",
            "status": response.status_code,
            "max_bytes": max_bytes,
            "bytes_read": read,
            "declared_length": declared or None,
            "partial_digest": hasher.hexdigest(),
        },
    )


def send(
    method: str,
    url: str,
    *,
    deadline_seconds: float,
    json: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
    form: list[tuple[str, str]] | None = None,
    max_bytes: int | None = None,
) -> HttpAnswer:
    """Send one HTTP request (no automatic retries, no redirects) and read its whole answer.

    Args:
        deadline_seconds: wall-clock bound of the whole call (connect, send, headers, body), in
            seconds; the caller passes at most ``ExecutionCall.deadline_seconds``.
        form: fields sent as ``application/x-www-form-urlencoded`` instead of ``json`` (in
            order; ``operations.adapters.templates.form_pairs`` flattens nested values).
        max_bytes: the body's size cap in bytes (default ``response_max_bytes()``).

    Returns:
        the ``HttpAnswer`` of any status: classify it with ``http_classifier``.

    Raises:
        RetryableError: the request was never sent (connection refused, connect timeout, no
            pooled connection, deadline hit before the first byte was written: ``code``
            ``not_sent`` / ``deadline_before_send``), or the URL is unusable (``bad_url``).
        AmbiguousOutcome: the request may have reached the provider: the deadline passed
            (``deadline_exceeded``), the connection dropped (``connection_dropped``), another
            transport error (``transport_error``), or the body exceeded ``max_bytes``
            (``response_too_large``, with the digest of the part read).
    """
    cap = response_max_bytes() if max_bytes is None else max_bytes
    deadline = _Deadline(deadline_seconds)
    if deadline.remaining() <= 0:
        raise RetryableError(f"{method} {url}: no time left to send", detail={"code": "deadline_before_send"})
    client = _client()
    request_headers = {**(headers or {}), "Accept-Encoding": "identity", "Connection": "close"}
    request_body = None
    if form is not None:
        request_body = urlencode(form).encode("ascii")
        request_headers["Content-Type"] = "application/x-www-form-urlencoded"
    try:
        with deadline.watch():
            request = client.build_request(
                method,
                url,
                json=json,
                content=request_body,
                headers=request_headers,
                params=params,
                timeout=httpx.Timeout(deadline.remaining()),
                extensions={"trace": deadline.trace},
            )
            response = client.send(request, stream=True)
            try:
                content = _read_capped(response, deadline, cap)
            finally:
                response.close()
            if deadline.expired:  # the watchdog cut a body that ends with the connection
                raise _DeadlineHit
    except (httpx.HTTPError, httpx.InvalidURL, _DeadlineHit) as exc:
        raise deadline.failure(method, url, exc) from exc
    return HttpAnswer(
        status_code=response.status_code,
        headers=response.headers,
        content=content,
        digest=hashlib.sha256(content).hexdigest(),
        elapsed_seconds=time.monotonic() - deadline.started,
    )
