"""Periodic reconciliation tasks (scheduled by Celery beat, see ``console/celery.py``)."""

from __future__ import annotations

from celery import shared_task

from reconciliation import services


@shared_task(name="reconciliation.reconcile")
def reconcile() -> dict[str, int]:
    """One reconciliation pass: expired leases, expired approvals, stalled READY intents."""
    leases = services.take_over_expired_leases()
    approvals = services.expire_approvals()
    stalled = services.redispatch_stalled_ready()
    return {"leases": leases.moved, "approvals_expired": approvals.moved, "redispatched": stalled.moved}
