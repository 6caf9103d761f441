"""A real HTTP server on 127.0.0.1 in a thread that receives webhooks: it answers each POST with
the next status of its script (then the last one again) and keeps every request's headers and
body bytes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@dataclass
class Received:
    """One request as it arrived: its headers (lower-case names), body bytes and path."""

    headers: dict[str, str]
    body: bytes
    path: str = ""


@dataclass
class Receiver:
    """The server's script and what it received; ``url`` is where to POST."""

    statuses: list[int] = field(default_factory=lambda: [200])
    received: list[Received] = field(default_factory=list)
    url: str = ""
    #: seconds each answer is held back (a slow receiver)
    delay: float = 0.0

    def next_status(self) -> int:
        index = min(len(self.received) - 1, len(self.statuses) - 1)
        return self.statuses[index]


def start_receiver(receiver: Receiver) -> ThreadingHTTPServer:
    """Serve ``receiver`` on a free loopback port (its ``url`` is set); stop with ``shutdown()``."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length)
            receiver.received.append(
                Received({k.lower(): v for k, v in self.headers.items()}, body, self.path)
            )
            status = receiver.next_status()
            time.sleep(receiver.delay)
            payload = b"ok" if status < 300 else b"receiver says no"
            self.send_response(status)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: object) -> None:  # quiet
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/effect-ledger"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A loopback webhook receiver answering 200 unless the test changes ``statuses``."""
    found = Receiver()
    server = start_receiver(found)
    try:
        yield found
    finally:
        server.shutdown()
        server.server_close()
