"""Two schedulers at once (issue 35, C27): the claim of each periodic job's run per period, and
each Celery beat's own heartbeat (so a second beat is seen on the health page)."""

from __future__ import annotations

from django.db import models


class PeriodicClaim(models.Model):
    """One periodic job's run in one period: inserted with ``INSERT ... ON CONFLICT DO NOTHING``
    by the task before it works (``operations.services.periodic_claims``), so when two beats
    schedule the job in the same period only the first run does it. ``slot`` is the period's
    number: ``floor(epoch seconds of the database clock / period seconds)``."""

    job = models.CharField(max_length=100, help_text="the Celery task name (plus a part, e.g. a source)")
    slot = models.BigIntegerField(help_text="floor(database epoch seconds / period seconds)")
    period_seconds = models.FloatField(help_text="the period the slot is counted in")
    claimed_at = models.DateTimeField(help_text="database time of the claim")
    claimed_by = models.CharField(max_length=255, help_text="the worker process that claimed it")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "slot"], name="periodic_claim_job_slot")]

    def __str__(self) -> str:
        return f"{self.job} #{self.slot}"


class BeatHeartbeat(models.Model):
    """A Celery beat process's record that it runs: upserted every
    ``EFFECT_LEDGER["BEAT_HEARTBEAT_SECONDS"]`` by a thread the beat starts on ``beat_init``
    (``operations.workers.beat_heartbeat``). One row per beat process (``identity`` =
    ``host:pid:start``); two rows seen within the window mean two beats run."""

    identity = models.CharField(max_length=255, primary_key=True, help_text="host:pid:start of the process")
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    started_at = models.DateTimeField(help_text="when the beat process started")
    seen_at = models.DateTimeField(help_text="its last heartbeat (database time)")

    class Meta:
        indexes = [models.Index(fields=["-seen_at"], name="beat_heartbeat_seen")]

    def __str__(self) -> str:
        return f"beat {self.identity}"
