"""The execution state after failovers and restores, for the dashboard (issue 22)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from operations.models import ExecutionControl, RecoveryRun
from operations.restore.check import Detection, restore_detection

#: Recovery runs shown on the dashboard.
RECENT_RECOVERIES = 5


@dataclass(frozen=True)
class ExecutionStatus:
    """Whether execution runs, the fence epoch, the restore guard's end (None: off), the
    latest recovery runs (newest first) and what the restore check can say now (``level``,
    ``behind`` before any worker or beat acted on it, ``blind``, ``foreign``)."""

    paused_at: datetime | None
    pause_reason: str
    paused_by: str
    fence_epoch: int
    guard_until: datetime | None
    recoveries: list[RecoveryRun]
    detection: Detection


def execution_status() -> ExecutionStatus:
    """The control row, the newest ``RECENT_RECOVERIES`` recovery runs, and the restore check
    (a few kilobytes of the checkpoint file and a few small reads)."""
    control = ExecutionControl.objects.filter(id=1).first() or ExecutionControl()
    return ExecutionStatus(
        paused_at=control.paused_at,
        pause_reason=control.pause_reason,
        paused_by=control.paused_by,
        fence_epoch=control.fence_epoch,
        guard_until=control.guard_until,
        recoveries=list(RecoveryRun.objects.order_by("-started_at", "-id")[:RECENT_RECOVERIES]),
        detection=restore_detection(),
    )
