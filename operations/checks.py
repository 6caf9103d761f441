"""System checks (``manage.py check``, and every ``runserver``/``migrate``) for delivery settings
and the audit checkpoints' key."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from operations.audit.keys import AuditKeyError, public_key_path, signing_key_load, signing_key_path
from operations.workers.delivery import MAX_COUNTDOWN_SECONDS


@register()
def evidence_source_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Each provider evidence source is declared by one adapter (issue 19): two adapters claiming
    one source would take each other's events (the first one's secret would refuse the other's)."""
    from operations.adapters.registry import evidence_source_conflicts

    return [
        Error(
            f"evidence source {source!r} is declared by several adapters: {', '.join(actions)}",
            hint="give each adapter (a generic HTTP action's events/statements) its own source name",
            id="operations.E003",
        )
        for source, actions in evidence_source_conflicts().items()
    ]


@register()
def published_secret_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """No real provider's event source is signed with a secret published in this repository
    (issue 33 item 6): anyone could forge its evidence. The inbox refuses such events too."""
    from operations.adapters.registry import evidence_sources
    from operations.adapters.secrets import PUBLISHED_SECRETS

    return [
        Error(
            f"the event source {source!r} uses a secret published in this repository",
            hint="give the source its own secret (EFFECT_LEDGER_PROVIDER_EVENT_SECRETS or its events' secret)",
            id="operations.E004",
        )
        for source, adapter in evidence_sources().items()
        if not adapter.test_endpoint and adapter.event_secret() in PUBLISHED_SECRETS
    ]


@register()
def compensation_served_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Every action's compensation names an action this deployment serves (issue 33): a declared
    ``compensation.action`` misspelt would leave every undo refused at the worst moment."""
    from operations.adapters.registry import capabilities_for, known_actions

    try:
        served = set(known_actions())
    except Exception:  # noqa: BLE001 - a malformed configuration stops the process elsewhere
        return []
    errors: list[CheckMessage] = []
    for action in sorted(served):
        try:
            undo = capabilities_for(action).compensation_action
        except Exception:  # noqa: BLE001 - an adapter that cannot load is reported where it is used
            continue
        if undo and undo not in served:
            errors.append(
                Error(
                    f"{action}'s compensation names {undo!r}, which this deployment does not serve",
                    hint="declare that action too, or correct the compensation's action",
                    id="operations.E005",
                )
            )
    return errors


@register(deploy=True)
def named_secrets_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``check --deploy``: every secret a provider declaration names (``env:NAME``,
    ``file:PATH``) can be read in this process's environment; an unreadable one would fail
    each of its intents at run time (issue 33). Names the reference, never a value."""
    from operations.adapters import secrets as named

    declared = {
        **(getattr(settings, "EFFECT_LEDGER_GENERIC_HTTP", {}) or {}),
        **(getattr(settings, "EFFECT_LEDGER_SMTP", {}) or {}),
    }
    warnings: list[CheckMessage] = []
    stack: list[tuple[str, Any]] = list(declared.items())
    while stack:
        action, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((action, item) for item in value.values())
        elif isinstance(value, str) and value.startswith(("env:", "file:")):
            try:
                named.resolve(value)
            except Exception as exc:  # noqa: BLE001 - unset, unreadable or malformed: say so
                warnings.append(
                    Warning(
                        f"{action}: {exc}", hint="set it in every process's environment", id="operations.W006"
                    )
                )
    return warnings


@register(deploy=True)
def sandbox_in_production_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``check --deploy``: the sandbox provider (a test double, with a published event secret)
    should not serve actions in a production deployment (issue 33 item 6)."""
    from operations.adapters.registry import sandbox_enabled

    if not sandbox_enabled() or settings.DEBUG:
        return []
    return [
        Warning(
            "EFFECT_LEDGER_SANDBOX is on: the sandbox provider's actions and event inboxes are served",
            hint="unset EFFECT_LEDGER_SANDBOX in production; the sandbox's event secret is public",
            id="operations.W005",
        )
    ]


@register()
def redis_visibility_timeout_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``operations.E001``: on Redis, ``visibility_timeout`` must exceed the longest time a
    message is held unacknowledged, or Redis delivers it a second time while it still runs.

    That time is the countdown bound (``operations.workers.delivery.MAX_COUNTDOWN_SECONDS``) plus the
    task's hard time limit (``CELERY_TASK_TIME_LIMIT``) or the lease, whichever is longer
    (seconds; kombu's Redis transport, "visibility_timeout").
    """
    url = str(getattr(settings, "CELERY_BROKER_URL", ""))
    if not url.startswith(("redis://", "rediss://")):
        return []
    options = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}) or {}
    visibility = float(options.get("visibility_timeout", 3600))
    held = MAX_COUNTDOWN_SECONDS + max(
        float(getattr(settings, "CELERY_TASK_TIME_LIMIT", 0) or 0),
        float(settings.EFFECT_LEDGER["LEASE_SECONDS"]),
    )
    if visibility > held:
        return []
    return [
        Error(
            f"the Redis visibility_timeout ({visibility:.0f} s) must exceed {held:.0f} s "
            "(countdown bound + task time limit): Redis would deliver running tasks again",
            hint="raise CELERY_REDIS_VISIBILITY_TIMEOUT",
            id="operations.E001",
        )
    ]


