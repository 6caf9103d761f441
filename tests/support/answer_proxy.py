"""A loopback HTTP proxy that loses a provider's answer after the provider gave it: the request
reaches the provider whole, the provider applies it and answers, and the client never reads the
answer ("the answer was lost" — a gateway timeout, a dropped connection, a client that gave up).

It speaks just enough HTTP/1.1 for the ledger's transport (``operations.adapters.http_support``
sends one request per connection, ``Connection: close``): it reads one request (headers and a
``Content-Length`` body), sends it upstream on a new connection, reads the whole answer, and
then, for a request that matches a rule of ``lose``, either closes the client's connection
without a byte (``drop``: the client sees the connection dropped) or keeps it open and silent
(``hold``: the client waits until its deadline, or until its process is killed). Any other
request is answered as the provider answered it. ``requests`` lists every request line seen.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass
class _Rule:
    prefix: str  # "POST /v1/charges"
    mode: str  # "drop" or "hold"
    times: int


class AnswerProxy:
    """Forward ``http://127.0.0.1:<port>`` to ``upstream_url``, losing the answers ``lose`` names.

    Attributes:
        url: the proxy's base URL (after ``start``).
        requests: every request line forwarded, e.g. ``"POST /v1/charges"`` (no query string).
        lost: request lines whose answer the provider gave and the client never got.
    """

    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.url = ""
        self.requests: list[str] = []
        self.lost: list[str] = []
        self._rules: list[_Rule] = []
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None

    def start(self) -> AnswerProxy:
        """Listen on a free loopback port."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        self._listener = listener
        self.url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def lose(self, prefix: str, *, mode: str = "drop", times: int = 1) -> None:
        """Lose the answers of the next ``times`` requests whose line starts with ``prefix``
        (``"POST /v1/charges"``): ``drop`` or ``hold`` (module docstring)."""
        assert mode in ("drop", "hold")
        with self._lock:
            self._rules.append(_Rule(prefix, mode, times))

    def count(self, prefix: str) -> int:
        """How many forwarded requests' lines start with ``prefix``."""
        with self._lock:
            return sum(1 for line in self.requests if line.startswith(prefix))

    def release(self) -> None:
        """Close every held connection (its client sees the connection dropped)."""
        with self._lock:
            held, self._held = self._held, []
        for sock in held:
            _close(sock)

    def stop(self) -> None:
        """Stop listening and close every held connection."""
        if self._listener is not None:
            _close(self._listener)
            self._listener = None
        self.release()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _rule_for(self, line: str) -> str:
        with self._lock:
            self.requests.append(line)
            for rule in self._rules:
                if rule.times > 0 and line.startswith(rule.prefix):
                    rule.times -= 1
                    return rule.mode
        return "pass"

    def _serve(self, client: socket.socket) -> None:
        try:
            request = _read_message(client)
            if not request:
                _close(client)
                return
            method, target = request.split(b" ", 2)[:2]
            mode = self._rule_for(f"{method.decode()} {target.decode().split('?', 1)[0]}")
            with socket.create_connection(self.upstream, timeout=30) as upstream:
                upstream.sendall(request)
                answer = _read_message(upstream)
        except OSError:
            _close(client)
            return
        if mode == "pass":
            with contextlib.suppress(OSError):
                client.sendall(answer)
            _close(client)
            return
        with self._lock:
            self.lost.append(f"{method.decode()} {target.decode().split('?', 1)[0]}")
            if mode == "hold":
                self._held.append(client)
                return
        _close(client)


def _read_message(sock: socket.socket) -> bytes:
    """One HTTP/1.1 message from ``sock``: its head, then ``Content-Length`` bytes of body, or
    everything until the peer closes when the head names no length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    if length is None and head.split(b" ", 1)[0] in (b"GET", b"DELETE", b"HEAD"):
        length = 0  # a request without a body
    while length is None or len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
