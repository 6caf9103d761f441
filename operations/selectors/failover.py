"""The execution state after failovers and restores, for the dashboard (issue 22)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from operations.models import ExecutionControl, RecoveryRun

#: Recovery runs shown on the dashboard.
RECENT_RECOVERIES = 5


@dataclass(frozen=True)
class ExecutionStatus:
    """Whether execution runs, the fence epoch, the restore guard's end (None: off) and the
    latest recovery runs, newest first."""

    paused_at: datetime | None
    pause_reason: str
    paused_by: str
    fence_epoch: int
    guard_until: datetime | None
    recoveries: list[RecoveryRun]


def execution_status() -> ExecutionStatus:
    """Two small reads: the control row and the newest ``RECENT_RECOVERIES`` recovery runs."""
    control = ExecutionControl.objects.filter(id=1).first() or ExecutionControl()
    return ExecutionStatus(
        paused_at=control.paused_at,
        pause_reason=control.pause_reason,
        paused_by=control.paused_by,
        fence_epoch=control.fence_epoch,
        guard_until=control.guard_until,
        recoveries=list(RecoveryRun.objects.order_by("-started_at", "-id")[:RECENT_RECOVERIES]),
    )
