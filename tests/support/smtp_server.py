"""A real SMTP server on loopback for the SMTP adapter's tests: aiosmtpd (PyPI), in a thread of
the test process, with a handler that records every message it receives and injects faults.

Faults (``MailHandler`` attributes, changed between calls):

* ``mail_reply`` / ``rcpt_reply``: a reply to MAIL / RCPT instead of ``250 OK``.
* ``data_command_reply``: a reply to the DATA command instead of its ``354`` (nothing received).
* ``after_data``: what happens once the whole message is received (it is recorded first):
  ``"reply"`` (``data_reply``, by default ``250 2.0.0 Ok: queued as Q<n>``), ``"drop"`` (the
  connection is closed before any reply) or ``"stall"`` (no reply for ``stall_seconds``).
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import EmailMessage
from email.policy import default
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on (now)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Received:
    """One message the server received in full (whatever it answered)."""

    mail_from: str
    rcpt_tos: list[str]
    content: bytes

    @property
    def message(self) -> EmailMessage:
        parsed = message_from_bytes(self.content, policy=default)
        assert isinstance(parsed, EmailMessage)
        return parsed


@dataclass
class MailHandler:
    """The aiosmtpd handler: records messages, replies as told (module docstring)."""

    mail_reply: str = ""
    rcpt_reply: str = ""
    data_command_reply: str = ""
    after_data: str = "reply"
    data_reply: str = ""
    stall_seconds: float = 5.0
    received: list[Received] = field(default_factory=list)
    connections: int = 0

    async def handle_EHLO(  # noqa: N802 - aiosmtpd's hook name
        self, server: SMTP, session: Session, envelope: Envelope, hostname: str, responses: list[str]
    ) -> list[str]:
        self.connections += 1
        session.host_name = hostname
        return responses

    async def handle_MAIL(  # noqa: N802
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        if self.mail_reply:
            return self.mail_reply
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 OK"

    async def handle_RCPT(  # noqa: N802
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        if self.rcpt_reply:
            return self.rcpt_reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:  # noqa: N802
        content = envelope.original_content or b""
        self.received.append(Received(str(envelope.mail_from), list(envelope.rcpt_tos), content))
        if self.after_data == "drop":
            assert server.transport is not None
            server.transport.close()
            return "250 OK (never sent: the connection is closed)"
        if self.after_data == "stall":
            await asyncio.sleep(self.stall_seconds)
        return self.data_reply or f"250 2.0.0 Ok: queued as Q{len(self.received)}"


class _FaultySMTP(SMTP):
    """aiosmtpd's SMTP session, with the DATA command refusable before its 354."""

    async def smtp_DATA(self, arg: str) -> None:  # noqa: N802
        refusal = getattr(self.event_handler, "data_command_reply", "")
        if refusal and self.envelope is not None and self.envelope.rcpt_tos:
            await self.push(refusal)
            return
        await super().smtp_DATA(arg)


class _Controller(Controller):
    def factory(self) -> SMTP:
        return _FaultySMTP(self.handler, **self.SMTP_kwargs)


@dataclass
class MailServer:
    """A running server: ``port``, its ``handler`` (faults and ``received``)."""

    port: int
    handler: MailHandler

    @property
    def received(self) -> list[Received]:
        return self.handler.received

    def entry(self, **overrides: Any) -> dict[str, Any]:
        """An ``EFFECT_LEDGER_SMTP`` entry for this server."""
        return {"host": "127.0.0.1", "port": self.port, "from": "Ledger <ledger@example.test>", **overrides}


def _authenticator(users: dict[str, str]) -> Any:
    def authenticate(
        server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        # handled=False: aiosmtpd answers a refusal itself (535 5.7.8)
        if isinstance(data, LoginPassword):
            login, password = data.login.decode(), data.password.decode()
            return AuthResult(success=users.get(login) == password, handled=False)
        return AuthResult(success=False, handled=False)

    return authenticate


def self_signed_context(folder: Any) -> ssl.SSLContext:
    """A server TLS context with a fresh self-signed certificate for 127.0.0.1 (written under
    ``folder``): one no client trusts by default."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "smtp-cert.pem", folder / "smtp-key.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return context


@contextmanager
def running_mail_server(
    *,
    users: dict[str, str] | None = None,
    starttls: ssl.SSLContext | None = None,
    tls: ssl.SSLContext | None = None,
) -> Iterator[MailServer]:
    """Start an aiosmtpd server on 127.0.0.1; stop it on exit. ``users`` (login -> password):
    AUTH offered in the clear; ``starttls``: STARTTLS offered with this context; ``tls``:
    implicit TLS (RFC 8314) with this context."""
    handler = MailHandler()
    options: dict[str, Any] = {}
    if users is not None:
        options = {"authenticator": _authenticator(users), "auth_require_tls": False}
    if starttls is not None:
        options["tls_context"] = starttls
    if tls is not None:
        options["ssl_context"] = tls
    controller = _Controller(handler, hostname="127.0.0.1", port=free_port(), **options)
    controller.start()
    try:
        yield MailServer(port=controller.port, handler=handler)
    finally:
        controller.stop()
