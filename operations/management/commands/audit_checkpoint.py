"""``manage.py audit_checkpoint``: sign, store and write out a checkpoint of every audit chain's
head (``operations.checkpoints.audit_checkpoint_create``).

Exit 0 with the checkpoint's summary; exit 2 with the reason when there is no usable signing key
or the checkpoint file cannot be written (then the checkpoint is stored but not written out).
``--public-key`` prints the public key (PEM) to hand to an auditor and makes no checkpoint.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from operations.audit_keys import AuditKeyError, key_id, public_key_load, public_key_pem
from operations.checkpoints import CheckpointError, audit_checkpoint_create, checkpoint_file_path


class Command(BaseCommand):
    help = "Sign a checkpoint of the audit chains' heads, store it and append it to the checkpoint file."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--if-changed", action="store_true", help="make none when the heads equal the latest checkpoint's"
        )
        parser.add_argument(
            "--public-key",
            action="store_true",
            help="print the verifying public key (PEM) and its id, then exit",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["public_key"]:
                public_key = public_key_load()
                self.stdout.write(public_key_pem(public_key), ending="")
                self.stdout.write(f"key id {key_id(public_key)}")
                return
            row = audit_checkpoint_create(only_if_changed=options["if_changed"])
        except (AuditKeyError, CheckpointError) as exc:
            raise CommandError(str(exc), returncode=2) from exc
        if row is None:
            self.stdout.write("no audit checkpoint made: nothing changed since the latest one")
            return
        self.stdout.write(
            f"audit checkpoint #{row.number}: {row.chains} chains, {row.events} events, root {row.root}, "
            f"signed by key {row.key_id[:16]}…; appended to {checkpoint_file_path()}"
        )
