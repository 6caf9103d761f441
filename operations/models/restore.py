"""A database that went back in time (issue 22): the execution control row every claim reads
(fence epoch, pause, restore guard) and the record of each recovery (``RecoveryRun``).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now


class ExecutionControl(models.Model):
    """The one row (``id = 1``) that every claim reads in its own UPDATE: the fence epoch, the
    execution pause and the restore guard (issue 22, "When the database goes back in time").

    * ``fence_epoch``: a claim's fence is at least ``fence_epoch * FENCE_EPOCH_STRIDE`` + 1, so
      after a recovery raises the epoch every fence is above any a provider saw before, even
      one a restored database forgot. Never lowered.
    * ``paused_at``: while set, no claim succeeds (nothing is sent); submissions, approvals and
      lookups go on. Set by the restore check when the database is behind the outward
      checkpoint file, and by ``recover`` while it runs.
    * ``guard_started_at`` .. ``guard_until``: the restore guard. A claim in this interval at a
      provider that cannot deduplicate on our key looks the effect up before sending
      (``operations.engine.restore_guard``).
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    fence_epoch = models.BigIntegerField(default=0)
    paused_at = models.DateTimeField(null=True, blank=True)
    pause_reason = models.TextField(blank=True, default="")
    paused_by = models.CharField(max_length=200, blank=True, default="")
    guard_started_at = models.DateTimeField(null=True, blank=True)
    guard_until = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=Now)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(id=1), name="execution_control_single_row"),
            models.CheckConstraint(
                condition=Q(fence_epoch__gte=0), name="execution_control_epoch_non_negative"
            ),
        ]

    def __str__(self) -> str:
        state = f"paused since {self.paused_at:%Y-%m-%d %H:%M:%S}" if self.paused_at else "running"
        return f"execution {state}, fence epoch {self.fence_epoch}"


#: A fence epoch's width: epoch ``e`` issues fences from ``e * FENCE_EPOCH_STRIDE + 1``. 2**21
#: claims per intent per epoch; the epoch is the recovery's Unix time in seconds (about 2**31),
#: so fences stay below 2**53 and exact in every JSON reader.
FENCE_EPOCH_STRIDE = 2**21


class RecoveryRun(models.Model):
    """One recovery after a restore or a failover (``manage.py recover``, or started by the
    restore check): what it found, what it changed, and whether it finished.

    ``counts`` maps what was done to how many intents (``ready_redispatched``,
    ``unknown_looked_up``, ``duplicate_checks``, ``running``, ``awaiting``, ...). ``error`` is
    set when it stopped early (execution then stays paused).
    """

    started_at = models.DateTimeField(default=Now)
    finished_at = models.DateTimeField(null=True, blank=True)
    since = models.DateTimeField(
        help_text="the restore point given (or the newest checkpoint the database kept)"
    )
    margin_seconds = models.FloatField(default=0.0)
    trigger = models.CharField(max_length=20, help_text="operator or detector")
    actor = models.CharField(max_length=200)
    reason = models.TextField(blank=True, default="")
    fence_epoch_before = models.BigIntegerField(default=0)
    fence_epoch_after = models.BigIntegerField(default=0)
    guard_until = models.DateTimeField(null=True, blank=True)
    checkpoint_number = models.PositiveIntegerField(null=True, blank=True)
    counts = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["-started_at"], name="recovery_run_started")]

    def __str__(self) -> str:
        return f"recovery {self.pk} at {self.started_at:%Y-%m-%d %H:%M:%S}"
