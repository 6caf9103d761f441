"""The SMTP conversation's helpers: the call's deadline and its watchdog, what a reply code
means before the message data (RFC 5321 §4.2.1), and the queue id in a final reply."""

from __future__ import annotations

import re
import smtplib
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import cache

from operations.adapters.errors import AdapterError, RetryableError, TerminalError

#: Queue ids in a 250 reply's text: Postfix, Exim, Sendmail.
_QUEUE_IDS = (
    re.compile(r"queued as ([A-Za-z0-9._:+/=-]{1,100})", re.IGNORECASE),
    re.compile(r"\bid=([A-Za-z0-9._-]{1,100})"),
    re.compile(
        r"^(?:\d\.\d{1,3}\.\d{1,3} )?([A-Za-z0-9]{6,40}) Message accepted for delivery", re.IGNORECASE
    ),
)


class Deadline:
    """The call's wall clock (``seconds`` from now, monotonic) and the watchdog that shuts the
    socket down when it runs out: a socket timeout bounds one read, not a server that trickles
    its reply a byte at a time (the same rule as ``http_support``'s deadline)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.ends_at = time.monotonic() + seconds
        self.expired = False
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()

    def remaining(self) -> float:
        """Seconds left (negative once passed)."""
        return self.ends_at - time.monotonic()

    def arm(self, client: smtplib.SMTP) -> None:
        """Before a step: remember the socket, and give it the time left (none left: raise)."""
        if self.remaining() <= 0:
            self.expired = True
            raise TimeoutError("the call's deadline passed")
        sock = client.sock
        if sock is not None:
            with self._lock:
                self._socket = sock
            sock.settimeout(self.remaining())

    def _fire(self) -> None:
        with self._lock:
            self.expired = True
            sock = self._socket
        if sock is not None:
            # socket.socket.shutdown, not SSLSocket.shutdown: wakes a blocked read at once.
            with suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    @contextmanager
    def watch(self) -> Iterator[None]:
        """Run the body under the watchdog: at the deadline the armed socket is shut down."""
        timer = threading.Timer(max(0.0, self.remaining()), self._fire)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def passed(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the deadline's doing (the watchdog, a socket timeout, no time left)."""
        cause: BaseException | None = exc
        while cause is not None:
            if isinstance(cause, TimeoutError):
                return True
            cause = cause.__cause__ or cause.__context__
        return self.expired or self.remaining() <= 0


def reply_text(reply: bytes | str) -> str:
    """A reply's text as ``str`` (smtplib gives bytes; undecodable bytes replaced)."""
    return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)


def refused(step: str, code: int, reply: bytes | str) -> AdapterError:
    """A negative reply before the message data: 4yz retryable, 5yz terminal (RFC 5321 §4.2.1);
    any other code is not what the step expects, and nothing was sent: retryable."""
    text = reply_text(reply)[:200]
    detail = {"step": step, "reply_code": code, "reply": text}
    if 400 <= code < 500:
        return RetryableError(f"SMTP {step}: {code} {text}", detail={"code": "smtp_deferred", **detail})
    if 500 <= code < 600:
        return TerminalError(f"SMTP {step}: {code} {text}", detail={"code": "smtp_refused", **detail})
    return RetryableError(
        f"SMTP {step}: unexpected {code} {text}", detail={"code": "unexpected_reply", **detail}
    )


def expect(step: str, answer: tuple[int, bytes], wanted: range = range(200, 300)) -> None:
    """Go on when ``answer`` (``(code, text)``) has a code in ``wanted`` (default 2yz).

    Raises:
        RetryableError, TerminalError: ``refused(step, code, text)``.
    """
    code, reply = answer
    if code not in wanted:
        raise refused(step, code, reply)


def queue_id(reply: str) -> str:
    """The queue id a server names in its final 250 text, or "": Postfix ``queued as ID``,
    Exim ``id=ID``, Sendmail ``ID Message accepted for delivery``."""
    for pattern in _QUEUE_IDS:
        match = pattern.search(reply)
        if match:
            return match.group(1)
    return ""


@cache
def local_hostname() -> str:
    """The name we give in EHLO (RFC 5321 §4.1.1.1), looked up once per process."""
    return socket.getfqdn()
