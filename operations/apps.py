"""App config for the ledger."""

from __future__ import annotations

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured

from operations.policies.reading import PolicyError
from operations.policies.rules import validate_configured_policies


class OperationsConfig(AppConfig):
    """The ledger: intents, attempts, outcomes, approvals, outbox, audit."""

    name = "operations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from operations import checks  # noqa: F401  (registers the system checks)
        from operations.workers import signals  # noqa: F401  (the restore check on a worker's start)

        # Every process (web, workers, beat, commands) resolves each configured policy once at
        # start-up, so a malformed one stops it here, naming the action and the field, instead
        # of failing the first intent that needs it.
        try:
            validate_configured_policies()
        except PolicyError as exc:
            raise ImproperlyConfigured(f"EFFECT_LEDGER_POLICIES: {exc}") from exc
