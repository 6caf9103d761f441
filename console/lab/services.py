"""The lab's writes from the console: queueing a drill, recording a drill that could not run.

Deliberately free of task declarations: the Drills page imports this, and every process that
loads the URLconf (production workers too, through Django's system checks) imports the page.
The drill task itself is declared in ``console.lab.drills``, a lab task module.
"""

from __future__ import annotations

from datetime import datetime

from celery import current_app
from django.db import transaction
from django.utils import timezone

from console.lab.cluster import HarnessError, require_real_broker
from console.lab.models import DrillRun

#: The drill task's name (declared in ``console.lab.drills``).
RUN_DRILL_TASK = "lab.run_drill"
DRILL_KINDS = ("crashlab", "acceptance")


def drills_unavailable_reason() -> str | None:
    """Why no drill can run under the configured broker, or None when they can.

    Drills SIGKILL worker processes mid-task; kombu's filesystem transport (the zero-setup
    default, ``CELERY_BROKER_URL`` unset) does not survive that (``console.lab.cluster
    .require_real_broker``). RabbitMQ and Redis do. The console disables its buttons with this
    reason, and ``drill_request`` refuses with it.
    """
    try:
        require_real_broker("a drill")
    except HarnessError as exc:
        return str(exc)
    return None


def drill_run_not_run(
    *, kind: str, requested_by: str, reason: str, started_at: datetime, run_id: int | None = None
) -> DrillRun:
    """Record a drill that could not start, or was aborted by its environment, as *not run*.

    Never a FAIL: ``passed`` stays None and ``not_run_reason`` says why (an auditor reads FAIL
    as a safety check that failed; a missing broker or a worker that would not start is not one).

    Args:
        kind: ``crashlab`` or ``acceptance``.
        requested_by: ``user:<name>`` or ``cli``.
        reason: what went wrong, as printed (kept to its last 2,000 characters).
        started_at: when the attempt began.
        run_id: the run already recorded as running, updated in place; None creates one.

    Returns:
        The run, finished now.
    """
    reason = reason.strip()[-2000:] or "the drill could not start"
    if run_id is not None:
        DrillRun.objects.filter(id=run_id).update(
            finished_at=timezone.now(), passed=None, not_run_reason=reason
        )
        return DrillRun.objects.get(id=run_id)
    return DrillRun.objects.create(
        kind=kind,
        started_at=started_at,
        finished_at=timezone.now(),
        passed=None,
        requested_by=requested_by,
        not_run_reason=reason,
    )


def drill_request(*, kind: str, requested_by: str) -> None:
    """Queue a drill (``lab.run_drill``) after the current transaction commits.

    Only a worker started with the lab's tasks runs it (``console.lab.LAB_TASK_MODULES``).

    Raises:
        ValueError: ``kind`` is neither ``crashlab`` nor ``acceptance``, or the broker is kombu's
            filesystem transport, which a drill's killed workers do not survive (refused before
            anything is queued, so no run is recorded as a failure of the product).
    """
    if kind not in DRILL_KINDS:
        raise ValueError(f"unknown drill kind {kind!r}")
    unavailable = drills_unavailable_reason()
    if unavailable is not None:
        raise ValueError(f"The {kind} drill cannot run here: {unavailable}")
    transaction.on_commit(lambda: current_app.send_task(RUN_DRILL_TASK, args=(kind, requested_by)))
