"""Intents by state, the one rule for the dashboard and ``/metrics``: the open states counted
exactly, the settled ones read from the status rollup with its age."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import partial

from django.conf import settings
from django.db import connection
from django.db.models import Count, DurationField, ExpressionWrapper, F
from django.db.models.functions import Now

from operations.access.tenants import EVERY_TENANT, TenantScope
from operations.models import (
    ALL_TENANTS,
    OPEN_STATUS_VALUES,
    SETTLED_STATUS_VALUES,
    STATUS_VALUES,
    Intent,
    StatusRollup,
)

#: While no rollup has run (a new installation, a test), the settled states are counted exactly
#: when there are at most this many of them; past it they show as not computed yet. The check
#: reads at most this many rows plus one, however large the table.
EXACT_FALLBACK_LIMIT = 10_000

#: A rollup older than this many periods is flagged: the beat is probably not running.
STALE_AFTER_PERIODS = 3


@dataclass(frozen=True)
class StatusCount:
    """One state's count: ``count`` is None when it is not known yet; ``exact`` when it was
    counted by this request rather than read from the rollup."""

    status: str
    count: int | None
    exact: bool


@dataclass(frozen=True)
class StatusCounts:
    """Intents by state.

    * ``open``: the open states (``OPEN_STATUS_VALUES``), exact, in declaration order.
    * ``settled``: SUCCEEDED and the terminal states, in declaration order, from the rollup
      (``source == "rollup"``, as of ``rollup_age_seconds`` ago, database clock), or counted
      exactly because no rollup exists and there are few (``"exact"``), or unknown (``"missing"``).
    * ``rollup_period_seconds``: how often the beat recounts them.
    """

    open: list[StatusCount]
    settled: list[StatusCount]
    source: str
    rollup_computed_at: datetime | None
    rollup_age_seconds: float | None
    rollup_period_seconds: float

    @property
    def by_status(self) -> dict[str, int | None]:
        """Every state's count (None: not computed yet), in ``Intent.Status`` order."""
        counts = {row.status: row.count for row in (*self.open, *self.settled)}
        return {status: counts[status] for status in STATUS_VALUES}

    @property
    def rollup_stale(self) -> bool:
        """The rollup is older than ``STALE_AFTER_PERIODS`` periods (is the beat running?)."""
        age = self.rollup_age_seconds
        return age is not None and age > STALE_AFTER_PERIODS * self.rollup_period_seconds


def intent_status_counts(*, scope: TenantScope = EVERY_TENANT) -> StatusCounts:
    """Intents of the tenants in ``scope`` by state, for the dashboard and ``/metrics`` (see
    ``StatusCounts``); ``/metrics`` counts every tenant, the dashboard its reader's tenants.

    Two small reads whatever the table size: the open states with one ``GROUP BY`` served by the
    partial index ``intent_open_status`` (the open rows only, then those of the scope's tenants),
    and the rollup's rows (``operations.services.status_rollup_refresh``, every
    ``STATUS_ROLLUP_PERIOD_SECONDS``): the six every-tenant rows, plus one row per (tenant, state)
    of a scope that names tenants, summed here. Only while no rollup exists, a third read counts
    at most ``EXACT_FALLBACK_LIMIT`` + 1 rows.
    """
    open_counts = dict.fromkeys(OPEN_STATUS_VALUES, 0)
    rows = (
        Intent.objects.filter(scope.q(), status__in=OPEN_STATUS_VALUES)
        .values("status")
        .annotate(n=Count("*"))
    )
    for row in rows.order_by():
        open_counts[row["status"]] = row["n"]
    counted = partial(
        StatusCounts,
        open=[StatusCount(status, count, exact=True) for status, count in open_counts.items()],
        rollup_period_seconds=float(settings.EFFECT_LEDGER["STATUS_ROLLUP_PERIOD_SECONDS"]),
    )
    tenants = [ALL_TENANTS] if scope.every else [ALL_TENANTS, *sorted(scope.names)]
    rollup = list(
        StatusRollup.objects.filter(tenant__in=tenants)
        .annotate(age=ExpressionWrapper(Now() - F("computed_at"), output_field=DurationField()))
        .values("tenant", "status", "count", "computed_at", "age")
    )
    if any(row["tenant"] == ALL_TENANTS for row in rollup):
        by_status: dict[str, int] = {}
        for row in rollup:
            if (row["tenant"] == ALL_TENANTS) == scope.every:
                by_status[row["status"]] = by_status.get(row["status"], 0) + row["count"]
        oldest = min(rollup, key=lambda row: row["computed_at"])
        return counted(
            settled=[
                StatusCount(status, by_status.get(status, 0), exact=False) for status in SETTLED_STATUS_VALUES
            ],
            source="rollup",
            rollup_computed_at=oldest["computed_at"],
            rollup_age_seconds=max(0.0, oldest["age"].total_seconds()),
        )
    few = _settled_counts_if_few(scope)
    return counted(
        settled=[
            StatusCount(status, None if few is None else few.get(status, 0), exact=few is not None)
            for status in SETTLED_STATUS_VALUES
        ],
        source="missing" if few is None else "exact",
        rollup_computed_at=None,
        rollup_age_seconds=None,
    )


def _settled_counts_if_few(scope: TenantScope) -> dict[str, int] | None:
    """Exact counts of the settled states of the scope's tenants when there are at most
    ``EXACT_FALLBACK_LIMIT`` of them, else None; reads at most that many rows plus one."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT status, count(*) FROM (SELECT status FROM operations_intent WHERE status = ANY(%s)"
            " AND (%s OR tenant = ANY(%s)) LIMIT %s) AS capped GROUP BY status",
            [SETTLED_STATUS_VALUES, scope.every, sorted(scope.names), EXACT_FALLBACK_LIMIT + 1],
        )
        counts = {status: int(count) for status, count in cursor.fetchall()}
    return None if sum(counts.values()) > EXACT_FALLBACK_LIMIT else counts
