"""What a provider's test mode actually does about our key, its lookup and its events, measured
rather than declared (issue 33; ``manage.py provider_probe ACTION``).

Against an action whose adapter is a test endpoint (``Adapter.test_endpoint``: the sandbox's
adapters, a declared action with ``"test_mode": true``), and against nothing else:

1. one ``ExecutionCall`` with a fresh key (``probe-<uuid4>``), an intent id that names no intent,
   the given arguments and business reference, is executed twice (``Adapter.execute``) with the
   same key: the same request sent again, as a same-key retry would send it. The reference is
   the one given, else the arguments' ``reference``, else a fresh ``probe-<hex>``; when the
   action's schema has a ``reference`` property, the arguments carry it too (``with_reference``);
2. ``Adapter.lookup`` is asked once, right after (not when both requests failed: then the probe
   reports that neither made an effect, and nothing to declare);
3. with ``event_wait_seconds``, the ledger's stored provider events (``ProviderEvent``, stored
   only once their signature verified) are polled for one about the key, the reference or an id
   the provider answered.

The verdict on the key: two different provider references, or a lookup that lists two effects
for the key, → "does not deduplicate"; the same reference twice (the provider gave an id of its
own), or a lookup that lists one effect, → "deduplicates"; a failed request, or answers whose
only id is our key or made from it (an email's Message-ID ``<KEY@effect-ledger.local>``)
without a lookup that counts, → cannot tell. A declared action with ``"keys": "none"`` sends no
key: the probe says so rather than judge a key it did not send. The probe reads and writes no intent; the effects it makes
at the test endpoint stay there (two charges at a provider that ignores keys).
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from operations.adapters.base import Adapter, ExecutionCall, LookupKind
from operations.adapters.contract import DEFAULT_LAG_SECONDS
from operations.adapters.errors import AdapterError, AmbiguousOutcome, ArgumentsInvalid
from operations.adapters.events import EventInvalid
from operations.adapters.generic_http import GenericHttpAdapter
from operations.adapters.registry import ActionUnavailable, adapter_label, get_adapter
from reconciliation.models import ProviderEvent
from reconciliation.probe_report import LOOKUP_VERDICTS, ProbeReport, Sent, key_verdict

#: Seconds between two reads of the stored events while waiting for one.
EVENT_POLL_SECONDS = 0.25


class ProbeRefused(Exception):
    """The probe will not run: the action is unknown, not a test endpoint, or its arguments fail
    its schema. Nothing was sent."""


def _send(adapter: Adapter, call: ExecutionCall) -> Sent:
    try:
        result = adapter.execute(call)
    except AdapterError as exc:
        return Sent(error=f"{type(exc).__name__}: {exc}"[:300], ambiguous=isinstance(exc, AmbiguousOutcome))
    return Sent(reference=result.provider_reference, replayed=result.replayed)


def _key_label(adapter: Adapter) -> str:
    if isinstance(adapter, GenericHttpAdapter):
        return adapter.contract.keys.header or "(no key sent: its contract says keys none)"
    return "its idempotency key"


def _declared_lookup(adapter: Adapter, action: str, lookup: str) -> dict[str, Any] | None:
    """The lookup to declare: the contract's own (a declared action) or what the adapter's
    capabilities say, made eventual with a window when the effect was not found right after."""
    if lookup == "unsupported":
        return None
    if isinstance(adapter, GenericHttpAdapter) and adapter.contract.lookup is not None:
        declared = dataclasses.asdict(adapter.contract.lookup)
        declared.pop("legacy")
        declared["proving_statuses"] = list(declared["proving_statuses"])
    else:
        caps = adapter.capabilities_for(action)
        declared = {
            "authoritative": caps.lookup == LookupKind.AUTHORITATIVE,
            "consistency_window_seconds": caps.consistency_window_seconds,
        }
    if lookup == "not found yet":
        # a read path that missed an effect just made is not authoritative and lags
        declared["authoritative"] = False
        declared["consistency_window_seconds"] = max(
            float(declared["consistency_window_seconds"]), DEFAULT_LAG_SECONDS
        )
    return declared


def _declared_keys(adapter: Adapter, action: str, deduplicates: bool | None) -> Any:
    """The ``keys`` to declare: the header our key went in with what the probe saw (the current
    declaration when it could not tell); ``"none"`` for a contract that sends no key and a
    provider that made two effects."""
    if isinstance(adapter, GenericHttpAdapter):
        keys = adapter.contract.keys
        if deduplicates is None:
            deduplicates = keys.deduplicates
        if not keys.header:
            return {"header": "Idempotency-Key", "deduplicates": True} if deduplicates else "none"
        return {"header": keys.header, "deduplicates": deduplicates}
    if deduplicates is None:
        deduplicates = adapter.capabilities_for(action).idempotency_keys
    # an adapter in code (the sandbox's, SMTP): no header is known; a provider that does not
    # deduplicate is declared as having no keys (an email carries our key in its Message-ID)
    return {"header": "Idempotency-Key", "deduplicates": True} if deduplicates else "none"


def _proves(adapter: Adapter, action: str, event: ProviderEvent) -> bool:
    """Whether the stored ``event`` proves ``action``'s effect, read as the inbox reads it."""
    try:
        body = json.dumps(event.payload).encode("utf-8")
        return adapter.parse_event(body, webhook_id=event.event_id).proves_action == action
    except EventInvalid:
        return False


