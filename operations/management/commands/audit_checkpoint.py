"""``manage.py audit_checkpoint``: check the audit log against the previous checkpoint, then
sign, store and write out a checkpoint of every audit chain's head
(``operations.audit.signing.audit_checkpoint_create``).

Exit codes:

- 0: a checkpoint was made (its summary is printed), or ``--if-changed`` and nothing changed.
- 1: refused: the log no longer holds what the previous checkpoint saw (a deleted tail or
  chain, a recomputed chain...) or that checkpoint was altered; each fault is printed on
  stderr and nothing is signed.
- 2: no usable signing key, or the checkpoint file cannot be written (then the checkpoint is
  stored but not written out), ``--accept-faults`` without a ``--reason`` (or one with
  control characters), or ``--reason`` without ``--accept-faults``.

``--accept-faults --reason TEXT`` is the operator's deliberate re-baseline after such a refusal
has been investigated: the checkpoint is signed anyway, with the faults and the reason inside
its signed statement (``accepted``), which ``verify_audit`` shows from then on.
``--public-key`` prints the public key (PEM) to hand to an auditor and makes no checkpoint.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from operations.audit.checkpoint_file import checkpoint_file_path
from operations.audit.checkpoints import CheckpointError, printable
from operations.audit.keys import AuditKeyError, key_id, public_key_load, public_key_pem
from operations.audit.signing import CheckpointRefusedError, audit_checkpoint_create


class Command(BaseCommand):
    help = (
        "Check the audit log against the previous checkpoint, then sign a checkpoint of the chains' "
        "heads, store it and append it to the checkpoint file."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--if-changed", action="store_true", help="make none when the heads equal the latest checkpoint's"
        )
        parser.add_argument(
            "--accept-faults",
            action="store_true",
            help="sign even though the log no longer holds what the previous checkpoint saw, recording "
            "the faults and --reason in the signed checkpoint (a deliberate, permanent re-baseline)",
        )
        parser.add_argument("--reason", default="", help="why the faults are accepted (with --accept-faults)")
        parser.add_argument(
            "--public-key",
            action="store_true",
            help="print the verifying public key (PEM) and its id, then exit",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["accept_faults"] and not options["reason"].strip():
            raise CommandError(
                "--accept-faults needs --reason: say why the faults are accepted", returncode=2
            )
        if options["reason"] and not options["accept_faults"]:
            raise CommandError("--reason is only for --accept-faults; nothing was signed", returncode=2)
        try:
            if options["public_key"]:
                public_key = public_key_load()
                self.stdout.write(public_key_pem(public_key), ending="")
                self.stdout.write(f"key id {key_id(public_key)}")
                return
            row = audit_checkpoint_create(
                only_if_changed=options["if_changed"],
                accept_faults_reason=options["reason"] if options["accept_faults"] else None,
            )
        except CheckpointRefusedError as exc:
            for fault in exc.faults:
                self.stderr.write(f"audit checkpoint #{exc.previous}: {fault}")
            if exc.omitted:
                self.stderr.write(f"audit checkpoint #{exc.previous}: {exc.omitted} more faults not listed")
            raise CommandError(
                f"no audit checkpoint made: the audit log no longer holds what checkpoint #{exc.previous} saw, "
                "or that checkpoint was altered (the faults are listed above). Investigate; to re-baseline "
                'deliberately, run audit_checkpoint --accept-faults --reason "..."',
                returncode=1,
            ) from exc
        except (AuditKeyError, CheckpointError, ValueError) as exc:
            raise CommandError(str(exc), returncode=2) from exc
        if row is None:
            self.stdout.write("no audit checkpoint made: nothing changed since the latest one")
            return
        if row.accepted:
            self.stdout.write(
                f"audit checkpoint #{row.number} signed over {len(row.accepted['faults']) + row.accepted['omitted']} "
                f"acknowledged fault(s), recorded in it with the reason: {printable(row.accepted['reason'])}"
            )
        self.stdout.write(
            f"audit checkpoint #{row.number}: {row.chains} chains, {row.events} events, root {row.root}, "
            f"signed by key {row.key_id[:16]}…; appended to {checkpoint_file_path()}"
        )
