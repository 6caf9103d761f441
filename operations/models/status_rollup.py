"""Counts of the intents in each settled state, per tenant (``StatusRollup``)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from operations.models.intents import SETTLED_STATUS_VALUES


class StatusRollup(models.Model):
    """How many intents of one tenant were in one settled state (``SETTLED_STATUS_VALUES``) when
    they were last counted: one row per (tenant, state), rewritten together by
    ``operations.services.status_rollup_refresh`` (the beat, every ``STATUS_ROLLUP_PERIOD_SECONDS``).
    The dashboard and ``/metrics`` sum these counts over the tenants a reader may see, with their
    age, instead of counting a million rows on every request (issue 18 item 5: per tenant).
    """

    tenant = models.CharField(max_length=100)
    status = models.CharField(max_length=20)
    count = models.BigIntegerField()
    computed_at = models.DateTimeField(help_text="database time of the statement that counted")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "status"], name="status_rollup_tenant_status"),
            models.CheckConstraint(
                condition=Q(status__in=SETTLED_STATUS_VALUES), name="status_rollup_settled_status"
            ),
            models.CheckConstraint(condition=Q(count__gte=0), name="status_rollup_count_non_negative"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant} {self.status}: {self.count} at {self.computed_at:%Y-%m-%d %H:%M:%S}"