@register()
def provider_deadline_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``operations.E002``: the lease must be longer than the provider deadline's margin
    (``PROVIDER_DEADLINE_MARGIN_SECONDS``), or no call could finish while its lease is held; and
    ``PROVIDER_RESPONSE_MAX_BYTES`` must be a positive number of bytes."""
    conf = settings.EFFECT_LEDGER
    errors: list[CheckMessage] = []
    lease, margin = float(conf["LEASE_SECONDS"]), float(conf.get("PROVIDER_DEADLINE_MARGIN_SECONDS", 1.0))
    if margin < 0 or lease - margin <= 0:
        errors.append(
            Error(
                f"the provider deadline margin ({margin:g} s) must be >= 0 and shorter than the lease "
                f"({lease:g} s)",
                hint="raise EFFECT_LEDGER_LEASE_SECONDS or lower EFFECT_LEDGER_PROVIDER_DEADLINE_MARGIN_SECONDS",
                id="operations.E002",
            )
        )
    if int(conf.get("PROVIDER_RESPONSE_MAX_BYTES", 1)) <= 0:
        errors.append(
            Error(
                "EFFECT_LEDGER_PROVIDER_RESPONSE_MAX_BYTES must be a positive number of bytes",
                id="operations.E002",
            )
        )
    return errors


@register()
def audit_signing_key_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``operations.W003``: audit checkpoints need an Ed25519 signing key in a file
    (``AUDIT_SIGNING_KEY_FILE``). Without one, ``audit_checkpoint`` and the beat refuse to sign
    (nothing is signed with an empty key), so deleted tails and chains go unseen: say so here.
    A key the next checkpoint will create (``AUDIT_SIGNING_KEY_CREATE``) is fine."""
    conf = settings.EFFECT_LEDGER
    if conf.get("AUDIT_SIGNING_KEY_CREATE") and not signing_key_path().exists():
        return []
    try:
        signing_key_load(create=False)
    except AuditKeyError as exc:
        verify_only = f" (verification uses {public_key_path()})" if public_key_path() else ""
        return [
            Warning(
                f"audit checkpoints cannot be signed{verify_only}: {exc}",
                hint="provision an Ed25519 key: openssl genpkey -algorithm ed25519 -out KEY.pem; chmod 600 KEY.pem",
                id="operations.W003",
            )
        ]
    return []


@register()
def restore_guard_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``operations.W004``: the restore guard (``RESTORE_GUARD_SECONDS``) must outlast its own
    settle point for every action whose provider cannot deduplicate on our key (a lease plus
    the provider's consistency window, ``services.failover.guard_settle_at``); shorter, a lost
    intent re-submitted after the guard ended is sent again without a lookup (issue 22)."""
    from operations.adapters.registry import ActionUnavailable, capabilities_for, known_actions

    conf = settings.EFFECT_LEDGER
    guard, lease = float(conf["RESTORE_GUARD_SECONDS"]), float(conf["LEASE_SECONDS"])
    short = []
    for action in known_actions():
        try:
            capabilities = capabilities_for(action)
        except ActionUnavailable:
            continue
        if capabilities.duplicates_possible and guard <= lease + capabilities.consistency_window_seconds:
            short.append(f"{action} (needs more than {lease + capabilities.consistency_window_seconds:g} s)")
    if not short:
        return []
    return [
        Warning(
            f"EFFECT_LEDGER_RESTORE_GUARD_SECONDS ({guard:g} s) ends before the restore guard's settle point for "
            + ", ".join(short),
            hint="raise it (default 86400): re-submissions of intents a restore lost are looked up only while "
            "the guard lasts",
            id="operations.W004",
        )
    ]


@register()
def retention_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """An archived intent's Idempotency-Key replays from the archive only until
    ``KEY_RETENTION_DAYS`` after it settled: a key retention shorter than an intent retention
    (the default's or a tenant's) would let a key that an agent may still retry make a second
    intent the day its first is archived (issue 36)."""
    config = settings.EFFECT_LEDGER
    longest = max(
        [float(config["INTENT_RETENTION_DAYS"]), *map(float, config["TENANT_RETENTION_DAYS"].values())]
    )
    if float(config["KEY_RETENTION_DAYS"]) < longest:
        return [
            Error(
                f"EFFECT_LEDGER_KEY_RETENTION_DAYS ({config['KEY_RETENTION_DAYS']:g}) is shorter than the longest "
                f"intent retention ({longest:g} days)",
                hint="an archived key must replay for at least as long as its intent stayed live: raise "
                "EFFECT_LEDGER_KEY_RETENTION_DAYS",
                id="operations.E007",
            )
        ]
    return []
