"""An SMTP email adapter: one message per intent through a mail relay (issue 33, case C25).

Configured per action in ``settings.EFFECT_LEDGER_SMTP``::

    EFFECT_LEDGER_SMTP = {
        "mail.notify": {
            "host": "smtp.example.com",             # required
            "port": 587,                            # required, 1-65535
            "from": "Ledger <ledger@example.com>",  # required: the From header; its address
                                                    # is the envelope sender (MAIL FROM)
            "starttls": True,                       # optional (default False): STARTTLS, RFC 3207
            "ssl": False,                           # optional (default False): implicit TLS (465)
            "username": "env:SMTP_USER",            # optional, with password: AUTH (RFC 4954),
            "password": "file:/run/secrets/smtp",   # named secrets, never written here (secrets.py)
            "timeout_seconds": 10,                  # optional: caps call.deadline_seconds
            "test_mode": False,                     # optional: marks a test endpoint
        },
    }

The arguments are ``{"to", "subject", "body", "reference"}`` (``EMAIL_SCHEMA``). Header
injection is refused three times: ``to`` and ``subject`` may hold no line break (CR, LF, VT,
FF, NEL, LS, PS...), no other control character and no ``=?`` (an RFC 2047 encoded word, which
Python before 3.11.10 / 3.12.5 can fold into real line breaks: CVE-2024-6923), at submission
(the schema: 422) and again before connecting; and the message, serialised as it is sent, must
parse back with the headers and body we set (``adapter.checked_bytes``). The message carries our idempotency key in its ``Message-ID``
(``<KEY@effect-ledger.local>``, ``events.message_id_for``), so whoever finds a copy in a
mailbox can tell which intent sent it.

The contract: SMTP has no idempotency keys and no lookup (``Capabilities(idempotency_keys=
False, lookup=LookupKind.NONE)``): absence is never proof, nothing is ever sent again after an
ambiguous answer without a person's ``absent`` and its duplicate-risk acknowledgement, and a
sent email cannot be undone (no compensation).

Classification. The commit point is the server's final reply to the message data: a server
that has received the whole message may deliver it even when its reply never reaches us
(RFC 5321 §4.1.1.4, DATA: the receiver takes responsibility when it sends the final 250; the
data ends with ``<CRLF>.<CRLF>``; §6.1 names the duplicate a lost OK causes). Reply codes by class (RFC 5321 §4.2.1): 2yz done, 4yz
transient ("the request may be repeated"), 5yz permanent ("the client SHOULD NOT repeat the
exact request"). The whole call runs within ``min(call.deadline_seconds, timeout_seconds)``:
each step's socket timeout is the time left, and a watchdog shuts the socket down when it
runs out.

=========================================  ===============================================
where / what                               raised
=========================================  ===============================================
an unsafe ``to`` / ``subject``, a message   ``TerminalError`` (``unsafe_header``,
that does not parse back as built, any     ``unsafe_message``, ``unbuildable_message``),
other error while building it              nothing sent, no connection opened
a named secret cannot be read              ``RetryableError`` (``secret_unavailable``),
                                           nothing sent, no connection opened
connect refused or failed, TLS failed,     ``RetryableError`` (``not_sent``; the deadline
connection dropped or timed out before     before the body: ``deadline_before_send``)
the DATA command's 354
greeting, EHLO/HELO, STARTTLS, AUTH,       4yz: ``RetryableError`` (``smtp_deferred``);
MAIL, RCPT, DATA (before 354) refused      5yz (535 on AUTH too): ``TerminalError``
                                           (``smtp_refused``); any other code:
                                           ``RetryableError`` (``unexpected_reply``)
STARTTLS or AUTH not offered by the        ``RetryableError`` (``not_offered``), nothing
server                                     sent in the clear
after 354, while sending the message or    ``AmbiguousOutcome``: ``deadline_exceeded``
waiting for the final reply: the           (``errors.DEADLINE_EXCEEDED_CODE``) when the
deadline passed, the connection dropped,   deadline passed, else ``connection_dropped``
the reply was unreadable                   (``unreadable_reply`` for a garbled reply)
final reply 2yz                            ``ExecutionResult`` (below)
final reply 4yz / 5yz                      ``RetryableError`` / ``TerminalError``
final reply of another class               ``AmbiguousOutcome`` (``unexpected_reply``)
=========================================  ===============================================

A success records ``provider_reference`` = the queue id the server named in its 250 text
(Postfix ``queued as ID``, Exim ``id=ID``, Sendmail ``ID Message accepted for delivery``),
else our Message-ID; ``response_digest`` = sha256 of ``"<code> <text>"``.
"""

from __future__ import annotations

import json
from functools import cache

from operations.adapters.smtp.adapter import SmtpEmailAdapter
from operations.adapters.smtp.config import EMAIL_SCHEMA, smtp_config
from operations.adapters.smtp.conversation import queue_id

__all__ = ["EMAIL_SCHEMA", "SmtpEmailAdapter", "queue_id", "smtp_adapter", "smtp_config"]


@cache
def _adapter_for(action: str, config_json: str) -> SmtpEmailAdapter:
    config = json.loads(config_json)
    cls = type(
        f"SmtpEmailAdapter[{action}]",
        (SmtpEmailAdapter,),
        {
            "__doc__": f"SMTP email adapter for {action} ({config['host']}:{config['port']}).",
            "action_name": action,
            "actions": (action,),
            "config": config,
            "test_endpoint": bool(config.get("test_mode", False)),
            "argument_schemas": {action: EMAIL_SCHEMA},
            "versions": {action: (1,)},
            "target_fields": {action: "to"},
        },
    )
    adapter: SmtpEmailAdapter = cls()
    return adapter


def smtp_adapter(action: str) -> SmtpEmailAdapter | None:
    """Return the adapter instance for ``action`` from ``EFFECT_LEDGER_SMTP``, or ``None`` when
    the action is not configured there. Instances are cached per configuration, so a changed
    setting (e.g. in a test) yields a new instance.

    Raises:
        ImproperlyConfigured: the setting is malformed (``smtp_config``).
    """
    config = smtp_config().get(action)
    if config is None:
        return None
    return _adapter_for(action, json.dumps(config, sort_keys=True))