def _wait_for_event(
    adapter: Adapter,
    action: str,
    *,
    since: datetime,
    key: str,
    references: list[str],
    wait_seconds: float,
    sleep: Callable[[float], None],
) -> str:
    """Poll the stored events of the adapter's source for ones about ``key`` or ``references``
    (the business reference, the provider's ids) received since ``since``, for up to
    ``wait_seconds``, until one proves the effect; says what arrived."""
    if wait_seconds <= 0:
        return "not asked (--event-wait SECONDS)"
    if not adapter.receives_events() or not adapter.evidence_source:
        return "not expected: the action declares no events"
    about = Q(idempotency_key=key)
    for value in filter(None, references):
        about |= Q(reference=value) | Q(provider_reference=value)
    started = time.monotonic()
    while True:
        events = list(
            ProviderEvent.objects.filter(about, source=adapter.evidence_source, received_at__gte=since)
            .order_by("received_at")
            .only("event_id", "event_type", "payload")[:20]
        )
        waited = time.monotonic() - started
        proving = next((event for event in events if _proves(adapter, action, event)), None)
        if proving is not None:
            return (
                f"arrived and verified after {waited:.1f} s: {proving.event_type} {proving.event_id} "
                f"proves the effect (at {adapter.evidence_source})"
            )
        if waited >= wait_seconds:
            if events:
                types = ", ".join(sorted({event.event_type for event in events}))
                return f"arrived and verified ({types}), but none proves the effect within {wait_seconds:g} s"
            return f"none arrived within {wait_seconds:g} s (at {adapter.evidence_source})"
        sleep(EVENT_POLL_SECONDS)


def with_reference(
    schema: dict[str, Any], arguments: dict[str, Any], reference: str
) -> tuple[dict[str, Any], str]:
    """The arguments and business reference the probe sends: ``reference`` (``--reference``),
    else the arguments' ``reference``, else a fresh ``probe-<hex>``; when ``schema`` has a
    ``reference`` property and the arguments lack one, the arguments carry it too (a declared
    action's template or lookup may read either).

    Raises:
        ProbeRefused: ``reference`` and the arguments' ``reference`` differ.
    """
    given = arguments.get("reference")
    if reference and given is not None and given != reference:
        raise ProbeRefused(
            f"--reference {reference!r} and the arguments' reference {given!r} differ; give one of them"
        )
    if not reference and isinstance(given, str) and given:
        reference = given
    reference = reference or f"probe-{uuid.uuid4().hex[:12]}"
    properties = schema.get("properties")
    if given is None and isinstance(properties, dict) and "reference" in properties:
        arguments = {**arguments, "reference": reference}
    return arguments, reference


