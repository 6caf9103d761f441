"""Prometheus metrics.

Counters are kept with ``prometheus_client``'s multiprocess mode, so the web process's
``/metrics`` sums what every worker process on the machine counted (the folder is
``PROMETHEUS_MULTIPROC_DIR``, default ``./.data/metrics``). Gauges that describe the ledger
itself (intents by state, outbox lag, UNKNOWN age) are read from PostgreSQL at scrape time, so
they are right however many machines run workers.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

from django.conf import settings

_dir = os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(Path(settings.DATA_DIR) / "metrics"))
Path(_dir).mkdir(parents=True, exist_ok=True)

# prometheus_client reads PROMETHEUS_MULTIPROC_DIR when its values are created: set it first.
from prometheus_client import (  # noqa: E402
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily  # noqa: E402
from prometheus_client.exposition import CONTENT_TYPE_LATEST  # noqa: E402

from operations.selectors import held_age_buckets, ledger_gauges, unknown_age_buckets  # noqa: E402

DELIVERIES = Counter("effect_ledger_deliveries_total", "execute_intent deliveries received")
DUPLICATE_DELIVERIES = Counter(
    "effect_ledger_duplicate_deliveries_total", "Deliveries that found nothing to claim (absorbed duplicates)"
)
ATTEMPTS = Counter("effect_ledger_attempts_total", "Attempts started (claims that won)")
IDEMPOTENCY_HITS = Counter(
    "effect_ledger_idempotency_hits_total", "Replays answered from a stored key", ["layer"]
)
ACCEPTED_EFFECTS = Counter("effect_ledger_accepted_effects_total", "Intents recorded SUCCEEDED", ["source"])
UNKNOWN_OUTCOMES = Counter("effect_ledger_unknown_outcomes_total", "Intents moved to UNKNOWN", ["cause"])
LEASE_TAKEOVERS = Counter("effect_ledger_lease_takeovers_total", "Expired leases taken over", ["to_status"])
STALE_FENCES_REJECTED = Counter(
    "effect_ledger_stale_fences_rejected_total", "Writes refused because a newer fence took over"
)
RETRIES_SCHEDULED = Counter("effect_ledger_retries_scheduled_total", "Attempts rescheduled with backoff")
IN_PROGRESS_WAITS = Counter(
    "effect_ledger_in_progress_waits_total",
    'Retries scheduled after a keyed provider answered "request in progress" (not counted against the '
    "attempt budget; issue 38)",
)
TERMINAL_FAILURES = Counter("effect_ledger_terminal_failures_total", "Intents recorded FAILED")
REQUEST_MISMATCHES = Counter(
    "effect_ledger_request_mismatches_total",
    "Intents whose stored request no longer hashes to its request_hash, refused before acting, by stage "
    "(approval: an approval refused; execution: held before the provider call; release: a release refused)",
    ["stage"],
)
REDISPATCHES = Counter(
    "effect_ledger_redispatches_total",
    "Fresh outbox messages for READY intents whose delivery was presumed lost",
)
DATABASE_RETRIES = Counter(
    "effect_ledger_database_retries_total", "Deliveries re-tried because the database was unreachable"
)
OUTBOX_PUBLISHED = Counter("effect_ledger_outbox_published_total", "Outbox messages published")
OUTBOX_PUBLISH_ERRORS = Counter(
    "effect_ledger_outbox_publish_errors_total", "Outbox publications that failed"
)
COMPENSATIONS = Counter("effect_ledger_compensations_total", "Compensation intents opened", ["cause"])
NOTIFICATIONS = Counter(
    "effect_ledger_notifications_total",
    "Notification messages to approvers and operators, by channel (email, slack) and result "
    "(sent, failed: retried later; dropped: notices whose intent moved on before they went out)",
    ["channel", "result"],
)
ESCALATIONS = Counter(
    "effect_ledger_escalations_total", "Intents escalated to operators (UNKNOWN, or a failed compensation)"
)
EFFECTS_FOUND_LATE = Counter(
    "effect_ledger_effects_found_late_total",
    "Intents that ended without effect and later evidence proved the provider has one (issue 38), "
    "by the state they had ended in",
    ["ended"],
)
DUPLICATES_FOUND = Counter(
    "effect_ledger_duplicates_found_total",
    "Extra effects found at providers without keys, by what happened to them",
    ["handling"],
)
FENCED_OUT_ATTEMPTS = Counter(
    "effect_ledger_fenced_out_attempts_total",
    "Attempts whose outcome was refused by the fence, by what the provider answered",
    ["answer"],
)
RECONCILE_ITEM_ERRORS = Counter(
    "effect_ledger_reconcile_item_errors_total", "Reconciler items that raised, by sweep", ["sweep"]
)
LOOKUPS = Counter("effect_ledger_lookups_total", "Reconciler lookups by result", ["result"])
PROVIDER_EVENTS_RECEIVED = Counter(
    "effect_ledger_provider_events_received_total",
    "Signed provider events accepted at /providers/<source>/events, by source and whether new or a redelivery",
    ["source", "delivery"],
)
PROVIDER_EVENTS_REFUSED = Counter(
    "effect_ledger_provider_events_refused_total",
    "Provider events refused with nothing stored, by reason (unknown_source, signature, invalid)",
    ["reason"],
)
PROVIDER_EVENTS_PROCESSED = Counter(
    "effect_ledger_provider_events_processed_total",
    "Provider events processed, by what they proved (applied, recorded, duplicate, orphan, ignored, deferred)",
    ["result"],
)
AUDIT_CHECKPOINTS_REFUSED = Counter(
    "effect_ledger_audit_checkpoint_refused_total",
    "Periodic audit checkpoints not signed because the log no longer holds what the previous checkpoint "
    "saw, or that checkpoint was altered (the faults are logged)",
)
RESTORES_DETECTED = Counter(
    "effect_ledger_restores_detected_total",
    "Checks that found the database behind the audit checkpoint file (execution paused)",
)
RECOVERIES = Counter(
    "effect_ledger_recoveries_total", "Recoveries run (manage.py recover or the detector)", ["result"]
)
PAUSED_CLAIMS = Counter(
    "effect_ledger_paused_claims_total", "Deliveries not claimed because execution is paused"
)
WEBHOOK_ATTEMPTS = Counter(
    "effect_ledger_webhook_attempts_total",
    "Webhook POSTs to agents by result: delivered (2xx), retry (scheduled again), failed (the last attempt)",
    ["result"],
)
RESTORE_GUARD_CHECKS = Counter(
    "effect_ledger_restore_guard_checks_total",
    "Look-ups before a send under the restore guard, by what they decided",
    ["decision"],
)
PROVIDER_SECONDS = Histogram(
    "effect_ledger_provider_call_seconds",
    "Adapter execute duration in seconds",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)


class ProcessFilesCollector:
    """``prometheus_client``'s multiprocess merge over the files of ``PROMETHEUS_MULTIPROC_DIR``,
    leaving out a file too short to hold its header (under 8 bytes): what a process killed while
    creating its file leaves behind. ``MultiProcessCollector`` reads every ``*.db`` file and
    raises ``struct.error`` on such a one, which turned ``/metrics`` and the dashboard into a 500
    for as long as the file stayed (found in CI)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def collect(self) -> Any:
        """The merged metrics of every readable file (counters summed across processes)."""
        files = [f for f in glob.glob(os.path.join(self.path, "*.db")) if _holds_a_header(f)]
        return multiprocess.MultiProcessCollector.merge(files, accumulate=True)  # type: ignore[no-untyped-call]


