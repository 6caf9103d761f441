"""Provider calls of the last hour for the health page (``operations.selectors.health``): per
action, counts by outcome, the share without a definite answer and the call times' percentiles,
judged by ``HEALTH_PROVIDER_*``.
"""

from __future__ import annotations

from typing import Any

from django.db import connection

from operations.access.tenants import EVERY_TENANT, TenantScope
from operations.adapters.registry import adapter_label
from operations.models import Attempt, Intent
from operations.selectors.health_levels import AMBER, GREEN, RED, Signal, health_settings, worst

#: Attempt results counted as provider trouble: no definite answer (a timeout, a 5xx or 429 that
#: is retried, an ambiguous call, a lease that expired mid-call). ``failed`` is not one: it is
#: the provider's definite refusal (a card declined, a reservation not found), a working
#: provider doing its job, and a shop that declines many cards must not see its provider red
#: (reviewer's finding). It is still shown among the outcomes.
FAILURE_RESULTS = (
    Attempt.Result.UNKNOWN,
    Attempt.Result.RETRY,
    Attempt.Result.ABANDONED,
)
#: Attempt results whose duration is a provider call's (claim to record); ``skipped`` sent
#: nothing, ``pending`` has not ended, ``abandoned`` ended at the lease's expiry, not a call's.
TIMED_RESULTS = (
    Attempt.Result.SUCCEEDED,
    Attempt.Result.FAILED,
    Attempt.Result.RETRY,
    Attempt.Result.UNKNOWN,
    Attempt.Result.FENCED_OUT,
)


_PROVIDER_STATS_SQL = f"""
    SELECT i.action,
           count(*) AS calls,
           {", ".join(f"count(*) FILTER (WHERE a.result = '{r.value}')" for r in Attempt.Result)},
           percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM a.finished_at - a.started_at))
               FILTER (WHERE a.result = ANY(%(timed)s)),
           percentile_cont(0.95) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM a.finished_at - a.started_at))
               FILTER (WHERE a.result = ANY(%(timed)s))
    FROM {Attempt._meta.db_table} a JOIN {Intent._meta.db_table} i ON i.id = a.intent_id
    WHERE a.started_at >= statement_timestamp() - make_interval(secs => %(window)s)
      AND (%(every)s OR i.tenant = ANY(%(tenants)s))
    GROUP BY i.action ORDER BY i.action
"""


def provider_call_stats(
    *, scope: TenantScope = EVERY_TENANT, window_seconds: float = 3600.0
) -> list[dict[str, Any]]:
    """Provider calls (attempts) started in the last ``window_seconds``, per action: counts by
    outcome, failures, and the 50th and 95th percentiles of claim-to-record time in seconds.

    One aggregate query: a range scan of ``attempt_started`` joined to the intents for their
    action and tenant (``scope``: a console reader's tenants; attempts belong to intents, so to
    tenants). Each row is judged by its failure share (``HEALTH_PROVIDER_FAILURE_AMBER`` /
    ``_RED``) and its p95 (``HEALTH_PROVIDER_P95_AMBER_SECONDS`` / ``_RED_SECONDS``).
    """
    results = [r.value for r in Attempt.Result]
    with connection.cursor() as cursor:
        cursor.execute(
            _PROVIDER_STATS_SQL,
            {
                "timed": [r.value for r in TIMED_RESULTS],
                "window": window_seconds,
                "every": scope.every,
                "tenants": sorted(scope.names),
            },
        )
        rows = cursor.fetchall()
    config = health_settings()
    stats = []
    for row in rows:
        action, calls = row[0], int(row[1])
        by_result = dict(zip(results, (int(n) for n in row[2 : 2 + len(results)]), strict=True))
        p50, p95 = row[2 + len(results)], row[3 + len(results)]
        failures = sum(by_result[r.value] for r in FAILURE_RESULTS)
        ended = calls - by_result[Attempt.Result.PENDING]
        share = failures / ended if ended else 0.0
        level = GREEN
        if share >= float(config["HEALTH_PROVIDER_FAILURE_RED"]) or (
            p95 is not None and p95 > float(config["HEALTH_PROVIDER_P95_RED_SECONDS"])
        ):
            level = RED
        elif share >= float(config["HEALTH_PROVIDER_FAILURE_AMBER"]) or (
            p95 is not None and p95 > float(config["HEALTH_PROVIDER_P95_AMBER_SECONDS"])
        ):
            level = AMBER
        stats.append(
            {
                "action": action,
                "adapter": adapter_label(action),
                "calls": calls,
                "by_result": by_result,
                "outcomes": [(r.value, by_result[r.value]) for r in Attempt.Result if by_result[r.value]],
                "failures": failures,
                "failure_share": share,
                "p50_seconds": float(p50) if p50 is not None else None,
                "p95_seconds": float(p95) if p95 is not None else None,
                "level": level,
            }
        )
    return stats


def providers_signal(stats: list[dict[str, Any]]) -> Signal:
    """The worst action; green with no call in the window."""
    if not stats:
        return Signal("providers", "Provider calls (last hour)", GREEN, "no call in the last hour")
    calls = sum(s["calls"] for s in stats)
    failures = sum(s["failures"] for s in stats)
    bad = [s["action"] for s in stats if s["level"] != GREEN]
    summary = f"{calls} calls, {failures} without a definite answer" + (
        f"; look at {', '.join(bad)}" if bad else ""
    )
    return Signal("providers", "Provider calls (last hour)", worst(*(s["level"] for s in stats)), summary)
