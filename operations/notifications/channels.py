"""Where a notice message goes: email through Django's email framework (``EMAIL_BACKEND``; the
console backend unless configured) and a Slack-compatible incoming webhook (an HTTP POST of
``{"text": ...}``, Slack's documented minimal payload, which Mattermost, Rocket.Chat and others
accept too). Called outside any transaction; an error is raised to the caller, who retries.
"""

from __future__ import annotations

import httpx
from django.conf import settings
from django.core.mail import EmailMessage


def send_email(*, address: str, subject: str, body: str) -> None:
    """Send one plain-text email to ``address`` from ``DEFAULT_FROM_EMAIL``.

    Raises:
        whatever the backend raises (``smtplib.SMTPException``, ``OSError`` for SMTP).
    """
    EmailMessage(subject=subject, body=body, from_email=settings.DEFAULT_FROM_EMAIL, to=[address]).send()


def slack_text(text: str) -> str:
    """``text`` (plain text) as Slack message text: ``&``, ``<`` and ``>`` replaced by ``&amp;``,
    ``&lt;`` and ``&gt;``, and nothing else, as Slack's message formatting reference asks
    ("Escaping text": they are its control characters, the marks of ``<url|label>`` links and
    ``<!here>`` mentions; other characters are not decoded). What is left is text and the bare
    URLs Slack links by itself (in a notice only ours: ``operations.notifications.quoting``)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def send_slack(*, url: str, text: str) -> None:
    """POST ``{"text": slack_text(text)}`` to the incoming-webhook ``url`` (``text`` is plain
    text: nothing in it is markup); any answer but 2xx is a failure.

    The whole exchange is bounded by ``EFFECT_LEDGER["NOTIFY_SEND_TIMEOUT_SECONDS"]`` per phase
    (connect, write, read), so a stuck receiver costs the sender seconds, not its lease.

    Raises:
        httpx.HTTPError: no answer in time, a refused connection, or a non-2xx status.
    """
    timeout = float(settings.EFFECT_LEDGER["NOTIFY_SEND_TIMEOUT_SECONDS"])
    response = httpx.post(
        url, json={"text": slack_text(text)}, timeout=httpx.Timeout(timeout), follow_redirects=False
    )
    response.raise_for_status()
