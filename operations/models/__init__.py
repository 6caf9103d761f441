"""The ledger's tables, one module per aggregate (Django's convention for a models package:
this module imports every model, so ``from operations.models import X`` finds each of them).

An ``Intent`` changes state only through ``operations.services`` (one function per transition,
each a conditional UPDATE plus its ``AuditEvent``). ``Attempt`` and ``AuditEvent`` rows are
insert-only history.
"""

from __future__ import annotations

from operations.models.access import ALL_TENANTS, RoleGrant
from operations.models.agents import Agent, AgentToken
from operations.models.approvals import Approval
from operations.models.archive import ArchivedIntent, ArchiveSegment
from operations.models.audit import AuditCheckpoint, AuditEvent
from operations.models.ceilings import Reservation, SpendWindow
from operations.models.health import PeriodicJobRun, WorkerHeartbeat
from operations.models.intents import (
    ALLOWED_TRANSITIONS,
    ENDED_WITHOUT_EFFECT,
    OPEN_STATUS_VALUES,
    OPEN_STATUSES,
    SETTLED_STATUS_VALUES,
    STATUS_VALUES,
    TERMINAL_STATUSES,
    Attempt,
    Intent,
    Outcome,
)
from operations.models.leases import Lease
from operations.models.notifications import Notification, NotificationDelivery, NotificationRecipient
from operations.models.outbox import OutboxMessage
from operations.models.rate_windows import RateWindow
from operations.models.restore import FENCE_EPOCH_STRIDE, ExecutionControl, RecoveryRun
from operations.models.scheduling import BeatHeartbeat, PeriodicClaim
from operations.models.status_rollup import StatusRollup
from operations.models.waiters import IntentWaiter
from operations.models.webhooks import WebhookDelivery

__all__ = [
    "ALLOWED_TRANSITIONS",
    "ALL_TENANTS",
    "ENDED_WITHOUT_EFFECT",
    "FENCE_EPOCH_STRIDE",
    "OPEN_STATUSES",
    "OPEN_STATUS_VALUES",
    "SETTLED_STATUS_VALUES",
    "STATUS_VALUES",
    "TERMINAL_STATUSES",
    "Agent",
    "AgentToken",
    "Approval",
    "ArchiveSegment",
    "ArchivedIntent",
    "Attempt",
    "AuditCheckpoint",
    "AuditEvent",
    "BeatHeartbeat",
    "ExecutionControl",
    "Intent",
    "IntentWaiter",
    "Lease",
    "Notification",
    "NotificationDelivery",
    "NotificationRecipient",
    "Outcome",
    "OutboxMessage",
    "RateWindow",
    "PeriodicClaim",
    "PeriodicJobRun",
    "RecoveryRun",
    "Reservation",
    "RoleGrant",
    "SpendWindow",
    "StatusRollup",
    "WebhookDelivery",
    "WorkerHeartbeat",
]
