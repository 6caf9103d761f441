"""The registry of adapters by action.

``settings.EFFECT_LEDGER_ADAPTERS`` maps an action name to the dotted path of its adapter class;
the sandbox provider's products (``SANDBOX_ADAPTERS``) are registered only where the sandbox runs
(``settings.EFFECT_LEDGER_SANDBOX``: quick start, tests, the lab; off in a production
configuration, so its actions and its event inboxes do not exist there). Every action configured in
``settings.EFFECT_LEDGER_GENERIC_HTTP`` is served by the generic HTTP adapter
(``generic_http.py``), and every action in ``settings.EFFECT_LEDGER_SMTP`` by the SMTP adapter
(``smtp.py``), unless ``EFFECT_LEDGER_ADAPTERS`` names another class for it.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from operations.adapters.base import Adapter, Capabilities
from operations.adapters.declared_actions import generic_http_adapter, generic_http_config
from operations.adapters.smtp import smtp_adapter, smtp_config

#: The sandbox provider's products, served only with ``settings.EFFECT_LEDGER_SANDBOX`` on (issue
#: 33 item 6: the test double and its published event secret are not live in production).
SANDBOX_ADAPTERS: dict[str, str] = {
    "payments.charge": "operations.adapters.sandbox.SandboxPaymentsAdapter",
    "payments.refund": "operations.adapters.sandbox.SandboxPaymentsAdapter",
    "email.send": "operations.adapters.sandbox.SandboxEmailAdapter",
    "reservations.create": "operations.adapters.sandbox.SandboxReservationsAdapter",
    "reservations.cancel": "operations.adapters.sandbox.SandboxReservationsAdapter",
}


class ActionUnavailable(LookupError):
    """The action cannot be served by this deployment: not registered (``UnknownAction``) or
    its adapter cannot be loaded (``AdapterBroken``). ``str()`` says which, for operators."""


class UnknownAction(ActionUnavailable):
    """No adapter is registered for the action.

    Attributes:
        action: the name asked for.
        known: the registered action names, sorted.
    """

    def __init__(self, action: str, known: list[str]) -> None:
        super().__init__(f"unknown action {action!r}; known actions: {', '.join(known)}")
        self.action = action
        self.known = known


class AdapterBroken(ActionUnavailable):
    """The action is configured but its adapter cannot be loaded (a wrong class path, an import
    error, a malformed generic configuration).

    Attributes:
        action: the name asked for.
    """

    def __init__(self, action: str, cause: BaseException) -> None:
        super().__init__(f"the adapter of {action!r} cannot be loaded: {cause!r}"[:500])
        self.action = action


def sandbox_enabled() -> bool:
    """Whether this deployment serves the sandbox provider's actions and event sources
    (``settings.EFFECT_LEDGER_SANDBOX``; default: ``DEBUG``)."""
    return bool(getattr(settings, "EFFECT_LEDGER_SANDBOX", False))


def _adapter_paths() -> dict[str, str]:
    defaults = SANDBOX_ADAPTERS if sandbox_enabled() else {}
    return {**defaults, **getattr(settings, "EFFECT_LEDGER_ADAPTERS", {})}


def known_actions() -> list[str]:
    """Return every registered action name, sorted."""
    return sorted({*_adapter_paths(), *generic_http_config(), *smtp_config()})


@cache
def _instantiate(path: str) -> Adapter:
    adapter: Adapter = import_string(path)()
    return adapter


def get_adapter(action: str) -> Adapter:
    """Return the adapter instance serving ``action``.

    Raises:
        UnknownAction: no adapter is registered for it.
        AdapterBroken: its adapter cannot be loaded (an import error, a wrong class path,
            ``EFFECT_LEDGER_GENERIC_HTTP`` or ``EFFECT_LEDGER_SMTP`` malformed).
    """
    explicit = getattr(settings, "EFFECT_LEDGER_ADAPTERS", {})
    try:
        if action not in explicit:
            declared = generic_http_adapter(action) or smtp_adapter(action)
            if declared is not None:
                return declared
        path = _adapter_paths().get(action)
        if path is None:
            raise UnknownAction(action, _known_or_none())
        return _instantiate(path)
    except ActionUnavailable:
        raise
    except Exception as exc:  # whatever loading it raised: the action cannot be served
        raise AdapterBroken(action, exc) from exc


def adapter_label(action: str) -> str:
    """The name of the adapter serving ``action``, for people, without loading it: ``generic
    HTTP``, ``SMTP``, the configured class's name (``SandboxPaymentsAdapter``), or ``not served``."""
    explicit = getattr(settings, "EFFECT_LEDGER_ADAPTERS", {})
    if action not in explicit:
        try:
            if action in generic_http_config():
                return "generic HTTP"
            if action in smtp_config():
                return "SMTP"
        except Exception:  # noqa: BLE001 - a malformed configuration serves nothing (get_adapter says why)
            return "not served"
    path = _adapter_paths().get(action)
    return path.rsplit(".", 1)[-1] if path else "not served"


