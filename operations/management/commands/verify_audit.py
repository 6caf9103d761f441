"""``manage.py verify_audit``: walk every audit chain, then check the log against the latest
signed checkpoint (``operations.audit.verification``).

Exit codes:

- 0: every chain is intact and, when a checkpoint exists, every checkpointed head is still there
  with its hash. With events but no checkpoint at all, a warning goes to stderr and the exit is
  still 0, unless ``--require-checkpoint`` (then 1): without a checkpoint, deleted tails and
  chains cannot be seen.
- 1: something was found; each finding is named on stderr (a chain break with its event id,
  ``deleted tail``, ``deleted chain``, ``recomputed chain``, ``truncation``, ``bad signature``,
  ``deleted checkpoint``...; the archive's: ``missing archive file``, ``altered archive file``,
  ``swapped manifest``, ``broken archived chain``, ``bad inclusion proof``...).
- 2: verification could not run: no public key to check a checkpoint or the archive with, or an unreadable
  ``--checkpoint-file`` (not UTF-8, a line that is not a checkpoint line; a chain break found
  before that still exits 1).

``--checkpoint-file PATH`` verifies against PATH (an auditor's copy of ``AUDIT_CHECKPOINT_FILE``)
instead of the newest stored checkpoint: every line's signature, every line's checkpoint present
and identical in the database (``deleted checkpoint``, ``altered checkpoint``, naming which copy
is at fault), and the live heads against the file's newest checkpoint. Without it, the
configured ``AUDIT_CHECKPOINT_FILE`` is used when it exists (so a database that went back in
time — a restore, a failover — is reported, issue 22 item 4); ``--database-only`` checks the
stored checkpoints alone. File lines whose checkpoints a restore took from the database and a
recovery re-baselined (``manage.py recover``) are counted, not faults; the re-baseline itself
is listed with its reason.

The archive (issue 36) is verified too whenever there is one (``operations.archive.verification``):
every segment file and manifest against its signed statement and the archive index, every
archived chain from its first event, its head, and its inclusion proofs against the signed
checkpoints; a missing, edited or swapped file is named with the file and the intent (exit 1).
A checkpointed chain that is not in the live table is no fault when the archive holds it.
``--live-only`` skips the archive files (the archive index still accounts for archived chains).

Checkpoints signed over acknowledged faults (``audit_checkpoint --accept-faults``) are listed on
stdout with their reason on every run; they do not change the exit code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from operations.archive.verification import archive_exists, archive_verify
from operations.archive.verification_findings import ArchiveReport
from operations.audit.chain_checks import audit_verify
from operations.audit.checkpoint_faults import CheckpointReport
from operations.audit.checkpoint_file import checkpoint_file_path
from operations.audit.checkpoints import CheckpointError, printable, restored_gap
from operations.audit.keys import AuditKeyError, public_key_load
from operations.audit.verification import checkpoint_verify
from operations.models import AuditCheckpoint, AuditEvent

MAX_BREAKS_SHOWN = 50
#: Accepted faults of a re-baseline listed under it (all are in its signed statement).
FAULTS_SHOWN = 10


class Command(BaseCommand):
    help = "Verify the hash chains of the audit log and check them against the latest signed checkpoint."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--checkpoint-file",
            type=Path,
            help="verify against this copy of the checkpoint file (kept outside the database): every line "
            "must be in the database unchanged, and the live heads are checked against its newest",
        )
        parser.add_argument(
            "--database-only",
            action="store_true",
            help="verify against the newest stored checkpoint only, even when the configured checkpoint "
            "file exists",
        )
        parser.add_argument(
            "--live-only",
            action="store_true",
            help="do not read the archive files (the chains archived are still accounted for by the archive "
            "index when checkpoints are compared)",
        )
        parser.add_argument(
            "--require-checkpoint",
            action="store_true",
            help="exit 1 when the log has events but there is no checkpoint to check them against",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        failed = self._walk_chains()
        try:
            report = self._verify_checkpoint(self._checkpoint_file(options))
        except (AuditKeyError, CheckpointError) as exc:
            if failed:
                self.stderr.write(f"the checkpoint was not checked: {exc}")
                raise SystemExit(1) from exc
            raise CommandError(f"cannot verify against a checkpoint: {exc}", returncode=2) from exc
        if report is not None:
            number = f"#{report.checkpoint.number}" if report.checkpoint else "(none)"
            for fault in report.faults:
                self.stderr.write(f"audit checkpoint {number}: {fault}")
            if report.omitted:
                self.stderr.write(f"audit checkpoint {number}: {report.omitted} more findings not listed")
            failed = failed or not report.ok
        archive = None if options["live_only"] else self._verify_archive(report, failed)
        if archive is not None:
            for finding in archive.findings:
                self.stderr.write(f"audit archive: {finding}")
            if archive.omitted:
                self.stderr.write(f"audit archive: {archive.omitted} more findings not listed")
            failed = failed or not archive.ok
        # Re-baselines are shown on every run, whatever else was found.
        for rebaselined, accepted in report.accepted if report is not None else []:
            gap = restored_gap(accepted)
            lost = (f"#{gap[0] + 1}" if gap[0] + 1 == gap[1] else f"#{gap[0] + 1}-#{gap[1]}") if gap else ""
            restored = (
                f"; a recovery after the database went back in time: checkpoint(s) {lost} only in the "
                "checkpoint file"
                if gap
                else ""
            )
            out = self.stderr if failed else self.stdout
            out.write(
                f"audit checkpoint #{rebaselined} was signed over {len(accepted['faults']) + accepted['omitted']} "
                f"acknowledged fault(s) of the checkpoint before it{restored}; "
                f"reason: {printable(accepted['reason'])}"
            )
            for fault in accepted["faults"][:FAULTS_SHOWN]:
                out.write(f"  accepted: {printable(fault)}")
            if len(accepted["faults"]) + accepted["omitted"] > FAULTS_SHOWN:
                out.write(
                    f"  and {len(accepted['faults']) + accepted['omitted'] - FAULTS_SHOWN} more (in the signed checkpoint)"
                )
        if failed:
            raise SystemExit(1)
        events = AuditEvent.objects.count()
        self.stdout.write(f"audit chain intact: {events} events verified")
        if report is not None and report.checkpoint is not None:
            statement = report.checkpoint.statement
            since = (
                f"{report.archived} of the chains in the archive"
                if report.archived
                else f"{events - int(statement['events'])} events written since"
            )
            self.stdout.write(
                f"audit checkpoint #{statement['number']} ({self._source(report)}, {statement['created_at']}) "
                f"verified: {statement['chains']} chains and {statement['events']} events all present, {since}"
            )
        elif events:
            self.stderr.write(
                "no audit checkpoint exists: deleted tails or chains cannot be detected "
                "(make one with manage.py audit_checkpoint)"
            )
            if options["require_checkpoint"]:
                raise SystemExit(1)
        if archive is not None:
            self.stdout.write(
                f"audit archive verified: {archive.segments} segment(s) signed and linked, {archive.intents} "
                f"intents and {archive.events} events in their files, {archive.proofs} inclusion proof(s) "
                "against signed checkpoints"
            )

    def _verify_archive(self, report: CheckpointReport | None, failed: bool) -> ArchiveReport | None:
        """The archive's report (None when there is no archive). The checkpointed heads of
        chains archived after they grew (``report.archived_later``) must be in their files.

        Raises:
            CommandError: no public key (exit 2), unless something was found already (exit 1).
        """
        if not archive_exists():
            return None
        try:
            public_key = public_key_load()
        except AuditKeyError as exc:
            if failed:
                self.stderr.write(f"the archive was not checked: {exc}")
                raise SystemExit(1) from exc
            raise CommandError(f"cannot verify the archive: {exc}", returncode=2) from exc
        return archive_verify(public_key, expected_events=report.archived_later if report is not None else ())

    def _walk_chains(self) -> bool:
        """Print the chain breaks (the first ``MAX_BREAKS_SHOWN``); True when there was one."""
        found = 0
        for broken in audit_verify():
            found += 1
            if found <= MAX_BREAKS_SHOWN:
                self.stderr.write(
                    f"audit chain broken at event id {broken.event_id} (intent {broken.intent_id}): {broken.problem}"
                    if broken.event_id is not None
                    else f"intent {broken.intent_id} does not match its audit chain: {broken.problem}"
                )
        if found > MAX_BREAKS_SHOWN:
            self.stderr.write(f"{found - MAX_BREAKS_SHOWN} more chain breaks not listed")
        return found > 0

    @staticmethod
    def _checkpoint_file(options: dict[str, Any]) -> Path | None:
        """``--checkpoint-file``; else the configured file when it exists (not with
        ``--database-only``)."""
        if options["checkpoint_file"] is not None or options["database_only"]:
            given: Path | None = options["checkpoint_file"]
            return given
        path = checkpoint_file_path()
        return path if path.is_file() and path.stat().st_size > 0 else None

    def _verify_checkpoint(self, checkpoint_file: Path | None) -> CheckpointReport | None:
        """The checkpoint report, or None when no checkpoint exists anywhere."""
        if checkpoint_file is None and not AuditCheckpoint.objects.exists():
            return None
        return checkpoint_verify(public_key=public_key_load(), checkpoint_file=checkpoint_file)

    @staticmethod
    def _source(report: CheckpointReport) -> str:
        """Where the checkpoint verified against came from, for the summary line."""
        if report.source == "file":
            if report.restored_lines:
                return (
                    f"file, newest of {report.file_lines} lines, all in the database except "
                    f"{report.restored_lines} lost by a restore and re-baselined"
                )
            return f"file, newest of {report.file_lines} lines all in the database"
        return report.source
