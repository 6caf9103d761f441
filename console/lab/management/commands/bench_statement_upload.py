"""``manage.py bench_statement_upload``: time a CSV statement upload at the documented caps, the
upload request and the import task (issue 39 item 10; ``console.lab.bench.statement_upload``)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from console.lab import enable_sandbox
from reconciliation.statement_csv import MAX_LINES


class Command(BaseCommand):
    """Print the figures of a matched and an all-extra statement, on a scratch database."""

    help = "Time a statement upload and its background import (see docs/explanation/performance.md)."

    def add_arguments(self, parser: CommandParser) -> None:
        """``--lines`` (default 99,999), ``--database``, ``--keep``."""
        parser.add_argument(
            "--lines", type=int, default=MAX_LINES - 1, help="lines per statement (default 99,999)"
        )
        parser.add_argument(
            "--database",
            default="effect_ledger_bench_statements",
            help="the scratch database (dropped after)",
        )
        parser.add_argument("--keep", action="store_true", help="keep the scratch database")

    def handle(self, *args: Any, **options: Any) -> None:
        """Run the measurement and print its results as JSON."""
        enable_sandbox()
        from console.lab.bench.statement_upload import run_bench

        results = run_bench(lines=options["lines"], scratch=options["database"], keep=options["keep"])
        self.stdout.write(json.dumps(results, indent=2))