def _holds_a_header(path: str) -> bool:
    try:
        return os.path.getsize(path) >= 8
    except OSError:  # removed meanwhile
        return False


def render_metrics() -> tuple[bytes, str]:
    """Prometheus text for ``/metrics``: every process's counters plus ledger gauges.

    Returns ``(body, content_type)``.
    """
    registry = CollectorRegistry()
    registry.register(ProcessFilesCollector(os.environ["PROMETHEUS_MULTIPROC_DIR"]))

    class LedgerCollector:
        def collect(self) -> Any:
            gauges = ledger_gauges()
            by_status = GaugeMetricFamily(
                "effect_ledger_intents",
                "Intents by state: open states exact, the others from the status rollup",
                labels=["status"],
            )
            for status, count in gauges["by_status"].items():
                if count is not None:  # no rollup yet and too many to count: absent, not 0
                    by_status.add_metric([status], count)
            yield by_status
            rollup_age = gauges["status_counts"].rollup_age_seconds
            if rollup_age is not None:
                yield GaugeMetricFamily(
                    "effect_ledger_intents_rollup_age_seconds",
                    "Seconds since the settled states of effect_ledger_intents were counted",
                    value=rollup_age,
                )
            yield GaugeMetricFamily(
                "effect_ledger_outbox_oldest_pending_seconds",
                "Seconds since the oldest unsent due outbox message became due (0 when none)",
                value=gauges["outbox_oldest_pending_seconds"],
            )
            yield GaugeMetricFamily(
                "effect_ledger_outbox_pending",
                "Unsent outbox messages that are due (the backlog)",
                value=gauges["outbox_pending"],
            )
            yield GaugeMetricFamily(
                "effect_ledger_outbox_scheduled",
                "Unsent outbox messages waiting for their due time (a retry's backoff; not lag)",
                value=gauges["outbox_scheduled"],
            )
            by_age = GaugeMetricFamily(
                "effect_ledger_unknown_by_age", "UNKNOWN intents by age bucket", labels=["age"]
            )
            for label, count in unknown_age_buckets().items():
                by_age.add_metric([label], count)
            yield by_age
            yield GaugeMetricFamily(
                "effect_ledger_unknown_oldest_seconds",
                "Age of the oldest UNKNOWN intent (reconciliation wait; 0 when none)",
                value=gauges["unknown_oldest_seconds"],
            )
            held_by_age = GaugeMetricFamily(
                "effect_ledger_held_by_age",
                "HELD intents (waiting behind an earlier intent for the same business action) by age bucket",
                labels=["age"],
            )
            for label, count in held_age_buckets().items():
                held_by_age.add_metric([label], count)
            yield held_by_age
            yield GaugeMetricFamily(
                "effect_ledger_held_oldest_seconds",
                "Age of the oldest HELD intent, since submission (0 when none)",
                value=gauges["held_oldest_seconds"],
            )
            yield GaugeMetricFamily(
                "effect_ledger_held_likely_duplicates",
                "HELD intents whose earlier intent SUCCEEDED: likely duplicates waiting for a person",
                value=gauges["held_likely_duplicates"],
            )
            # The health page's database figures (two indexed reads; the broker is not asked here).
            # Imported here: the health selectors import the adapters, which import this module.
            from operations.selectors.health import periodic_jobs, worker_heartbeats

            workers = GaugeMetricFamily(
                "effect_ledger_workers",
                "Workers by heartbeat state (alive, late, gone, stopped), as the health page judges them",
                labels=["state"],
            )
            states = dict.fromkeys(("alive", "late", "gone", "stopped"), 0)
            for worker in worker_heartbeats():
                states[worker.state] += 1
            for state, count in states.items():
                workers.add_metric([state], count)
            yield workers
            job_age = GaugeMetricFamily(
                "effect_ledger_periodic_job_age_seconds",
                "Seconds since a periodic job (outbox relay, reconciler) last finished; absent: never ran",
                labels=["job"],
            )
            for job in periodic_jobs():
                if job["ran"]:
                    job_age.add_metric([job["name"]], job["age_seconds"])
            yield job_age

    registry.register(LedgerCollector())
    return generate_latest(registry), CONTENT_TYPE_LATEST


def process_counters() -> dict[str, float]:
    """Counters summed over every process on this machine that wrote to the Prometheus
    multiprocess folder (``PROMETHEUS_MULTIPROC_DIR``): duplicate deliveries absorbed and stale
    fences rejected. Machines other than this one are not included; ``/metrics`` scraped by
    Prometheus is the fleet-wide source."""
    from prometheus_client import CollectorRegistry

    wanted = {
        "effect_ledger_duplicate_deliveries_total": "duplicate_deliveries",
        "effect_ledger_stale_fences_rejected_total": "stale_fences_rejected",
    }
    totals = dict.fromkeys(wanted.values(), 0.0)
    registry = CollectorRegistry()
    registry.register(ProcessFilesCollector(os.environ["PROMETHEUS_MULTIPROC_DIR"]))
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name in wanted:
                totals[wanted[sample.name]] += sample.value
    return totals
