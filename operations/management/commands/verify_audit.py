"""``manage.py verify_audit``: exit 0 when every audit chain is intact, 1 naming the first break."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from operations.audit import audit_verify
from operations.models import AuditEvent


class Command(BaseCommand):
    help = "Verify the hash chains of the audit log."

    def handle(self, *args: Any, **options: Any) -> None:
        for broken in audit_verify():
            self.stderr.write(
                f"audit chain broken at event id {broken.event_id} (intent {broken.intent_id}): {broken.problem}"
            )
            raise SystemExit(1)
        self.stdout.write(f"audit chain intact: {AuditEvent.objects.count()} events verified")
