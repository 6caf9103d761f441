"""The ledger's own health: workers' heartbeats and the last run of each periodic job."""

from __future__ import annotations

from django.db import models


class WorkerHeartbeat(models.Model):
    """A Celery worker's own record that it is alive: upserted by the worker every
    ``EFFECT_LEDGER["WORKER_HEARTBEAT_SECONDS"]`` (``operations.workers.heartbeat``), one row per worker
    node name. ``beat_at`` is database time; ``stopped_at`` is set on a warm shutdown, so a
    worker that stopped cleanly is told apart from one that died (its beats just stop).
    """

    hostname = models.CharField(max_length=255, unique=True, help_text="the worker's node name (name@host)")
    pid = models.IntegerField(help_text="the worker's main process")
    queues = models.JSONField(default=list, blank=True, help_text="the queue names it consumes")
    concurrency = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(help_text="when this worker process started beating")
    beat_at = models.DateTimeField(help_text="its last beat (database time)")
    stopped_at = models.DateTimeField(null=True, blank=True, help_text="set on a warm shutdown")

    class Meta:
        indexes = [models.Index(fields=["-beat_at"], name="worker_heartbeat_beat")]

    def __str__(self) -> str:
        return f"worker {self.hostname}"


class PeriodicJobRun(models.Model):
    """The last run of a periodic job (the outbox relay, the reconciler): one row per job,
    upserted at the end of every run (``operations.services.periodic_job_record``)."""

    name = models.CharField(max_length=100, primary_key=True, help_text="the Celery task name")
    last_started_at = models.DateTimeField()
    last_finished_at = models.DateTimeField(help_text="database time")
    last_duration_ms = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="", help_text="empty when the last run succeeded")
    last_succeeded_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"periodic job {self.name}"