def _known_or_none() -> list[str]:
    try:
        return known_actions()
    except Exception:  # a malformed generic configuration: name the explicit ones only
        return sorted(_adapter_paths())


def serving_problem(action: str, version: int) -> str | None:
    """Why this deployment cannot run ``action`` at ``version``, or None when it can.

    The answer an operator reads: the action is not registered (removed from the
    configuration), its adapter cannot be loaded, or its adapter no longer serves ``version``
    (``Adapter.versions_for``). Never raises.
    """
    try:
        adapter = get_adapter(action)
        served = adapter.versions_for(action)
    except ActionUnavailable as exc:
        if isinstance(exc, UnknownAction):
            return f"{action} is not served by this deployment: no adapter is registered for it (removed from the configuration?)"
        return f"{action} is not served by this deployment: {exc}"
    except Exception as exc:
        return f"{action} is not served by this deployment: its adapter failed: {exc!r}"[:500]
    if version not in served:
        listed = ", ".join(str(v) for v in served)
        return (
            f"{action} version {version} is no longer served by this deployment (it serves version {listed})"
        )
    return None


def capabilities_for(action: str) -> Capabilities:
    """The capabilities of ``action``'s provider contract (keys honoured, lookup kind and
    consistency window, compensation, fences), as its adapter declares them.

    Raises:
        UnknownAction: no adapter is registered for it. AdapterBroken: it cannot be loaded.
    """
    return get_adapter(action).capabilities_for(action)


def served_argument_schemas() -> dict[str, dict[int, dict[str, Any]]]:
    """Every action this deployment serves, with the JSON schema (draft 2020-12) of its
    arguments per ``action_version``: ``{"payments.charge": {1: {...}}, ...}``, actions sorted.

    What the API's OpenAPI document describes (``operations.api.schema``), read from the same
    adapters that validate a submission (``Adapter.versions_for`` and ``argument_schema_for``),
    so the document cannot disagree with the validation. An action whose adapter cannot be
    loaded (``AdapterBroken``) is left out: a submission of it is refused with a 422 anyway.
    Never raises for a broken adapter or a malformed generic configuration.
    """
    served: dict[str, dict[int, dict[str, Any]]] = {}
    for action in _known_or_none():
        try:
            adapter = get_adapter(action)
            served[action] = {
                version: adapter.argument_schema_for(action, version)
                for version in adapter.versions_for(action)
            }
        except Exception:  # an adapter that cannot be loaded or answer serves nothing
            continue
    return served


def evidence_sources() -> dict[str, Adapter]:
    """Every provider evidence source this deployment serves: slug -> the adapter declaring it
    (``Adapter.evidence_source``), over every served action (issue 19). Where several actions'
    actions of one adapter class declare one slug (the sandbox's charge and refund), the first
    action's adapter answers; a slug declared by several adapter classes is left out
    (``evidence_source_conflicts``). An action whose adapter cannot be loaded declares nothing.
    Never raises."""
    conflicts = evidence_source_conflicts()
    return {
        source: adapters[0] for source, adapters in _declared_sources().items() if source not in conflicts
    }


def _declared_sources() -> dict[str, list[Adapter]]:
    declared: dict[str, list[Adapter]] = {}
    for action in _known_or_none():
        try:
            adapter = get_adapter(action)
        except Exception:  # noqa: BLE001 - a broken adapter serves nothing
            continue
        if adapter.evidence_source:
            declared.setdefault(adapter.evidence_source, []).append(adapter)
    return declared


def evidence_source_actions(source: str) -> tuple[str, ...]:
    """Every served action whose adapter declares ``source`` (``Adapter.evidence_source``),
    sorted: the actions the source's events and statement lines can be about; () for a source
    nobody declares. Never raises."""
    return tuple(
        sorted({action for adapter in _declared_sources().get(source, []) for action in adapter.actions})
    )


def evidence_source_conflicts() -> dict[str, list[str]]:
    """Evidence sources declared by more than one adapter class, with the actions declaring them:
    ``{"sandbox-payments": ["acme.transfer", "payments.charge", "payments.refund"]}``. A source
    has one adapter (its secret, its event types, what they prove); such a source is left out of
    ``evidence_sources`` (its inbox answers 404) and ``manage.py check`` refuses the configuration
    (``operations.E003``). Never raises."""
    conflicts: dict[str, list[str]] = {}
    for source, adapters in _declared_sources().items():
        if len({type(adapter) for adapter in adapters}) > 1:
            conflicts[source] = sorted(action for adapter in adapters for action in adapter.actions)
    return conflicts
