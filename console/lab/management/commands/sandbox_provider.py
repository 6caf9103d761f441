"""``manage.py sandbox_provider``: run the sandbox provider HTTP process (see ``console.lab.sandbox_provider``)."""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from console.lab import enable_sandbox
from console.lab.sandbox_provider.database import prepare_default_database
from console.lab.sandbox_provider.events import check_secret
from console.lab.sandbox_provider.server import run_provider


def provider_dsn(explicit: str | None) -> str:
    """The database the provider keeps its data in: ``explicit`` (``--dsn``), else
    ``settings.SANDBOX_DATABASE_URL``, else ``<ledger database>_sandbox`` on the ledger's server
    (created when missing). Never the ledger's own database by default: restoring that must not
    roll the provider back.
    """
    if explicit:
        return explicit
    if settings.SANDBOX_DATABASE_URL:
        return str(settings.SANDBOX_DATABASE_URL)
    return prepare_default_database(connection.settings_dict)


class Command(BaseCommand):
    """Run the sandbox provider until SIGTERM or SIGINT.

    Prints exactly one line ``sandbox provider listening on http://HOST:PORT`` to stdout when it
    serves requests (``--port 0`` picks a free port and prints it).
    """

    help = "Run the sandbox provider: fake payments / email / reservations APIs with fault injection."

    def add_arguments(self, parser: CommandParser) -> None:
        """Declare ``--host``, ``--port``, ``--dsn``, ``--email-lag-seconds``, ``--events-url`` and
        ``--events-secret``."""
        parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
        parser.add_argument("--port", type=int, default=8765, help="port to listen on; 0 picks a free one")
        parser.add_argument(
            "--dsn",
            default=None,
            help="libpq DSN or URL of the provider's database (default: SANDBOX_DATABASE_URL, else "
            "<ledger database>_sandbox on the ledger's server, created when missing)",
        )
        parser.add_argument(
            "--email-lag-seconds",
            type=float,
            default=0.0,
            help="seconds before a sent email shows up in GET /v1/emails?message_id= (default 0)",
        )
        parser.add_argument(
            "--events-url",
            default=None,
            help="base URL the signed events go to, e.g. http://127.0.0.1:8000/providers/ (payments to "
            "BASE/sandbox-payments/events, ...); default SANDBOX_EVENTS_URL; empty: no events",
        )
        parser.add_argument(
            "--events-secret",
            default=None,
            help="Standard Webhooks secret (whsec_<base64>) events are signed with; default SANDBOX_EVENTS_SECRET",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        enable_sandbox()
        """Start the server, print the readiness line, block until a stop signal."""
        dsn = provider_dsn(options["dsn"])
        events_url = options["events_url"]
        events_url = str(settings.SANDBOX_EVENTS_URL or "") if events_url is None else events_url
        if events_url and not events_url.startswith(("http://", "https://")):
            raise CommandError(f"--events-url must be an http(s) URL, not {events_url!r}")
        try:
            events_secret = check_secret(options["events_secret"] or str(settings.SANDBOX_EVENTS_SECRET))
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        stop = threading.Event()

        def request_stop(signum: int, frame: FrameType | None) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)

        def announce(url: str) -> None:
            self.stdout.write(f"sandbox provider listening on {url}")
            self.stdout.flush()
            sys.stdout.flush()

        run_provider(
            host=options["host"],
            port=options["port"],
            dsn=dsn,
            email_lag_seconds=options["email_lag_seconds"],
            stop=stop,
            on_ready=announce,
            events_url=events_url,
            events_secret=events_secret,
        )
