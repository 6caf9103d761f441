"""``manage.py create_agent NAME --tenant T``: mint an agent and print its token once."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import IntegrityError

from operations.authentication import agent_create


class Command(BaseCommand):
    help = "Create an agent principal for a tenant and print its API token (shown once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--tenant", required=True)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            agent, token = agent_create(name=options["name"], tenant=options["tenant"])
        except IntegrityError as exc:
            raise CommandError(
                f"agent {options['name']!r} already exists in tenant {options['tenant']!r}"
            ) from exc
        self.stdout.write(f"agent {agent.principal} in tenant {agent.tenant}")
        self.stdout.write(f"token: {token}")
