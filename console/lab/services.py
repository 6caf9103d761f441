"""The lab's writes from the console: queueing a drill.

Deliberately free of task declarations: the Drills page imports this, and every process that
loads the URLconf (production workers too, through Django's system checks) imports the page.
The drill task itself is declared in ``console.lab.drills``, a lab task module.
"""

from __future__ import annotations

from celery import current_app
from django.db import transaction

from console.lab.cluster import HarnessError, require_real_broker

#: The drill task's name (declared in ``console.lab.drills``).
RUN_DRILL_TASK = "lab.run_drill"
DRILL_KINDS = ("crashlab", "acceptance")


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
    try:
        require_real_broker(f"the {kind} drill")
    except HarnessError as exc:
        raise ValueError(str(exc)) from exc
    transaction.on_commit(lambda: current_app.send_task(RUN_DRILL_TASK, args=(kind, requested_by)))