def probe_action(
    *,
    action: str,
    arguments: dict[str, Any],
    reference: str = "",
    event_wait_seconds: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
) -> ProbeReport:
    """Probe ``action``'s provider (module docstring) and report.

    Args:
        arguments: the action's arguments (its schema's; money in minor units).
        reference: the business reference sent; "" → the arguments' ``reference``, else a fresh
            ``probe-<hex>``; put into the arguments too when the schema has ``reference``
            (``with_reference``).
        event_wait_seconds: how long to wait for a stored event about the effect (0: not asked).

    Returns:
        the ``ProbeReport`` (``made_effect`` False when both requests failed: then no lookup was
        asked and no event awaited). Each request's deadline is
        ``EFFECT_LEDGER["PROVIDER_TIMEOUT_SECONDS"]``.

    Raises:
        ProbeRefused: the action is not served, its adapter is not a test endpoint
            (``Adapter.test_endpoint``), the arguments fail its schema, or ``reference`` and the
            arguments' differ. Nothing is sent.
    """
    try:
        adapter = get_adapter(action)
    except ActionUnavailable as exc:
        raise ProbeRefused(str(exc)) from exc
    if not adapter.test_endpoint:
        raise ProbeRefused(
            f"{action} is not a test endpoint: the probe sends the same request twice and makes real "
            'effects. Declare its provider\'s test mode as its own action with "test_mode": true and probe that.'
        )
    version = max(adapter.versions_for(action))
    arguments, reference = with_reference(adapter.argument_schema_for(action, version), arguments, reference)
    try:
        adapter.validate(action, arguments, version=version)
    except ArgumentsInvalid as exc:
        raise ProbeRefused(f"the arguments fail {action}'s schema: {exc}") from exc
    call = ExecutionCall(
        intent_id=str(uuid.uuid4()),
        action=action,
        action_version=version,
        arguments=arguments,
        idempotency_key=f"probe-{uuid.uuid4()}",
        fence=1,
        attempt_no=1,
        deadline_seconds=float(settings.EFFECT_LEDGER["PROVIDER_TIMEOUT_SECONDS"]),
        reference=reference,
    )
    key_sent = not isinstance(adapter, GenericHttpAdapter) or bool(adapter.contract.keys.header)
    since = timezone.now()
    first = _send(adapter, call)
    second = _send(adapter, dataclasses.replace(call, attempt_no=2))
    report = ProbeReport(
        action=action,
        idempotency_key=call.idempotency_key,
        reference=call.reference,
        key_label=_key_label(adapter),
        first=first,
        second=second,
        deduplicates=None,
        why="",
        lookup="not asked",
        key_sent=key_sent,
        adapter=adapter_label(action),
    )
    if not report.made_effect:
        return report
    found = adapter.lookup(call)
    deduplicates, why = key_verdict(first, second, found, call.idempotency_key, key_sent=key_sent)
    lookup = LOOKUP_VERDICTS[found.status]
    references = [call.reference, first.reference, second.reference, *found.provider_references]
    return dataclasses.replace(
        report,
        deduplicates=deduplicates,
        why=why,
        lookup=lookup,
        lookup_references=found.provider_references,
        lookup_detail=found.detail,
        events=_wait_for_event(
            adapter,
            action,
            since=since,
            key=call.idempotency_key,
            references=references,
            wait_seconds=event_wait_seconds,
            sleep=sleep,
        ),
        declare={
            "keys": _declared_keys(adapter, action, deduplicates),
            "lookup": _declared_lookup(adapter, action, lookup),
        },
    )
