"""Drills: crash-lab and acceptance runs started from the console, as Celery tasks.

A drill runs ``manage.py crashlab`` in a child process (its own cluster of workers and its own
sandbox provider, never a real provider), so the worker that runs the task only waits. It is a
lab task (``console.lab.LAB_TASK_MODULES``): only a worker started with the lab's tasks runs it
(quickstart's is one); production workers do not register it. The console queues it by name
(``console.lab.services.drill_request``), so serving the Drills page never imports this module.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from console.lab.models import DrillRun
from console.lab.services import RUN_DRILL_TASK, drill_run_not_run

DRILL_OPS = 20  # operations per cell of a drill started from the console
DRILL_TIMEOUT_SECONDS = 900


def drill_command(*, kind: str, requested_by: str) -> list[str]:
    """The command line of a drill: the acceptance gate or a reduced crash-lab matrix."""
    manage = str(Path(settings.BASE_DIR) / "manage.py")
    command = [sys.executable, manage, "crashlab", "--requested-by", requested_by]
    if kind == "acceptance":
        return [*command, "--acceptance"]
    return [*command, "--ops", str(DRILL_OPS)]


@shared_task(
    name=RUN_DRILL_TASK,
    time_limit=DRILL_TIMEOUT_SECONDS + 60,
    soft_time_limit=DRILL_TIMEOUT_SECONDS,
)
def run_drill(kind: str, requested_by: str) -> int:
    """Run one drill to its end; the command records its own ``DrillRun``. Returns its exit code.

    A drill that could not start (its command missing, refused before recording a run: no real
    broker, a bad argument) or did not finish within ``DRILL_TIMEOUT_SECONDS`` is recorded as
    *not run* with the reason (``console.lab.services.drill_run_not_run``), never as a FAIL: that
    verdict belongs to a safety check that ran and failed.
    """
    started = timezone.now()
    try:
        completed = subprocess.run(  # noqa: S603 - our own manage.py, fixed arguments
            drill_command(kind=kind, requested_by=requested_by),
            cwd=settings.BASE_DIR,
            timeout=DRILL_TIMEOUT_SECONDS,
            capture_output=True,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        reason = (
            f"aborted: the drill did not finish within {DRILL_TIMEOUT_SECONDS} s"
            if isinstance(exc, subprocess.TimeoutExpired)
            else f"the drill's command could not start: {exc}"
        )
        running = DrillRun.objects.filter(
            requested_by=requested_by, started_at__gte=started, finished_at__isnull=True
        ).first()
        drill_run_not_run(
            kind=kind,
            requested_by=requested_by,
            reason=reason,
            started_at=started,
            run_id=running.id if running else None,
        )
        return -1
    recorded = DrillRun.objects.filter(requested_by=requested_by, started_at__gte=started).exists()
    if completed.returncode and not recorded:
        # The command refused before recording a run (e.g. no real broker): not run, and why.
        drill_run_not_run(
            kind=kind,
            requested_by=requested_by,
            reason=completed.stderr.decode(errors="replace") or f"exit status {completed.returncode}",
            started_at=started,
        )
    return completed.returncode
