"""Logging filters of the processes (``LOGGING`` in ``console/settings.py``).

Celery writes three INFO lines for every run of every periodic task: the beat's "Scheduler:
Sending due task relay-outbox (operations.relay_outbox)", the worker's "Task ...[id] received"
and "Task ...[id] succeeded in 0.01s: 0". With the outbox relay every 2 s and the other safety
nets every 5 to 60 s that is about 190 lines a minute from a ledger with nothing to do (issue
39, item 7). Those lines say only that the schedule ran, so they are DEBUG; what a run *did* is
logged by the task itself, at INFO when it did something (``operations.tasks.periodic_result``).
"""

from __future__ import annotations

import logging
from typing import Any

#: Celery's loggers of those lines: the beat sending a task, the worker receiving it, its result.
CELERY_RUN_LOGGERS = frozenset({"celery.beat", "celery.worker.strategy", "celery.app.trace"})


def periodic_task_names() -> frozenset[str]:
    """The task names of the running Celery app's beat schedule (``console/celery.py``), e.g.
    ``operations.relay_outbox``; empty where no app with a schedule is loaded."""
    from celery import current_app

    schedule: dict[str, Any] = current_app.conf.beat_schedule or {}
    return frozenset(str(entry["task"]) for entry in schedule.values() if "task" in entry)


def _task_name(record: logging.LogRecord) -> str | None:
    """The task a Celery INFO record is about: the beat's ``Sending due task %s (%s)`` has it as
    its second argument; the worker's records carry Celery's context dict as ``record.data``."""
    data = getattr(record, "data", None)
    if isinstance(data, dict) and "name" in data:
        return str(data["name"])
    if record.name == "celery.beat" and isinstance(record.args, tuple) and len(record.args) == 2:
        return str(record.args[1])
    return None


class PeriodicTaskRunsAtDebug(logging.Filter):
    """Celery's INFO lines about a run of a beat-scheduled task (``CELERY_RUN_LOGGERS``) become
    DEBUG records: dropped unless the logger is enabled for DEBUG (``LOG_LEVEL=DEBUG``), then
    written with level DEBUG. Every other record passes unchanged: the lines of
    ``operations.execute_intent`` and of any other task not in the schedule, and every warning
    and error (a periodic task that fails is still an ERROR)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or record.name not in CELERY_RUN_LOGGERS:
            return True
        if _task_name(record) not in periodic_task_names():
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
