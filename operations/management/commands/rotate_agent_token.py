"""``manage.py rotate_agent_token NAME --tenant T [--keep-old-for SECONDS] [--expires-in SECONDS]``:
mint a new token for an agent, print it once, and let the old ones run out after the overlap."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from operations.api.authentication import agent_token_rotate
from operations.management.commands.create_agent import add_lifetime_arguments, duration_of, token_lifetime
from operations.models import Agent

#: Default overlap: both tokens are valid this long, time to roll the new one out.
KEEP_OLD_SECONDS = 3600


class Command(BaseCommand):
    help = (
        "Mint a new API token for an agent (printed once); its old tokens stay valid for "
        "--keep-old-for seconds (default 3600; 0 revokes them now), then are refused."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--tenant", required=True)
        parser.add_argument("--keep-old-for", type=float, default=KEEP_OLD_SECONDS, metavar="SECONDS")
        add_lifetime_arguments(parser, "the new token")

    def handle(self, *args: Any, **options: Any) -> None:
        agent = Agent.objects.filter(name=options["name"], tenant=options["tenant"]).first()
        if agent is None:
            raise CommandError(f"no agent {options['name']!r} in tenant {options['tenant']!r}")
        keep_old_for = duration_of("--keep-old-for", options["keep_old_for"])
        try:
            row, token = agent_token_rotate(
                agent=agent, keep_old_for=keep_old_for, expires_in=token_lifetime(options)
            )
        except ValueError as exc:
            raise CommandError(str(exc).replace("keep_old_for", "--keep-old-for")) from exc
        kept = options["keep_old_for"]
        cached = float(settings.EFFECT_LEDGER["TOKEN_CACHE_SECONDS"])
        if 0 < kept < cached or (kept == 0 and cached > 0):
            # a web process that verified an old token keeps it this long (authentication.py)
            self.stderr.write(f"note: web processes may accept an old token up to {cached:g} s after it ends")
        self.stdout.write(f"new token for {agent.principal} in tenant {agent.tenant}")
        self.stdout.write(
            f"old tokens: valid {kept:g} s more, then refused" if kept else "old tokens: revoked now"
        )
        self.stdout.write(f"expires: {row.expires_at.isoformat() if row.expires_at else 'never'}")
        self.stdout.write(f"token: {token}")
