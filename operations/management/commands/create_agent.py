"""``manage.py create_agent NAME --tenant T [--actions 'payments.*,email.send'] [--scope own|tenant]
[--expires-in SECONDS | --expires-in-days DAYS]``: mint an agent and print its token once."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import IntegrityError

from operations.access.scopes import action_patterns_parse
from operations.api.authentication import TOKEN_LIFETIME_MAX, agent_create, duration_problem
from operations.models import Agent


def duration_of(flag: str, value: float, unit_seconds: float = 1.0) -> timedelta:
    """``value`` units of ``unit_seconds`` seconds given as ``flag``, as a duration.

    Raises:
        CommandError: not a finite number, or longer than ``TOKEN_LIFETIME_MAX`` (checked before
            any ``timedelta`` is built, which would overflow).
    """
    seconds = value * unit_seconds
    if not math.isfinite(seconds) or abs(seconds) > TOKEN_LIFETIME_MAX.total_seconds():
        raise CommandError(f"{flag} must be a number of at most {TOKEN_LIFETIME_MAX.days} days")
    return timedelta(seconds=seconds)


def token_lifetime(options: dict[str, Any]) -> timedelta | None:
    """``--expires-in`` seconds or ``--expires-in-days`` days as a duration; None: never.

    Raises:
        CommandError: both given, or one that is not positive, not finite or longer than
            ``TOKEN_LIFETIME_MAX`` (the rule is ``authentication.duration_problem``).
    """
    seconds, days = options.get("expires_in"), options.get("expires_in_days")
    if seconds is not None and days is not None:
        raise CommandError("give --expires-in or --expires-in-days, not both")
    lifetime = None
    if seconds is not None:
        lifetime = duration_of("--expires-in", seconds)
    if days is not None:
        lifetime = duration_of("--expires-in-days", days, 86_400)
    if problem := duration_problem("a token's lifetime", lifetime):
        raise CommandError(problem)
    return lifetime


def add_lifetime_arguments(parser: CommandParser, what: str) -> None:
    """``--expires-in SECONDS`` and ``--expires-in-days DAYS`` (mutually exclusive)."""
    parser.add_argument("--expires-in", type=float, metavar="SECONDS", help=f"{what} expires after this long")
    parser.add_argument(
        "--expires-in-days", type=float, metavar="DAYS", help=f"{what} expires after this many days"
    )


class Command(BaseCommand):
    help = "Create an agent principal for a tenant and print its API token (shown once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--tenant", required=True)
        parser.add_argument(
            "--actions",
            default="*",
            help="comma-separated action patterns it may submit: 'payments.*,email.send' "
            "(default '*': every action, as before scopes existed; name only what it needs)",
        )
        parser.add_argument(
            "--scope",
            choices=[choice.value for choice in Agent.Scope],
            default=Agent.Scope.OWN.value,
            help="which intents it reads, lists and cancels: 'own' (default) or its whole 'tenant''s",
        )
        add_lifetime_arguments(parser, "the token")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            actions = action_patterns_parse(options["actions"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        lifetime = token_lifetime(options)
        try:
            agent, token = agent_create(
                name=options["name"],
                tenant=options["tenant"],
                actions=actions,
                scope=options["scope"],
                expires_in=lifetime,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        except IntegrityError as exc:
            raise CommandError(
                f"agent {options['name']!r} already exists in tenant {options['tenant']!r}"
            ) from exc
        self.stdout.write(f"agent {agent.principal} in tenant {agent.tenant}")
        self.stdout.write(f"actions: {', '.join(actions) or 'none'}; scope: {agent.scope}")
        expires = agent.tokens.get().expires_at
        self.stdout.write(f"expires: {expires.isoformat() if expires else 'never'}")
        self.stdout.write(f"token: {token}")
