"""Effect Ledger's own settings: the sandbox provider, provider event secrets, declared providers,
the ``EFFECT_LEDGER`` tuning (leases, beats, health thresholds, webhooks, notifications) and the
policies per action. Part of ``console.settings`` (which imports every name), the module
``DJANGO_SETTINGS_MODULE`` names.
"""

from __future__ import annotations

import json
from typing import Any

from console.env import env_bool, env_float, env_int, env_json_file, env_list, env_period, env_str
from console.settings_core import DATA_DIR, DEBUG
from operations.adapters.secrets import PUBLISHED_SANDBOX_EVENTS_SECRET
from operations.api.rates import rate_parse


def _rate(name: str, default: str) -> str | None:
    """A rate variable (``"600/min"``; ``off``: no limit), refused at start-up when malformed."""
    raw = env_str(name, default)
    try:
        return raw if rate_parse(raw) is not None else None
    except ValueError as exc:
        raise ValueError(f"environment variable {name}: {exc}") from exc


def _tenant_days(name: str) -> dict[str, float]:
    """A JSON object of tenant -> days (each a finite number of at least 1), refused at start-up
    naming the variable when malformed; unset or empty: ``{}``."""
    raw = env_str(name)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ValueError(
            f"environment variable {name} must be a JSON object of tenant to days: {exc}"
        ) from exc
    if not isinstance(value, dict):
        raise ValueError(
            f'environment variable {name} must be a JSON object of tenant to days, e.g. {{"acme": 365}}'
        )
    for tenant, days in value.items():
        if isinstance(days, bool) or not isinstance(days, int | float) or not 1 <= days < 100_000:
            raise ValueError(
                f"environment variable {name}: tenant {tenant!r} needs days from 1 to 99999, got {days!r}"
            )
    return {str(tenant): float(days) for tenant, days in value.items()}


# The sandbox provider (the project's own test double): its actions (payments.charge, email.send,
# reservations.*) and its event inboxes exist only with this on. On by default with DJANGO_DEBUG
# and in embedded mode (no DATABASE_URL: the quick start's own database), so a manage.py command
# run beside the quick start (resolve, reconcile_statement) serves what its workers serve; the
# lab turns it on for the processes it starts (console.lab.enable_sandbox). A production
# configuration (DATABASE_URL set) leaves it off, so its published event secret opens nothing
# (issue 33 item 6).
EFFECT_LEDGER_SANDBOX = env_bool("EFFECT_LEDGER_SANDBOX", DEBUG or not env_str("DATABASE_URL"))
# The sandbox provider's base URL (manage.py sandbox_provider; quickstart sets it from --sandbox-port).
SANDBOX_PROVIDER_URL = env_str("SANDBOX_PROVIDER_URL", "http://127.0.0.1:8765")
# Where ``manage.py sandbox_provider`` keeps its data (a libpq URL); empty: a database of its own
# on the ledger's server, ``<ledger database>_sandbox``, created when missing. Never the ledger's
# database by default, so restoring the ledger does not roll the provider back.
SANDBOX_DATABASE_URL = env_str("SANDBOX_DATABASE_URL")
# Seconds the sandbox's read paths may miss an effect that exists (its capabilities' consistency
# windows): duplicate checks keep looking this long after an intent ends.
SANDBOX_EMAIL_CONSISTENCY_WINDOW_SECONDS = env_float("SANDBOX_EMAIL_CONSISTENCY_WINDOW_SECONDS", 120.0)
# The same for the sandbox's reservations.create: seconds a late second booking may stay unlisted.
SANDBOX_RESERVATIONS_CONSISTENCY_WINDOW_SECONDS = env_float(
    "SANDBOX_RESERVATIONS_CONSISTENCY_WINDOW_SECONDS", 60.0
)

# The Standard Webhooks secret the sandbox provider signs its events with (``whsec_`` and
# base64), for all three sandbox event sources. The sandbox is a test double: its default secret
# is public; a real provider's secret goes in EFFECT_LEDGER_PROVIDER_EVENT_SECRETS.
SANDBOX_EVENTS_SECRET = env_str("SANDBOX_EVENTS_SECRET", PUBLISHED_SANDBOX_EVENTS_SECRET)
# Where the sandbox provider POSTs its events (``manage.py sandbox_provider --events-url``):
# the ledger's ``/providers/`` prefix, e.g. http://127.0.0.1:8000/providers/; empty: no events
# (quickstart sets it).
SANDBOX_EVENTS_URL = env_str("SANDBOX_EVENTS_URL")
# Event secrets of other sources, by source name: {"acme-pay": "whsec_..."} (JSON).
EFFECT_LEDGER_PROVIDER_EVENT_SECRETS: dict[str, str] = json.loads(
    env_str("EFFECT_LEDGER_PROVIDER_EVENT_SECRETS") or "{}"
)

