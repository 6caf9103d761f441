"""The registry of adapters by action.

``settings.EFFECT_LEDGER_ADAPTERS`` maps an action name to the dotted path of its adapter class;
the defaults below register the sandbox provider's products. Every action configured in
``settings.EFFECT_LEDGER_GENERIC_HTTP`` is served by the generic HTTP adapter
(``generic_http.py``), unless ``EFFECT_LEDGER_ADAPTERS`` names another class for it.
"""

from __future__ import annotations

from functools import cache

from django.conf import settings
from django.utils.module_loading import import_string

from operations.adapters.base import Adapter, Capabilities
from operations.adapters.generic_http import generic_http_adapter, generic_http_config

DEFAULT_ADAPTERS: dict[str, str] = {
    "payments.charge": "operations.adapters.sandbox.SandboxPaymentsAdapter",
    "payments.refund": "operations.adapters.sandbox.SandboxPaymentsAdapter",
    "email.send": "operations.adapters.sandbox.SandboxEmailAdapter",
    "reservations.create": "operations.adapters.sandbox.SandboxReservationsAdapter",
    "reservations.cancel": "operations.adapters.sandbox.SandboxReservationsAdapter",
}


class UnknownAction(LookupError):
    """No adapter is registered for the action.

    Attributes:
        action: the name asked for.
        known: the registered action names, sorted.
    """

    def __init__(self, action: str, known: list[str]) -> None:
        super().__init__(f"unknown action {action!r}; known actions: {', '.join(known)}")
        self.action = action
        self.known = known


def _adapter_paths() -> dict[str, str]:
    return {**DEFAULT_ADAPTERS, **getattr(settings, "EFFECT_LEDGER_ADAPTERS", {})}


def known_actions() -> list[str]:
    """Return every registered action name, sorted."""
    return sorted({*_adapter_paths(), *generic_http_config()})


@cache
def _instantiate(path: str) -> Adapter:
    adapter: Adapter = import_string(path)()
    return adapter


def get_adapter(action: str) -> Adapter:
    """Return the adapter instance serving ``action``.

    Raises:
        UnknownAction: no adapter is registered for it.
        ImproperlyConfigured: ``EFFECT_LEDGER_GENERIC_HTTP`` is malformed.
    """
    explicit = getattr(settings, "EFFECT_LEDGER_ADAPTERS", {})
    if action not in explicit:
        generic = generic_http_adapter(action)
        if generic is not None:
            return generic
    path = _adapter_paths().get(action)
    if path is None:
        raise UnknownAction(action, known_actions())
    return _instantiate(path)


def capabilities_for(action: str) -> Capabilities:
    """The capabilities of ``action``'s provider contract (keys honoured, lookup kind and
    consistency window, compensation, fences), as its adapter declares them.

    Raises:
        UnknownAction: no adapter is registered for it.
    """
    return get_adapter(action).capabilities_for(action)
