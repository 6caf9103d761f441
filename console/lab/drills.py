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
from console.lab.services import RUN_DRILL_TASK

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
    """Run one drill to its end; the command records its own ``DrillRun``. Returns its exit code."""
    started = timezone.now()
    completed = subprocess.run(  # noqa: S603 - our own manage.py, fixed arguments
        drill_command(kind=kind, requested_by=requested_by),
        cwd=settings.BASE_DIR,
        timeout=DRILL_TIMEOUT_SECONDS,
        capture_output=True,
        check=False,
    )
    recorded = DrillRun.objects.filter(requested_by=requested_by, started_at__gte=started).exists()
    if completed.returncode and not recorded:
        # The command refused before recording a run (e.g. no real broker): show why.
        DrillRun.objects.create(
            kind=kind,
            started_at=started,
            finished_at=timezone.now(),
            passed=False,
            requested_by=requested_by,
            error=completed.stderr.decode(errors="replace")[-2000:] or f"exit status {completed.returncode}",
        )
    return completed.returncode
