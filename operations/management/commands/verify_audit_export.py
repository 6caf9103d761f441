"""``manage.py verify_audit_export FILE [--complete]``: re-check a JSON Lines audit export away
from the database; exit 0 when every event's hash matches its content and its chain links
(saying how many events and chains, and how many chains start after their first event), 1
naming each break (at most 50), 2 when the file cannot be read as an export or holds no event.
The newest events of a chain, or whole chains, removed from an export cannot be seen here:
``verify_audit`` against a signed checkpoint sees them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from operations.audit.chain_checks import verify_export

MAX_REPORTED = 50


class Command(BaseCommand):
    help = "Verify the hashes and links of a JSON Lines audit export (/audit/export.jsonl)."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path, help="a file saved from /audit/export.jsonl")
        parser.add_argument(
            "--complete",
            action="store_true",
            help="the export is unfiltered: every chain must start at its first event (seq 1)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["file"]
        try:
            with path.open(encoding="utf-8") as lines:
                report = verify_export(lines, complete=options["complete"])
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise CommandError(f"{path} is not a readable audit export: {exc}", returncode=2) from exc
        for broken in report.breaks[:MAX_REPORTED]:
            self.stderr.write(f"event id {broken.event_id} (intent {broken.intent_id}): {broken.problem}")
        if len(report.breaks) > MAX_REPORTED:
            self.stderr.write(f"{len(report.breaks) - MAX_REPORTED} more breaks not listed")
        summary = f"{report.events} events in {report.chains} chains"
        if report.partial:
            summary += (
                f"; {report.partial} chains start after their first event (an export filtered by time, "
                "or events removed: --complete refuses them)"
            )
        if report.breaks:
            self.stderr.write(f"export broken: {path}: {len(report.breaks)} breaks; read {summary}")
            raise SystemExit(1)
        self.stdout.write(f"export intact: {path}: {summary}")
