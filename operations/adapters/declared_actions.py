"""The actions declared in ``settings.EFFECT_LEDGER_GENERIC_HTTP`` (or the JSON file
``EFFECT_LEDGER_GENERIC_HTTP_FILE`` names; issue 33): the setting read and every contract
checked (``generic_http_config``), and for each action its own subclass of
``operations.adapters.generic_http.GenericHttpAdapter`` whose capabilities and schema reflect
its contract (``generic_http_adapter``).
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from operations.adapters.base import Capabilities, LookupKind
from operations.adapters.contract import Contract, parse_contract
from operations.adapters.generic_http import GenericHttpAdapter

#: An action without a ``schema`` accepts any JSON object.
ANY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


def generic_http_config() -> dict[str, dict[str, Any]]:
    """Return ``settings.EFFECT_LEDGER_GENERIC_HTTP`` (``{}`` when unset).

    Raises:
        ImproperlyConfigured: the setting is not a mapping of action → ``{"url": ..., ...}``.
    """
    config = getattr(settings, "EFFECT_LEDGER_GENERIC_HTTP", None) or {}
    if not isinstance(config, dict):
        raise ImproperlyConfigured("EFFECT_LEDGER_GENERIC_HTTP must be a dict of action -> config")
    for action, entry in config.items():
        parse_contract(str(action), entry)
    return config


def _capabilities(contract: Contract, *, fences: bool) -> Capabilities:
    """What the engine and the reconciler read of a declared contract (``Capabilities``): keys
    honoured only where the provider deduplicates them; the lookup's kind and lag; listing by
    reference; the compensation's action."""
    lookup = contract.lookup
    if lookup is None:
        kind, window = LookupKind.NONE, 0.0
    else:
        kind = LookupKind.AUTHORITATIVE if lookup.authoritative else LookupKind.EVENTUAL
        window = lookup.consistency_window_seconds
    return Capabilities(
        idempotency_keys=contract.keys.deduplicates,
        lookup=kind,
        consistency_window_seconds=window,
        list_by_reference=lookup is not None and lookup.by == "reference",
        compensation_action=contract.compensation.action if contract.compensation else None,
        fences=fences,
    )


@cache
def _adapter_for(action: str, config_json: str) -> GenericHttpAdapter:
    config = json.loads(config_json)
    contract = parse_contract(action, config)
    cls = type(
        f"GenericHttpAdapter[{action}]",
        (GenericHttpAdapter,),
        {
            "__doc__": f"Generic HTTP adapter for {action} ({config['url']}).",
            "action_name": action,
            "actions": (action,),
            "config": config,
            "contract": contract,
            "capabilities": _capabilities(contract, fences=bool(config.get("fence_header"))),
            "argument_schemas": {action: config.get("schema") or ANY_OBJECT_SCHEMA},
            "versions": {action: tuple(config.get("versions", [1]))},
            # The evidence source it declares (issue 19): ``events.source`` or ``statements.source``.
            "evidence_source": str(
                (config.get("events") or {}).get("source")
                or (config.get("statements") or {}).get("source")
                or ""
            ),
        },
    )
    adapter: GenericHttpAdapter = cls()
    return adapter


def generic_http_adapter(action: str) -> GenericHttpAdapter | None:
    """Return the adapter instance for ``action`` from ``EFFECT_LEDGER_GENERIC_HTTP``, or
    ``None`` when the action is not configured there. Instances are cached per configuration,
    so a changed setting (e.g. in a test) yields a new instance.

    Raises:
        ImproperlyConfigured: the setting is malformed.
    """
    config = generic_http_config().get(action)
    if config is None:
        return None
    return _adapter_for(action, json.dumps(config, sort_keys=True, default=str))
