"""Celery's settings (namespace ``CELERY``, read by ``console/celery.py``): the broker, its
transport options and how tasks are acknowledged and limited. Part of ``console.settings``
(which imports every name), the module ``DJANGO_SETTINGS_MODULE`` names.
"""

from __future__ import annotations

from typing import Any

from console.env import env_float, env_int, env_str
from console.settings_core import DATA_DIR

# --- Celery (namespace CELERY). PostgreSQL is the source of truth; the broker carries wake-ups.
_broker_dir = DATA_DIR / "broker"
# The broker: RabbitMQ (amqp://) or Redis (redis://, rediss://). Default: kombu's filesystem transport
# under <data dir>/broker, for one machine (it does not survive a pool process killed mid-task).
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
# Seconds to wait for a connection to the broker (on Redis also the socket's connect timeout); a
# publication is retried once at most (max_retries above), so this bounds how long a hand-off blocks.
CELERY_BROKER_CONNECTION_TIMEOUT = env_float("CELERY_BROKER_CONNECTION_TIMEOUT", 4.0)
if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    # kombu's Redis transport takes its connect timeout from the transport options only.
    CELERY_BROKER_TRANSPORT_OPTIONS["socket_connect_timeout"] = CELERY_BROKER_CONNECTION_TIMEOUT
# The Celery queue tasks are sent to and workers consume (the health page measures its depth).
CELERY_TASK_DEFAULT_QUEUE = env_str("EFFECT_LEDGER_QUEUE", "effect-ledger")
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Keep database connections across tasks (console/celery.py): Celery's Django fix-up closes them
# around every task otherwise, and after this many tasks (times two) even so.
CELERY_DB_REUSE_MAX = 1_000_000
# Seconds a task may run before Celery raises SoftTimeLimitExceeded inside it.
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 60)
# Seconds after which the process running a task is killed (the hard limit). On Redis the
# visibility timeout must exceed it (or the lease, if longer) plus the 30 s countdown bound.
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 90)
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
