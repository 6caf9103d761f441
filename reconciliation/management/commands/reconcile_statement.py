"""``manage.py reconcile_statement --adapter SOURCE --date YYYY-MM-DD``: fetch a statement
source's statement of one day from its provider and reconcile it now (two-way: every SUCCEEDED
intent has its line, every line belongs to one intent; ``reconciliation.statements``). The date
is ``YYYY-MM-DD`` only and at most today (UTC); a refused one stores nothing."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from reconciliation.statement_sources import StatementRefused, statement_day
from reconciliation.statements import fetch_and_run


class Command(BaseCommand):
    help = "Reconcile a statement source's statement of one day (UTC) with the ledger's intents."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--adapter", required=True, help="the statement source, e.g. sandbox-payments")
        parser.add_argument("--date", required=True, help="the statement's day, YYYY-MM-DD (UTC)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            day = statement_day(options["date"])
        except ValueError as exc:
            if "after today" in str(exc):
                raise CommandError(f"--date {exc}") from exc
            raise CommandError(f"--date {options['date'][:40]!r} is not a date: use YYYY-MM-DD") from exc
        try:
            run = fetch_and_run(source=options["adapter"], day=day, actor="command:reconcile_statement")
        except StatementRefused as exc:
            raise CommandError(str(exc)) from exc
        if run.error:
            raise CommandError(f"statement run {run.id} of {run.source} for {day} failed: {run.error}")
        self.stdout.write(
            f"statement run {run.id} of {run.source} for {day}: {run.lines} lines, {run.matched} matched, "
            f"{run.missing_at_provider} missing at the provider, {run.extra_at_provider} extra at the provider, "
            f"{run.amount_mismatches} amount mismatches"
        )
