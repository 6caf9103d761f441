"""The lab's records: drill runs (crash lab, acceptance gate) and the crash lab's naive operations.

Both tables were created by ``reconciliation`` (migration 0002) and keep their names: the models
moved to the lab without moving a row (see ``console/lab/migrations/0001_initial.py``).
"""

from __future__ import annotations

from django.db import models


class DrillRun(models.Model):
    """One crash-lab or acceptance run: its table, its checks, when and by whom (the evidence
    an operator shows an auditor)."""

    class Kind(models.TextChoices):
        CRASHLAB = "crashlab", "Crash lab"
        ACCEPTANCE = "acceptance", "Acceptance gate"

    kind = models.CharField(max_length=20, choices=Kind.choices)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    passed = models.BooleanField(null=True, help_text="None while running, and for a run that did not run")
    requested_by = models.CharField(max_length=200, default="cli")
    parameters = models.JSONField(default=dict, blank=True)
    result = models.JSONField(default=dict, blank=True, help_text="rows / checks / metrics as printed")
    markdown = models.TextField(blank=True, default="")
    error = models.TextField(blank=True, default="")
    not_run_reason = models.TextField(
        blank=True,
        default="",
        help_text="why the run could not start or was aborted by its environment (no real broker, a "
        "process that would not start): not a verdict on safety; passed stays None",
    )

    class Meta:
        db_table = "reconciliation_drillrun"  # created by reconciliation 0002; kept, rows and all
        indexes = [models.Index(fields=["-started_at"], name="drill_started")]

    def __str__(self) -> str:
        return f"{self.kind} run {self.pk}"

    @property
    def outcome(self) -> str:
        """``running``, ``pass``, ``fail`` or ``not_run`` (an environment problem, never a safety
        verdict: the page shows it as "not run", an auditor never reads it as FAIL)."""
        if self.not_run_reason:
            return "not_run"
        if self.passed is None:
            return "running"
        return "pass" if self.passed else "fail"


class LabOperation(models.Model):
    """State of the crash lab's naive control executors (never used by the product's path).

    ``done`` is the naive "completion marker" whose placement (before or after the provider
    call) is exactly what the controls demonstrate to be wrong.
    """

    run_key = models.CharField(max_length=64)
    strategy = models.CharField(max_length=30)
    reference = models.CharField(max_length=200, unique=True)
    amount = models.PositiveIntegerField()
    done = models.BooleanField(default=False)
    finished = models.BooleanField(default=False, help_text="a delivery ran to its end")
    attempts = models.PositiveIntegerField(default=0)
    pid = models.IntegerField(null=True, blank=True, help_text="process making the current call")

    class Meta:
        db_table = "reconciliation_laboperation"  # created by reconciliation 0002; kept
        indexes = [models.Index(fields=["run_key", "strategy"], name="labop_run")]

    def __str__(self) -> str:
        return f"{self.strategy} {self.reference}"