# Real providers, declared not coded (docs/how-to/connect-a-provider.md): a JSON file mapping each HTTP action
# to its contract (operations/adapters/contract.py), and one mapping each mail action to its
# SMTP relay (operations/adapters/smtp/). A file that cannot be read stops the process, naming it.
EFFECT_LEDGER_GENERIC_HTTP: dict[str, Any] = env_json_file("EFFECT_LEDGER_GENERIC_HTTP_FILE")
# Real mail relays for the SMTP adapter (operations/adapters/smtp/): a JSON file mapping each mail
# action to its relay; secrets named as env:NAME or file:PATH, never written in it.
EFFECT_LEDGER_SMTP: dict[str, Any] = env_json_file("EFFECT_LEDGER_SMTP_FILE")

EFFECT_LEDGER: dict[str, Any] = {
    # Seconds a worker's claim on an intent lasts; the provider deadline is at most half of it
    # (operations.engine.protocol.provider_deadline_seconds).
    "LEASE_SECONDS": env_int("EFFECT_LEDGER_LEASE_SECONDS", 30),
    # Seconds a provider call may take in all (connect, send, headers, body: one wall-clock deadline),
    # but at most half the lease and PROVIDER_DEADLINE_MARGIN_SECONDS below it; a lookup's deadline.
    "PROVIDER_TIMEOUT_SECONDS": env_float("EFFECT_LEDGER_PROVIDER_TIMEOUT_SECONDS", 10.0),
    # Seconds the provider deadline stays below the lease at least (operations.engine.protocol
    # .provider_deadline_seconds): time to re-check before the call and record after it.
    # ``manage.py check`` refuses a margin not shorter than the lease (operations.E002).
    "PROVIDER_DEADLINE_MARGIN_SECONDS": env_float("EFFECT_LEDGER_PROVIDER_DEADLINE_MARGIN_SECONDS", 1.0),
    # Bytes of a provider's answer that are read at most; past it the answer is ambiguous and
    # only its digest is kept (operations/adapters/http_support.py). ``manage.py check`` refuses a
    # cap that is not a positive number (operations.E002).
    "PROVIDER_RESPONSE_MAX_BYTES": env_int("EFFECT_LEDGER_PROVIDER_RESPONSE_MAX_BYTES", 1024 * 1024),
    # Outbox rows the relay publishes per pass and kind at most.
    "OUTBOX_BATCH": env_int("EFFECT_LEDGER_OUTBOX_BATCH", 100),
    # When set, /metrics answers only requests with "Authorization: Bearer <this token>" (a
    # Prometheus scrape config's `authorization: {credentials_file: ...}`); empty: open.
    "METRICS_TOKEN": env_str("EFFECT_LEDGER_METRICS_TOKEN"),
    # Seconds a web process keeps an agent token it verified (operations/api/authentication.py): a
    # revoked, deactivated or deleted agent is refused, and a change to it (its tenant) seen, by
    # every process within this bound (never past the token's expiry). 0 = no cache.
    "TOKEN_CACHE_SECONDS": env_float("EFFECT_LEDGER_TOKEN_CACHE_SECONDS", 5.0),
    # API requests per agent and per tenant (all its agents together), across every web process
    # (operations/api/throttling.py): "<n>/<s|min|hour|day>", or "off"; past either, 429 with
    # Retry-After; a malformed rate refuses to start. The tenant's limit is what keeps one tenant from
    # starving the others.
    "RATE_AGENT": _rate("EFFECT_LEDGER_RATE_AGENT", "600/min"),
    # API requests of all one tenant's agents together, across every web process (same format).
    "RATE_TENANT": _rate("EFFECT_LEDGER_RATE_TENANT", "3000/min"),
    # Beat period in seconds of the outbox relay's safety net (console/celery.py); the threshold for a
    # stalled READY intent follows it (operations.workers.delivery.stalled_ready_seconds).
    "RELAY_PERIOD_SECONDS": env_period("EFFECT_LEDGER_RELAY_PERIOD_SECONDS", 2.0),
    # Beat period in seconds of the reconciler (UNKNOWN lookups, duplicates, HELD decisions, ...).
    "RECONCILE_PERIOD_SECONDS": env_period("EFFECT_LEDGER_RECONCILE_PERIOD_SECONDS", 5.0),
    # The statement reconciliation runs daily (beat: 02:00 UTC, yesterday's statements); the
    # health page judges its age by this period (issue 19). Shorter than a day (the lab, drills),
    # the beat schedules it every this many seconds instead; each source and day still gets one
    # scheduled run (reconciliation.statements, issue 35).
    "STATEMENT_PERIOD_SECONDS": env_period("EFFECT_LEDGER_STATEMENT_PERIOD_SECONDS", 86400.0),
    # Days a reconciliation run (a pass that did or found something) is kept.
    "RECONCILIATION_RUN_RETENTION_DAYS": env_float("EFFECT_LEDGER_RECONCILIATION_RUN_RETENTION_DAYS", 7),
    # Intents a reconciler pass takes at most, per kind of work (UNKNOWN, HELD, duplicates).
    "RECONCILE_BATCH": env_int("EFFECT_LEDGER_RECONCILE_BATCH", 500),
    # Seconds the oldest due, unsent outbox row may wait before the health page shows the outbox
    # amber (and a reconciler pass reports outbox_lag_warning).
    "OUTBOX_LAG_WARNING_SECONDS": env_int("EFFECT_LEDGER_OUTBOX_LAG_WARNING_SECONDS", 60),
    # Signed audit checkpoints (operations/audit/checkpoints.py): the Ed25519 private key (PEM,
    # PKCS#8) that signs them, in a file, never in the database; keep it off the database host and
    # out of its backups.
    "AUDIT_SIGNING_KEY_FILE": env_str(
        "EFFECT_LEDGER_AUDIT_SIGNING_KEY_FILE", str(DATA_DIR / "audit-signing-key.pem")
    ),
    # Create that key file (mode 0600) on first use when it is missing; on by default in embedded
    # mode only (no DATABASE_URL), as quickstart runs.
    "AUDIT_SIGNING_KEY_CREATE": env_bool(
        "EFFECT_LEDGER_AUDIT_SIGNING_KEY_CREATE", not env_str("DATABASE_URL")
    ),
    # A public key (PEM) to verify checkpoints with, for an auditor's copy without the private key;
    # empty: derived from the private key.
    "AUDIT_PUBLIC_KEY_FILE": env_str("EFFECT_LEDGER_AUDIT_PUBLIC_KEY_FILE"),
    # Every checkpoint is also appended to this file (one JSON line) and logged; ship both away.
    "AUDIT_CHECKPOINT_FILE": env_str(
        "EFFECT_LEDGER_AUDIT_CHECKPOINT_FILE", str(DATA_DIR / "audit-checkpoints.jsonl")
    ),
    # Beat period in seconds of audit checkpoints; one is signed only when the chains' heads changed.
    "AUDIT_CHECKPOINT_PERIOD_SECONDS": env_period("EFFECT_LEDGER_AUDIT_CHECKPOINT_PERIOD_SECONDS", 300.0),
    # When the database goes back in time (issue 22, docs/explanation/failover.md): workers on
    # start and the beat every RESTORE_CHECK_PERIOD_SECONDS compare it with the checkpoint file;
    # behind, execution pauses and (RECOVER_AUTOMATICALLY) recovery runs. For RESTORE_GUARD_SECONDS
    # after a recovery, sends to providers without keys are looked up first.
    "RESTORE_CHECK_PERIOD_SECONDS": env_period("EFFECT_LEDGER_RESTORE_CHECK_PERIOD_SECONDS", 30.0),
    # When the check finds the database behind, recover at once; off: execution stays paused until
    # ``manage.py recover``.
    "RECOVER_AUTOMATICALLY": env_bool("EFFECT_LEDGER_RECOVER_AUTOMATICALLY", True),
    # Seconds before the newest kept checkpoint (``recover``'s --since) that recovery looks at as well.
    "RECOVERY_MARGIN_SECONDS": env_float("EFFECT_LEDGER_RECOVERY_MARGIN_SECONDS", 60.0),
    # Seconds after a recovery during which sends to providers without keys are looked up first;
    # ``manage.py check`` warns (operations.W004) when it ends before a lease plus a consistency window.
    "RESTORE_GUARD_SECONDS": env_float("EFFECT_LEDGER_RESTORE_GUARD_SECONDS", 86400.0),
    # Retention and archive (operations/archive/, docs/how-to/archive.md). Days a settled intent
    # (SUCCEEDED or a terminal state, no open finding, nothing open pointing at it) stays in the live
    # tables after it settled; then the periodic archive (every ARCHIVE_PERIOD_SECONDS) writes it
    # with everything about it to a signed archive file and deletes its rows. At least 1 day.
    "INTENT_RETENTION_DAYS": env_float("EFFECT_LEDGER_INTENT_RETENTION_DAYS", 90.0, minimum=1.0),
    # Days per tenant that override INTENT_RETENTION_DAYS: a JSON object {"tenant": days}, e.g.
    # '{"acme": 365}' (each at least 1 day).
    "TENANT_RETENTION_DAYS": _tenant_days("EFFECT_LEDGER_TENANT_RETENTION_DAYS"),
    # Days after an intent settled during which its Idempotency-Key still replays from the archive
    # index (never a new intent); after it a submit with that key makes a new intent. Never
    # shorter than any intent retention (``manage.py check`` refuses it: operations.E007).
    "KEY_RETENTION_DAYS": env_float("EFFECT_LEDGER_KEY_RETENTION_DAYS", 400.0, minimum=1.0),
    # Where the archive files and their signed manifests are written (one directory per month).
    # Keep it on storage the database's administrators cannot rewrite, or copy it there.
    "ARCHIVE_DIR": env_str("EFFECT_LEDGER_ARCHIVE_DIR", str(DATA_DIR / "archive")),
    # Beat period of the periodic archive (seconds); each pass archives what INTENT_RETENTION_DAYS
    # says is due, a segment file per day of settlement.
    "ARCHIVE_PERIOD_SECONDS": env_period("EFFECT_LEDGER_ARCHIVE_PERIOD_SECONDS", 3600.0),
    # Intents deleted per transaction once archived (each transaction locks this many intents).
    "ARCHIVE_DELETE_BATCH": env_int("EFFECT_LEDGER_ARCHIVE_DELETE_BATCH", 500, minimum=1),
    # Intents one archive file holds at most (a day with more is written as several parts).
    "ARCHIVE_SEGMENT_INTENTS": env_int("EFFECT_LEDGER_ARCHIVE_SEGMENT_INTENTS", 50000, minimum=1),
    # Beat period of the status rollup (operations.services.status_rollup_refresh): the counts
    # of SUCCEEDED and the terminal states the dashboard and /metrics show are at most about
    # this old; the open states are counted exactly on every request.
    "STATUS_ROLLUP_PERIOD_SECONDS": env_period("EFFECT_LEDGER_STATUS_ROLLUP_PERIOD_SECONDS", 60.0),
    # The health page (/health/, docs/reference/console.md: signal, amber when, red when). Every worker
    # upserts its heartbeat this often (operations.workers.heartbeat); it is late past HEALTH_WORKER_LATE
    # and gone past HEALTH_WORKER_GONE seconds without a beat.
    "WORKER_HEARTBEAT_SECONDS": env_period("EFFECT_LEDGER_WORKER_HEARTBEAT_SECONDS", 10.0),
    # Every beat process upserts its own heartbeat this often (operations.workers.beat_heartbeat);
    # two beats seen within HEALTH_BEAT_WINDOW_SECONDS turn the health page's beat signal red.
    "BEAT_HEARTBEAT_SECONDS": env_period("EFFECT_LEDGER_BEAT_HEARTBEAT_SECONDS", 10.0),
    # Seconds within which two beats' heartbeats mean two beats run (at least twice the heartbeat).
    "HEALTH_BEAT_WINDOW_SECONDS": env_float("EFFECT_LEDGER_HEALTH_BEAT_WINDOW_SECONDS", 35.0, minimum=1.0),
    # Seconds without a heartbeat after which a worker counts as late (the workers signal turns amber).
    "HEALTH_WORKER_LATE_SECONDS": env_float("EFFECT_LEDGER_HEALTH_WORKER_LATE_SECONDS", 30.0),
    # Seconds without a heartbeat after which a worker counts as gone (red when no worker is alive).
    "HEALTH_WORKER_GONE_SECONDS": env_float("EFFECT_LEDGER_HEALTH_WORKER_GONE_SECONDS", 120.0),
    # Messages waiting in a broker queue from which the health page shows the queue amber.
    "HEALTH_QUEUE_DEPTH_AMBER": env_int("EFFECT_LEDGER_HEALTH_QUEUE_DEPTH_AMBER", 100),
    # Messages waiting in a broker queue from which the health page shows the queue red.
    "HEALTH_QUEUE_DEPTH_RED": env_int("EFFECT_LEDGER_HEALTH_QUEUE_DEPTH_RED", 1000),
    # Seconds to wait for the broker when measuring queue depth: a web request never waits longer.
    "HEALTH_BROKER_TIMEOUT_SECONDS": env_float("EFFECT_LEDGER_HEALTH_BROKER_TIMEOUT_SECONDS", 2.0),
    # Seconds the oldest due, unsent outbox row has waited (amber from OUTBOX_LAG_WARNING_SECONDS).
    "HEALTH_OUTBOX_RED_SECONDS": env_float("EFFECT_LEDGER_HEALTH_OUTBOX_RED_SECONDS", 300.0),
    # A periodic job (relay, reconciler, ...) shows amber after this many of its periods without a run.
    "HEALTH_JOB_AMBER_PERIODS": env_float("EFFECT_LEDGER_HEALTH_JOB_AMBER_PERIODS", 5.0),
    # A periodic job shows red after this many of its periods without a run, or when it never ran
    # although the beat running now has been up this many of its periods (before that: not due yet).
    "HEALTH_JOB_RED_PERIODS": env_float("EFFECT_LEDGER_HEALTH_JOB_RED_PERIODS", 30.0),
    # Provider calls of the last hour, per action: the share (0-1) with no definite answer (unknown,
    # retry, abandoned; a definite refusal is not one) from which the action shows amber.
    "HEALTH_PROVIDER_FAILURE_AMBER": env_float("EFFECT_LEDGER_HEALTH_PROVIDER_FAILURE_AMBER", 0.05),
    # The share of an action's calls of the last hour with no definite answer from which it shows red.
    "HEALTH_PROVIDER_FAILURE_RED": env_float("EFFECT_LEDGER_HEALTH_PROVIDER_FAILURE_RED", 0.25),
    # Seconds past which the p95 of an action's calls of the last hour (claim to record) shows amber.
    "HEALTH_PROVIDER_P95_AMBER_SECONDS": env_float("EFFECT_LEDGER_HEALTH_PROVIDER_P95_AMBER_SECONDS", 2.0),
    # Seconds past which that p95 shows red.
    "HEALTH_PROVIDER_P95_RED_SECONDS": env_float("EFFECT_LEDGER_HEALTH_PROVIDER_P95_RED_SECONDS", 8.0),
    # How long an operator's "I'm on it" on an item of the operators' queue lasts
    # (operations.services.assignment); after it, anyone may take the item without taking over.
    "ASSIGNMENT_SECONDS": env_int("EFFECT_LEDGER_ASSIGNMENT_SECONDS", 1800, minimum=1),
    # Requests a web process lets wait at once (GET /api/v1/intents/{id}?wait=, operations.api.waiting):
    # half its gunicorn threads by default, so the console, the API and /healthz always find a
    # thread; a wait beyond them is answered at once with Effect-Ledger-Wait: busy.
    "WAIT_SLOTS": env_int(
        "EFFECT_LEDGER_WAIT_SLOTS",
        # Threads of each gunicorn gthread worker (EFFECT_LEDGER_WEB_THREADS, console/gunicorn_conf.py):
        # the requests a web process serves at once; a ?wait= request holds one for up to 30 s.
        max(1, env_int("EFFECT_LEDGER_WEB_THREADS", 8, minimum=1) // 2),
        minimum=1,
    ),
    # Signed webhooks to agents (operations.services.webhooks, docs/reference/webhooks.md): the
    # beat's period and batch, the wait before attempt n (backoff: BASE * 2**(n-2), at most CAP,
    # equal jitter; with these, the 14th and last attempt comes about 13-26 h after the first),
    # and the request's timeouts (seconds).
    "WEBHOOK_PERIOD_SECONDS": env_period("EFFECT_LEDGER_WEBHOOK_PERIOD_SECONDS", 5.0),
    # One delivery pass runs at a time (a lease row); it claims WEBHOOK_BATCH due rows per
    # round and POSTs them concurrently, rounds repeated for at most WEBHOOK_PASS_SECONDS.
    "WEBHOOK_BATCH": env_int("EFFECT_LEDGER_WEBHOOK_BATCH", 8, minimum=1),
    # Seconds a delivery pass repeats its rounds at most.
    "WEBHOOK_PASS_SECONDS": env_float("EFFECT_LEDGER_WEBHOOK_PASS_SECONDS", 20.0),
    # Seconds before a webhook's second attempt (a pick between half and all of it, equal jitter);
    # each later wait doubles, up to WEBHOOK_BACKOFF_CAP_SECONDS.
    "WEBHOOK_BACKOFF_BASE_SECONDS": env_float("EFFECT_LEDGER_WEBHOOK_BACKOFF_BASE_SECONDS", 30.0),
    # The longest wait in seconds between two attempts of a webhook (21600: 6 h).
    "WEBHOOK_BACKOFF_CAP_SECONDS": env_float("EFFECT_LEDGER_WEBHOOK_BACKOFF_CAP_SECONDS", 21600.0),
    # Attempts after which a webhook not answered 2xx is failed (``webhook_resend`` sends it again).
    "WEBHOOK_MAX_ATTEMPTS": env_int("EFFECT_LEDGER_WEBHOOK_MAX_ATTEMPTS", 14, minimum=1),
    # Seconds a webhook POST may take to connect.
    "WEBHOOK_CONNECT_TIMEOUT_SECONDS": env_float("EFFECT_LEDGER_WEBHOOK_CONNECT_TIMEOUT_SECONDS", 3.0),
    # Seconds a webhook POST may wait for each read and write once connected.
    "WEBHOOK_TIMEOUT_SECONDS": env_float("EFFECT_LEDGER_WEBHOOK_TIMEOUT_SECONDS", 10.0),
    # The SSRF guard (operations/notifications/callback_urls.py): callbacks may reach public addresses, and
    # these networks (CIDR, comma-separated) besides. Loopback by default in embedded mode (the
    # quick start, no DATABASE_URL); name your agents' internal networks here.
    "WEBHOOK_ALLOWED_NETWORKS": env_list(
        "EFFECT_LEDGER_WEBHOOK_ALLOWED_NETWORKS",
        [] if env_str("DATABASE_URL") else ["127.0.0.0/8", "::1/128"],
    ),
    # Notifications to approvers and operators (operations.services.notifications;
    # docs/reference/console.md). The console's address for deep links.
    "PUBLIC_URL": env_str("EFFECT_LEDGER_PUBLIC_URL", "http://127.0.0.1:8000"),
    # A Slack-compatible incoming webhook that receives every notice too (POST {"text": ...});
    # empty: email only.
    "SLACK_WEBHOOK_URL": env_str("EFFECT_LEDGER_SLACK_WEBHOOK_URL"),
    # Beat period of the sender; at most one message per recipient per NOTIFY_INTERVAL_SECONDS
    # (the notices of the meantime wait for the next message, a digest).
    "NOTIFY_PERIOD_SECONDS": env_period("EFFECT_LEDGER_NOTIFY_PERIOD_SECONDS", 15.0),
    # Seconds a recipient waits between two messages at least; what arrives meanwhile goes as a digest.
    "NOTIFY_INTERVAL_SECONDS": env_float("EFFECT_LEDGER_NOTIFY_INTERVAL_SECONDS", 300.0),
    # Approvers are warned once per approval round when the request expires within this. It
    # must be shorter than the approval TTL (600 s by default, policies' approval_ttl_seconds):
    # a request sent inside the window gets no warning. Longer than NOTIFY_INTERVAL_SECONDS +
    # NOTIFY_PERIOD_SECONDS (315 s), so a recipient held by the rate limit still gets the
    # warning before the request expires.
    "NOTIFY_EXPIRY_WARNING_SECONDS": env_float("EFFECT_LEDGER_NOTIFY_EXPIRY_WARNING_SECONDS", 360.0),
    # Notices a sender pass fans out, delivers and prunes at most, each (at least 1).
    "NOTIFY_BATCH": env_int("EFFECT_LEDGER_NOTIFY_BATCH", 200, minimum=1),
    # Seconds a Slack POST may take (an SMTP server's are EMAIL_TIMEOUT); a failed send is
    # retried with backoff from NOTIFY_RETRY_BASE_SECONDS up to NOTIFY_RETRY_CAP_SECONDS.
    "NOTIFY_SEND_TIMEOUT_SECONDS": env_float("EFFECT_LEDGER_NOTIFY_SEND_TIMEOUT_SECONDS", 10.0),
    # Seconds before a failed send is retried; the wait doubles per failure (never dropped for failing).
    "NOTIFY_RETRY_BASE_SECONDS": env_float("EFFECT_LEDGER_NOTIFY_RETRY_BASE_SECONDS", 30.0),
    # The longest wait in seconds between retries of a failed send.
    "NOTIFY_RETRY_CAP_SECONDS": env_float("EFFECT_LEDGER_NOTIFY_RETRY_CAP_SECONDS", 3600.0),
    # Days a notice is kept once nothing is pending for it (sent, dropped, or nobody to tell).
    "NOTIFY_RETENTION_DAYS": env_float("EFFECT_LEDGER_NOTIFY_RETENTION_DAYS", 30.0),
    # Pruning (reconciliation.pruning, issue 36): rows that are no evidence of an intent's
    # history leave once settled. Beat period in seconds of the pruning pass.
    "PRUNE_PERIOD_SECONDS": env_period("EFFECT_LEDGER_PRUNE_PERIOD_SECONDS", 3600.0),
    # Rows a pruning statement deletes (or provider event bodies it clears) at most; a pass
    # repeats them, each in its own short transaction (at least 1).
    "PRUNE_BATCH": env_int("EFFECT_LEDGER_PRUNE_BATCH", 1000, minimum=1),
    # Seconds an acknowledged outbox row is kept (at least 60); a row not yet acknowledged is never pruned.
    "OUTBOX_RETENTION_SECONDS": env_float("EFFECT_LEDGER_OUTBOX_RETENTION_SECONDS", 3600.0, minimum=60.0),
    # Days a webhook delivery is kept once delivered or failed after its last attempt (at least
    # 1), counted from its last attempt; a pending one is never pruned.
    "WEBHOOK_DELIVERY_RETENTION_DAYS": env_float(
        "EFFECT_LEDGER_WEBHOOK_DELIVERY_RETENTION_DAYS", 7.0, minimum=1.0
    ),
    # Days a processed provider event keeps its body (at least 1); then the body is removed, its
    # SHA-256 and the parsed fields stay. An event not processed, or with an open finding, keeps it.
    "RAW_BODY_RETENTION_DAYS": env_float("EFFECT_LEDGER_RAW_BODY_RETENTION_DAYS", 30.0, minimum=1.0),
}
if EFFECT_LEDGER["HEALTH_BEAT_WINDOW_SECONDS"] < 2 * EFFECT_LEDGER["BEAT_HEARTBEAT_SECONDS"]:
    # A running beat whose heartbeats are further apart than the window would drop off the
    # health page between two of them, so a second beat would go unseen.
    raise ValueError(
        "environment variable EFFECT_LEDGER_HEALTH_BEAT_WINDOW_SECONDS must be at least twice "
        f"EFFECT_LEDGER_BEAT_HEARTBEAT_SECONDS ({EFFECT_LEDGER['BEAT_HEARTBEAT_SECONDS']:g} s), "
        f"got {EFFECT_LEDGER['HEALTH_BEAT_WINDOW_SECONDS']:g}"
    )

# Policies per action (risk decision table in shared/seeds/004). The policy in force is
# snapshotted onto each intent at submission. See operations/policies/rules.py for every field.
EFFECT_LEDGER_POLICIES: dict[str, dict[str, Any]] = {
    "payments.charge": {
        "risk_tier": "high",
        "approval": "above_amount",
        # Per ISO 4217 currency in its minor units; a charge in a currency not named here
        # always needs approval (issue 18).
        "approval_threshold_minor": {
            "EUR": 10_000,
            "USD": 10_000,
            "GBP": 10_000,
            "CHF": 10_000,
            "JPY": 15_000,  # JPY has no minor unit (ISO 4217 exponent 0): 15,000 yen, about 100 EUR
        },
    },
    "payments.refund": {"risk_tier": "high", "approval": "always"},
    "email.send": {"risk_tier": "low", "approval": "never"},
    "reservations.create": {"risk_tier": "medium", "approval": "never"},
    "reservations.cancel": {"risk_tier": "medium", "approval": "never"},
}
