"""``SmtpEmailAdapter``: one email per intent through an SMTP relay, classified by the table in
the package docstring (``operations.adapters.smtp``)."""

from __future__ import annotations

import hashlib
import re
import smtplib
import ssl
from contextlib import suppress
from email.message import EmailMessage
from email.parser import BytesParser
from email.policy import SMTP as SMTP_POLICY
from email.utils import format_datetime
from typing import Any, ClassVar

from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from operations.adapters import secrets
from operations.adapters.base import (
    Adapter,
    Capabilities,
    ExecutionCall,
    ExecutionResult,
    LookupKind,
    LookupResult,
    LookupStatus,
    Preview,
)
from operations.adapters.errors import (
    DEADLINE_EXCEEDED_CODE,
    AdapterError,
    AmbiguousOutcome,
    RetryableError,
    TerminalError,
)
from operations.adapters.events import message_id_for
from operations.adapters.smtp.config import ADDRESS, envelope_sender, unsafe_header
from operations.adapters.smtp.conversation import (
    Deadline,
    expect,
    local_hostname,
    queue_id,
    refused,
    reply_text,
)

#: How a message is written: CRLF line ends; 7-bit only (non-ASCII text is quoted-printable or
#: base64), so no server needs 8BITMIME (RFC 6152); lines up to RFC 5322's 998 characters
#: (§2.1.1), so the Message-ID that carries our key is never folded onto a second line.
MESSAGE_POLICY = SMTP_POLICY.clone(cte_type="7bit", max_line_length=998)


#: The headers whose values must read back exactly as we set them (``checked_bytes``).
READ_BACK_HEADERS = ("From", "To", "Subject", "Message-ID")


def checked_bytes(message: EmailMessage) -> bytes:
    """``message`` as it is sent (``MESSAGE_POLICY``), once it parses back as built: the same
    header names in the same order, From / To / Subject / Message-ID with the values we set,
    one text/plain part with our body. A header value that the email package writes as more
    than one field (CVE-2024-6923: an encoded word that decodes to CR LF, folded into real line
    breaks) fails this, whatever the check before building missed.

    Leading white space of a value and the line ends of the body are not compared: the wire
    format cannot carry the first (RFC 5322 §2.2.3, unfolding; the parser drops the space after
    the colon) and writes the second as CRLF (§2.1).

    Raises:
        TerminalError: ``unsafe_message``, naming what differs (not the values); nothing sent.
    """
    data = message.as_bytes(policy=MESSAGE_POLICY)
    parsed = BytesParser(policy=MESSAGE_POLICY).parsebytes(data)
    differs: list[str] = []
    if parsed.keys() != message.keys():
        differs.append(f"headers {parsed.keys()} instead of {message.keys()}"[:300])
    differs += [
        name
        for name in READ_BACK_HEADERS
        if str(parsed.get(name, "")).lstrip() != str(message.get(name, "")).lstrip()
    ]
    if parsed.is_multipart() or parsed.get_content_type() != "text/plain":
        differs.append(f"body of type {parsed.get_content_type()}")
    elif _lines(parsed.get_content()) != _lines(message.get_content()):
        differs.append("body")
    if differs:
        raise TerminalError(
            f"the message does not read back as built (header injection?): {'; '.join(differs)}; "
            "nothing sent",
            detail={"code": "unsafe_message"},
        )
    return data


def _lines(text: str) -> str:
    return text.replace("\r\n", "\n")


