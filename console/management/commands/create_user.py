"""``manage.py create_user NAME --role ROLE [--role ROLE ...]``: a console account.

Prints a generated password once, or reads one line from stdin with ``--password-stdin``.
``--django-admin`` makes a separate account for the Django admin site (staff and superuser).
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.accounts import AccountError, console_user_create
from console.permissions import ROLES


class Command(BaseCommand):
    help = "Create a console user with one or more roles and print its password once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument(
            "--role",
            action="append",
            default=[],
            choices=ROLES,
            help="viewer, approver, operator or admin; repeat for several",
        )
        parser.add_argument(
            "--password-stdin", action="store_true", help="read the password from the first line of stdin"
        )
        parser.add_argument(
            "--django-admin",
            action="store_true",
            help="also staff and superuser: signs in to /admin/ (keep it a separate account)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        password = None
        if options["password_stdin"]:
            password = sys.stdin.readline().rstrip("\r\n")
            if not password:
                raise CommandError("--password-stdin: stdin gave an empty line")
        try:
            user, password = console_user_create(
                username=options["name"],
                roles=options["role"],
                password=password,
                django_admin=options["django_admin"],
            )
        except AccountError as exc:
            raise CommandError(str(exc)) from exc
        roles = ", ".join(dict.fromkeys(options["role"]))
        self.stdout.write(f"user {user.username} with role(s) {roles}")
        if not options["password_stdin"]:
            self.stdout.write(f"password: {password}  (shown once)")
