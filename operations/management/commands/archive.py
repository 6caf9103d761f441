"""``manage.py archive [--before DATE]``: archive settled intents past their retention (issue 36;
docs/how-to/archive.md).

Each intent that settled before ``--before`` (a UTC date, or an ISO 8601 time with its offset;
default: now) *and* is past its tenant's retention (``EFFECT_LEDGER_INTENT_RETENTION_DAYS``,
``EFFECT_LEDGER_TENANT_RETENTION_DAYS``) is written with everything about it to a signed archive
segment, then its live rows are deleted in small batches (``operations.archive.services``).
Nothing open is archived. Safe to kill at any point and run again: it resumes. The periodic job
(beat, every ``EFFECT_LEDGER_ARCHIVE_PERIOD_SECONDS``) runs the same with ``--before`` now.

Exit codes: 0 done; 1 it failed (what was committed stands; run it again); 2 bad arguments,
or another archiver is running.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_date

from operations.archive.files import ArchiveFileError, archive_dir
from operations.archive.lease import LEASE_SECONDS, ArchiveLeaseLostError
from operations.archive.services import ArchiveBusyError, archive_run
from operations.audit.keys import AuditKeyError
from operations.management.commands.recover import EARLIEST, _moment


def _before(value: str) -> datetime:
    """``YYYY-MM-DD`` (midnight UTC of that day) or an ISO 8601 time with its offset.

    Raises:
        ValueError: neither, or before 2000.
    """
    try:
        day = parse_date(value.strip())
    except ValueError as exc:
        raise ValueError(f"--before {value!r} is not a valid date ({exc})") from exc
    if day is not None:
        if day < EARLIEST.date():
            raise ValueError(f"--before {value!r} is before {EARLIEST:%Y}: nothing of this ledger is older")
        return datetime(day.year, day.month, day.day, tzinfo=UTC)
    return _moment(value).astimezone(UTC)


class Command(BaseCommand):
    help = (
        "Archive settled intents past their retention to signed archive files, then delete their live rows."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--before",
            default="",
            help="archive only intents that settled before this UTC date (2026-09-01) or time with its offset "
            "(2026-09-01T12:00:00Z); default now. Retention still applies",
        )
        parser.add_argument(
            "--max-segments", type=int, default=None, help="stop after writing this many segment files"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            before = _before(options["before"]) if options["before"] else timezone.now()
        except ValueError as exc:
            message = str(exc).replace("--since", "--before")
            raise CommandError(
                message.replace("not a restore point of this ledger", "nothing of this ledger is older"),
                returncode=2,
            ) from exc
        max_segments = options["max_segments"]
        if max_segments is not None and max_segments < 1:
            raise CommandError("--max-segments must be at least 1", returncode=2)
        try:
            report = archive_run(
                before=before, progress=lambda line: self.stdout.write(line), max_segments=max_segments
            )
        except ArchiveBusyError as exc:
            raise CommandError(
                f"{exc}; nothing was done (a run killed without finishing holds it for at most "
                f"{LEASE_SECONDS:.0f} s)",
                returncode=2,
            ) from exc
        except AuditKeyError as exc:
            self.stderr.write(f"archive refused: {exc}")
            raise SystemExit(1) from exc
        except (ArchiveLeaseLostError, ArchiveFileError) as exc:
            self.stderr.write(
                f"archive stopped: {exc} (archive directory {archive_dir()}; what was committed stands: "
                "fix the cause and run it again)"
            )
            raise SystemExit(1) from exc
        self.stdout.write(
            f"archived {report.intents_archived} intents in {report.segments} new segments "
            f"({report.bytes_written} bytes)"
            + (
                f"; {report.superseded} changed after they were written and stay live"
                if report.superseded
                else ""
            )
        )