class SmtpEmailAdapter(Adapter):
    """Send one email per intent through a configured SMTP relay (``operations.adapters.smtp``).

    Use ``smtp_adapter(action)`` for an action's instance: each configured action gets its own
    subclass, built from its configuration.
    """

    action_name: ClassVar[str] = ""
    config: ClassVar[dict[str, Any]] = {}
    #: The configuration's ``test_mode``: this endpoint is a test relay.
    test_endpoint: ClassVar[bool] = False
    capabilities = Capabilities(idempotency_keys=False, lookup=LookupKind.NONE, compensation_action=None)
    money_fields: ClassVar[tuple[str, ...]] = ()

    def _timeout(self, call: ExecutionCall) -> float:
        configured = self.config.get("timeout_seconds")
        return min(call.deadline_seconds, float(configured)) if configured else call.deadline_seconds

    def preview(self, action: str, arguments: dict[str, Any]) -> Preview:
        """``Send email to X: subject``; nothing is sent."""
        return Preview(
            summary=f"Send email to {arguments.get('to')}: {arguments.get('subject')}",
            target=str(arguments.get("to", "")),
            scope=(
                f"one message through {self.config['host']}:{self.config['port']}; SMTP has no "
                "idempotency keys, so a re-send after an ambiguous answer may deliver it twice"
            ),
        )

    def lookup(self, call: ExecutionCall) -> LookupResult:
        """UNSUPPORTED: SMTP offers no way to ask whether a message was accepted."""
        return LookupResult(status=LookupStatus.UNSUPPORTED)

    def message(self, call: ExecutionCall) -> EmailMessage:
        """The message ``execute`` sends for ``call``: From (the configuration), To, Subject,
        Date, ``Message-ID: <KEY@effect-ledger.local>`` and the body as text/plain.

        Raises:
            TerminalError: ``to`` or ``subject`` holds "=?", a line break or another control
                character (``unsafe_header``, ``config.SAFE_HEADER``; the schema refuses them at
                submission already), or ``to`` is not one address (``invalid_address``).
        """
        to, subject = str(call.arguments.get("to", "")), str(call.arguments.get("subject", ""))
        for name, value in (("to", to), ("subject", subject)):
            if unsafe_header(value):
                raise TerminalError(
                    f'{name} holds "=?", a line break or a control character; nothing sent',
                    detail={"code": "unsafe_header", "field": name},
                )
        if not re.fullmatch(ADDRESS, to):
            raise TerminalError(f"not one address: {to[:100]!r}", detail={"code": "invalid_address"})
        message = EmailMessage(policy=MESSAGE_POLICY)
        message["From"] = self.config["from"]
        message["To"] = to
        message["Subject"] = subject
        message["Date"] = format_datetime(timezone.now())
        message["Message-ID"] = message_id_for(call.idempotency_key)
        message.set_content(str(call.arguments.get("body", "")))
        return message

    def _wire_message(self, call: ExecutionCall) -> tuple[EmailMessage, bytes]:
        """``message(call)`` and its bytes as they are sent (``checked_bytes``).

        Raises:
            TerminalError: by ``message`` and ``checked_bytes``; any other error while building
                the message (``unbuildable_message``): an exception raised before the
                connection is opened is a refusal, never an ambiguous outcome.
        """
        try:
            message = self.message(call)
            return message, checked_bytes(message)
        except AdapterError:
            raise
        except Exception as exc:
            raise TerminalError(
                f"the message could not be built ({type(exc).__name__}: {exc}); nothing sent"[:500],
                detail={"code": "unbuildable_message"},
            ) from exc

    def execute(self, call: ExecutionCall) -> ExecutionResult:
        """Send the message once: connect, EHLO, STARTTLS / AUTH as configured, MAIL, RCPT,
        DATA, the message, the final reply, within ``min(call.deadline_seconds,
        timeout_seconds)`` seconds. The message is built and checked (``checked_bytes``) before
        the connection is opened.

        Returns:
            ``ExecutionResult(provider_reference=the queue id in the 250 text, else our
            Message-ID; response_digest=sha256 hex of "<code> <text>"; detail={"reply_code",
            "message_id", "queue_id", "to"})``.

        Raises:
            RetryableError, TerminalError, AmbiguousOutcome: by the table in the package
                docstring (``operations.adapters.smtp``); before the connection is opened only
                ``TerminalError`` (the message) or ``RetryableError`` (a secret).
        """
        message, data = self._wire_message(call)
        to = str(call.arguments["to"])
        try:
            login = (
                (secrets.resolve(self.config["username"]), secrets.resolve(self.config["password"]))
                if "username" in self.config
                else None
            )
        except (secrets.SecretUnavailable, ImproperlyConfigured) as exc:
            raise RetryableError(f"{exc}; nothing sent", detail={"code": "secret_unavailable"}) from exc
        deadline = Deadline(self._timeout(call))
        client: smtplib.SMTP | None = None
        try:
            with deadline.watch():
                client = self._open(deadline, login)
                self._before_data(client, deadline, to)
                return self._send_data(client, deadline, message, data, to)
        finally:
            if client is not None:
                with suppress(Exception):
                    client.close()

    def _open(self, deadline: Deadline, login: tuple[str, str] | None) -> smtplib.SMTP:
        """Connect, greeting, EHLO (HELO), STARTTLS and AUTH: nothing is sent of the message."""
        host, port = self.config["host"], self.config["port"]
        context = ssl.create_default_context()
        try:
            timeout = max(deadline.remaining(), 0.001)
            # Connected by the constructor, which keeps the host name that TLS verifies the
            # certificate against (``connect`` alone does not); a greeting other than 220 raises
            # SMTPConnectError with its code.
            if self.config.get("ssl"):
                client: smtplib.SMTP = smtplib.SMTP_SSL(
                    host, port, local_hostname=local_hostname(), timeout=timeout, context=context
                )
            else:
                client = smtplib.SMTP(host, port, local_hostname=local_hostname(), timeout=timeout)
            deadline.arm(client)
            self._hello(client)
            if self.config.get("starttls"):
                deadline.arm(client)
                try:
                    client.starttls(context=context)
                except smtplib.SMTPNotSupportedError as exc:
                    raise RetryableError(
                        f"{host}:{port} does not offer STARTTLS; nothing sent in the clear",
                        detail={"code": "not_offered", "step": "STARTTLS"},
                    ) from exc
                except smtplib.SMTPResponseException as exc:
                    raise refused("STARTTLS", exc.smtp_code, exc.smtp_error) from exc
                deadline.arm(client)  # the TLS socket
                self._hello(client)
            if login is not None:
                if not client.has_extn("auth"):
                    raise RetryableError(
                        f"{host}:{port} does not offer AUTH; nothing sent",
                        detail={"code": "not_offered", "step": "AUTH"},
                    )
                deadline.arm(client)
                try:
                    client.login(*login)
                except smtplib.SMTPAuthenticationError as exc:
                    raise refused("AUTH", exc.smtp_code, exc.smtp_error) from exc
            return client
        except AdapterError:
            raise
        except smtplib.SMTPResponseException as exc:
            raise refused("greeting", exc.smtp_code, exc.smtp_error) from exc
        except (OSError, smtplib.SMTPException) as exc:
            raise self._not_sent(deadline, exc) from exc

    def _hello(self, client: smtplib.SMTP) -> None:
        code, reply = client.ehlo()
        if not 200 <= code < 300:
            code, reply = client.helo()
        expect("EHLO", (code, reply))

    def _not_sent(self, deadline: Deadline, exc: BaseException) -> RetryableError:
        where = f"{self.config['host']}:{self.config['port']}"
        if deadline.passed(exc):
            return RetryableError(
                f"SMTP {where}: the {deadline.seconds:.1f} s deadline passed before the message was sent",
                detail={"code": "deadline_before_send"},
            )
        return RetryableError(f"SMTP {where}: not sent ({exc!r})"[:500], detail={"code": "not_sent"})

    def _before_data(self, client: smtplib.SMTP, deadline: Deadline, to: str) -> None:
        """MAIL, RCPT, and DATA up to its 354: the server has no message yet."""
        try:
            deadline.arm(client)
            expect("MAIL", client.mail(envelope_sender(self.config["from"])))
            deadline.arm(client)
            expect("RCPT", client.rcpt(to))
            deadline.arm(client)
            expect("DATA", client.docmd("DATA"), range(354, 355))
        except AdapterError:
            raise
        except (OSError, smtplib.SMTPException) as exc:
            raise self._not_sent(deadline, exc) from exc

    def _send_data(
        self, client: smtplib.SMTP, deadline: Deadline, message: EmailMessage, data: bytes, to: str
    ) -> ExecutionResult:
        """Past the commit point: the message (``data``, ``checked_bytes``) and the final reply
        (RFC 5321 §4.1.1.4)."""
        data = re.sub(rb"(?m)^\.", b"..", data)
        if not data.endswith(b"\r\n"):
            data += b"\r\n"
        where = f"{self.config['host']}:{self.config['port']}"
        try:
            deadline.arm(client)
        except TimeoutError as exc:  # no time left: the server has the DATA command, not the message
            raise self._not_sent(deadline, exc) from exc
        try:
            client.send(data + b".\r\n")
            code, reply = client.getreply()
        except (OSError, smtplib.SMTPException) as exc:
            if deadline.passed(exc):
                raise AmbiguousOutcome(
                    f"SMTP {where}: no final reply within the {deadline.seconds:.1f} s deadline after the "
                    "message was sent; it may have been accepted",
                    detail={"code": DEADLINE_EXCEEDED_CODE},
                ) from exc
            raise AmbiguousOutcome(
                f"SMTP {where}: the connection dropped after the message was sent, before the final "
                f"reply; it may have been accepted ({exc!r})"[:500],
                detail={"code": "connection_dropped"},
            ) from exc
        text = reply_text(reply)
        if code == -1:
            raise AmbiguousOutcome(
                f"SMTP {where}: unreadable final reply {text[:100]!r}", detail={"code": "unreadable_reply"}
            )
        if 400 <= code < 600:
            raise refused("message", code, reply)
        if not 200 <= code < 300:
            raise AmbiguousOutcome(
                f"SMTP {where}: unexpected final reply {code} {text[:100]}",
                detail={"code": "unexpected_reply", "reply_code": code},
            )
        with suppress(Exception):
            client.quit()
        message_id, queued = str(message["Message-ID"]), queue_id(text)
        return ExecutionResult(
            provider_reference=queued or message_id,
            response_digest=hashlib.sha256(f"{code} {text}".encode()).hexdigest(),
            detail={"reply_code": code, "message_id": message_id, "queue_id": queued, "to": to},
        )
