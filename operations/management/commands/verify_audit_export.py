"""``manage.py verify_audit_export FILE``: re-check a JSON Lines audit export away from the
database; exit 0 when every event's hash matches its content and its chain links, 1 naming
each break (at most 50), 2 when the file cannot be read as an export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from operations.audit import verify_export

MAX_REPORTED = 50


class Command(BaseCommand):
    help = "Verify the hashes and links of a JSON Lines audit export (/audit/export.jsonl)."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path, help="a file saved from /audit/export.jsonl")

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["file"]
        try:
            with path.open(encoding="utf-8") as lines:
                breaks = list(verify_export(lines))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise CommandError(f"{path} is not a readable audit export: {exc}", returncode=2) from exc
        for broken in breaks[:MAX_REPORTED]:
            self.stderr.write(f"event id {broken.event_id} (intent {broken.intent_id}): {broken.problem}")
        if breaks:
            raise SystemExit(1)
        self.stdout.write(f"export intact: {path}")
