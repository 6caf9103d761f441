"""Celery worker signals of the ledger: the restore check on every worker's start (issue 22).

A worker must not send anything from a database that went back in time before the check ran:
each prefork child checks in ``worker_process_init`` (before it runs any task); the main
process checks in ``worker_ready`` (the solo and thread pools have no children) and, when the
database is behind, queues ``operations.restore.check`` so recovery starts at once rather than
at the beat's next period. A check that cannot run (the database is down) is logged and
skipped: the claim itself then fails, and the beat checks again.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import current_app
from celery.signals import worker_process_init, worker_ready

logger = logging.getLogger("operations.restore")


def _check(*, queue_recovery: bool) -> None:
    from operations.engine import protocol
    from operations.restore import recovery

    try:
        behind = recovery.pause_if_behind(actor=f"detector:{protocol.worker_identity()}")
    except Exception:
        logger.exception("restore check on worker start failed")
        return
    if behind is not None and queue_recovery:
        current_app.send_task("operations.restore.check")


@worker_process_init.connect
def _on_process_init(**_: Any) -> None:
    _check(queue_recovery=False)


@worker_ready.connect
def _on_worker_ready(**_: Any) -> None:
    _check(queue_recovery=True)
