"""The email backend of a machine that sends no email (the default ``EMAIL_BACKEND``, so the
quick start's): each message printed on the process's terminal as a person reads an email.

Django's console backend prints the MIME message (eight header lines before the text) on
``sys.stdout``; in a Celery worker, which sends the notices, ``sys.stdout`` is Celery's logging
proxy, so the whole email became one WARNING log line of escaped JSON in a terminal scrolling
with the beat's lines (issue 39, item 7). This one writes to the process's own standard output
(``sys.__stdout__``, which Celery leaves alone) a framed block: who it is to, the subject, the
text with its link.
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.mail import EmailMessage
from django.core.mail.backends.console import EmailBackend as DjangoConsoleBackend

RULE_WIDTH = 79


def _original_stdout() -> Any:
    return sys.__stdout__ if sys.__stdout__ is not None else sys.stdout


class TerminalEmailBackend(DjangoConsoleBackend):
    """Print each message as plain text, one write per message (so two threads' messages do not
    interleave line by line)::

        ----- email to operator@localhost ---------------------------------------------
        From: Effect Ledger <effect-ledger@localhost>
        Subject: [Effect Ledger] Approval requested: payments.charge v1

        Approval requested: http://127.0.0.1:8000/approvals/0b6e.../
          Action: payments.charge v1
        ...
        -------------------------------------------------------------------------------

    ``stream`` (a keyword argument, as Django's console backend takes it) overrides where it
    goes; by default the process's original standard output. Attachments and HTML alternatives
    are named, not printed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("stream", _original_stdout())
        super().__init__(*args, **kwargs)

    def write_message(self, message: EmailMessage) -> None:
        """Write ``message`` (Django's ``EmailMessage``) as the framed block above."""
        head = f"----- email to {', '.join(message.recipients())} "
        extras = [
            f"({len(message.attachments)} attachment(s) not shown)" if message.attachments else "",
            "(an HTML version not shown)" if getattr(message, "alternatives", None) else "",
        ]
        body = str(message.body).rstrip("\n")
        self.stream.write(
            f"{head}{'-' * max(3, RULE_WIDTH - len(head))}\n"
            f"From: {message.from_email}\n"
            f"Subject: {message.subject}\n\n"
            f"{body}\n" + "".join(f"{extra}\n" for extra in extras if extra) + f"{'-' * RULE_WIDTH}\n"
        )
