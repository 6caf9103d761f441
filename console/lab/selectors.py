"""Reads for the lab's pages."""

from __future__ import annotations

from console.lab.models import DrillRun


def drill_runs(*, limit: int = 50) -> list[DrillRun]:
    """The newest crash-lab and acceptance runs."""
    return list(DrillRun.objects.order_by("-started_at")[:limit])
