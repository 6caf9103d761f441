"""``manage.py create_user NAME --role ROLE [--role ROLE ...] (--tenant T [--tenant T ...] |
--all-tenants)``: a console account holding its roles on those tenants or on every tenant.

Prints a generated password once, or reads one line from stdin with ``--password-stdin``.
``--email`` gives the account the address its notices go to (docs/reference/console.md, "Notifications to approvers and operators").
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
        where = parser.add_mutually_exclusive_group(required=True)
        where.add_argument(
            "--tenant",
            action="append",
            default=[],
            help="a tenant the roles hold on; repeat for several",
        )
        where.add_argument(
            "--all-tenants", action="store_true", help="the roles hold on every tenant, present and future"
        )
        parser.add_argument(
            "--email",
            default="",
            help="the address the account's notices (approvals, escalations) are emailed to",
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
                tenants=options["tenant"],
                all_tenants=options["all_tenants"],
                password=password,
                django_admin=options["django_admin"],
                email=options["email"],
            )
        except AccountError as exc:
            raise CommandError(str(exc)) from exc
        roles = ", ".join(dict.fromkeys(options["role"]))
        where = "every tenant" if options["all_tenants"] else ", ".join(dict.fromkeys(options["tenant"]))
        self.stdout.write(f"user {user.username} with role(s) {roles} on {where}")
        if not options["password_stdin"]:
            self.stdout.write(f"password: {password}  (shown once)")
