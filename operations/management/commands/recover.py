"""``manage.py recover --since <time>``: recover after a failover or a restore (issue 22).

Run it after any failover or restore (the workers' and the beat's restore check runs it by
itself when the database is behind the checkpoint file, unless
``EFFECT_LEDGER_RECOVER_AUTOMATICALLY=0``). What it does is ``operations.services.failover.
recover``: pause, raise the fence epoch, start the restore guard, re-dispatch READY intents,
look UNKNOWN ones up now, schedule duplicate checks for what ended after ``--since`` minus the
margin at providers without keys, re-baseline the audit checkpoint when the database is behind
the checkpoint file, resume.

When the database does not match its own newest audit checkpoint (which a restore does not
cause: someone changed the log), nothing is re-baselined and execution stays paused, unless
``--accept-audit-faults REASON`` after an investigation.

Exit codes: 0 done; 1 it failed (execution stays paused; the error is printed and recorded);
2 bad arguments (``--since`` needs a UTC offset), or another recovery is running.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from operations.restore.check import database_behind
from operations.restore.recovery import recover_with_rebaseline
from operations.services.failover import RecoveryPlan, RecoveryRunning

#: The earliest restore point accepted (nothing of the ledger is older).
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)


def _moment(value: str) -> datetime:
    """An ISO 8601 date-time with its offset (``Z`` or ``+01:00``): a time without one would be
    read in some time zone, and a wrong guess moves the restore point by hours.

    Raises:
        ValueError: not a date-time, no offset, or before 2000.
    """
    try:
        parsed = parse_datetime(value.strip())
    except ValueError as exc:  # a well-formed but impossible value: month 13, offset +25:00
        raise ValueError(f"not a valid date-time: {value!r} ({exc})") from exc
    if parsed is None:
        raise ValueError(f"not an ISO 8601 date-time: {value!r} (e.g. 2026-12-01T13:05:00Z)")
    if timezone.is_naive(parsed):
        raise ValueError(
            f"--since {value!r} has no UTC offset: write it with one (2026-12-01T13:05:00Z, or +01:00)"
        )
    offset = parsed.utcoffset()
    if offset is not None and abs(offset) > timedelta(hours=14):
        raise ValueError(f"--since {value!r}: no time zone is more than 14 hours from UTC")
    if parsed < EARLIEST:
        raise ValueError(f"--since {value!r} is before {EARLIEST:%Y}: not a restore point of this ledger")
    return parsed


class Command(BaseCommand):
    help = "Recover after a failover or a restore: reconcile before anything is sent again."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--since",
            required=True,
            help="the restore point, or earlier (ISO 8601, e.g. 2026-12-01T13:05:00Z): the time of the backup "
            "restored, or of the last commit the promoted replica had",
        )
        parser.add_argument(
            "--margin",
            type=float,
            default=None,
            help="seconds before --since to look at as well (default EFFECT_LEDGER_RECOVERY_MARGIN_SECONDS, 60)",
        )
        parser.add_argument(
            "--actor", default="operator", help="who runs it, for the record (default operator)"
        )
        parser.add_argument(
            "--accept-audit-faults",
            metavar="REASON",
            help="re-baseline even though the database does not match its own newest audit checkpoint "
            "(which a restore does not cause): after you investigated; the reason and the faults are signed "
            "into the checkpoint",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            since = _moment(options["since"])
        except ValueError as exc:
            raise CommandError(str(exc), returncode=2) from exc
        margin = options["margin"]
        if margin is None:
            margin = float(settings.EFFECT_LEDGER["RECOVERY_MARGIN_SECONDS"])
        if not 0 <= margin <= 7 * 86400:
            raise CommandError("--margin must be from 0 to 604800 seconds", returncode=2)
        if since > timezone.now():
            raise CommandError(f"--since {since.isoformat()} is in the future", returncode=2)
        actor = options["actor"]
        if not actor.strip() or not actor.isprintable():
            raise CommandError("--actor must be printable text", returncode=2)
        accept = options["accept_audit_faults"]
        if accept is not None and (not accept.strip() or not accept.isprintable() or len(accept) > 500):
            raise CommandError(
                "--accept-audit-faults needs a printable reason of at most 500 characters", returncode=2
            )
        behind = database_behind()
        plan = RecoveryPlan(
            since=since,
            margin_seconds=margin,
            actor=f"user:{actor}"[:200],
            trigger="operator",
            reason=behind.reason if behind else f"run by an operator (--since {since.isoformat()})",
        )
        try:
            run = recover_with_rebaseline(plan, accept_audit_faults=accept)
        except RecoveryRunning as exc:
            raise CommandError(f"{exc}; nothing was done", returncode=2) from exc
        except Exception as exc:
            self.stderr.write(f"recovery failed, execution stays paused: {type(exc).__name__}: {exc}")
            raise SystemExit(1) from exc
        self.stdout.write(
            f"recovery #{run.pk} finished: fence epoch {run.fence_epoch_before} -> {run.fence_epoch_after}; "
            f"restore guard until {run.guard_until:%Y-%m-%d %H:%M:%S %Z}"
        )
        for name, count in sorted(run.counts.items()):
            self.stdout.write(f"  {name.replace('_', ' ')}: {count}")
        if run.checkpoint_number:
            self.stdout.write(
                f"  audit checkpoint #{run.checkpoint_number} re-baselined after the restore "
                "(verify_audit lists it with its reason)"
            )
        self.stdout.write("execution resumed")
