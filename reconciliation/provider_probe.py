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
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from operations.adapters.base import Adapter, ExecutionCall, LookupKind, LookupResult, LookupStatus
from operations.adapters.contract import DEFAULT_LAG_SECONDS
from operations.adapters.errors import AdapterError, AmbiguousOutcome, ArgumentsInvalid
from operations.adapters.events import EventInvalid
from operations.adapters.generic_http import GenericHttpAdapter
from operations.adapters.registry import ActionUnavailable, adapter_label, get_adapter
from reconciliation.models import ProviderEvent

#: Seconds between two reads of the stored events while waiting for one.
EVENT_POLL_SECONDS = 0.25
#: What the lookup right after the effect said, by its status.
LOOKUP_VERDICTS = {
    LookupStatus.FOUND: "found",
    LookupStatus.NOT_FOUND_YET: "not found yet",
    LookupStatus.ABSENT: "not found yet",
    LookupStatus.UNSUPPORTED: "unsupported",
    LookupStatus.WITHDRAWN: "inconclusive",
    LookupStatus.INCONCLUSIVE: "inconclusive",
}


class ProbeRefused(Exception):
    """The probe will not run: the action is unknown, not a test endpoint, or its arguments fail
    its schema. Nothing was sent."""


@dataclass(frozen=True)
class Sent:
    """One of the two requests: the provider's reference for the effect, or the error raised
    (``ambiguous``: an ``AmbiguousOutcome``, which may have left an effect)."""

    reference: str = ""
    replayed: bool = False
    error: str = ""
    ambiguous: bool = False

    def describe(self) -> str:
        if self.error:
            return f"failed: {self.error}"
        return self.reference + (" (answered as a replay)" if self.replayed else "")


@dataclass(frozen=True)
class ProbeReport:
    """What the probe saw and what to declare.

    Attributes:
        key_label: the header our key went in (``Idempotency-Key``), or how the adapter sends it.
        key_sent: False for a declared action with ``"keys": "none"`` (no key was sent).
        adapter: the adapter's name for people (``registry.adapter_label``): only a
            ``generic HTTP`` action's capabilities are declared in a setting.
        deduplicates: True / False, None when the probe cannot tell (``why`` says why).
        lookup: one of ``LOOKUP_VERDICTS``' values.
        lookup_references: the effects the lookup listed for the key.
        events: what the wait for an event found ("not asked" without a wait).
        declare: the capabilities to declare: ``{"keys": ..., "lookup": ...}`` (contract fields).
    """

    action: str
    idempotency_key: str
    reference: str
    key_label: str
    first: Sent
    second: Sent
    deduplicates: bool | None
    why: str
    lookup: str
    lookup_references: tuple[str, ...] = ()
    lookup_detail: dict[str, Any] = field(default_factory=dict)
    events: str = "not asked (--event-wait SECONDS)"
    declare: dict[str, Any] = field(default_factory=dict)
    key_sent: bool = True
    adapter: str = "generic HTTP"

    @property
    def made_effect(self) -> bool:
        """False when both requests failed: nothing was measured and nothing is to be declared."""
        return not (self.first.error and self.second.error)

    @property
    def verdict(self) -> str:
        """``deduplicates <header>``, ``does not deduplicate <header>``, ``cannot tell ...`` or
        ``no key was sent (keys none)``."""
        if not self.key_sent:
            return "no key was sent (keys none)"
        if self.deduplicates is None:
            return f"cannot tell whether the provider deduplicates {self.key_label}"
        return f"{'deduplicates' if self.deduplicates else 'does not deduplicate'} {self.key_label}"

    def lines(self) -> list[str]:
        """The report as text lines, the capabilities last (indented JSON); without them when
        neither request made an effect (``made_effect``)."""
        head = [
            f"provider_probe {self.action}: key {self.idempotency_key}, reference {self.reference}",
            f"  request 1: {self.first.describe()}",
            f"  request 2, same key: {self.second.describe()}",
        ]
        if not self.made_effect:
            return [*head, f"  {self.failure()}"]
        listed = ", ".join(self.lookup_references)
        found = f" ({len(self.lookup_references)} for the key: {listed})" if listed else ""
        if self.lookup == "inconclusive":  # what the provider answered, to fix the declaration
            found = f" ({json.dumps(self.lookup_detail, sort_keys=True, default=str)[:300]})"
        if self.adapter == "generic HTTP":
            title = f"Capabilities to declare (EFFECT_LEDGER_GENERIC_HTTP[{self.action!r}]):"
        else:
            title = (
                f"Capabilities measured (the {self.adapter} adapter's are set in its code; "
                "no setting declares them):"
            )
        return [
            *head,
            f"  key: {self.verdict}{'; ' if not self.key_sent else ': '}{self.why}",
            f"  lookup right after the effect: {self.lookup}{found}",
            f"  event: {self.events}",
            title,
            json.dumps(self.declare, indent=2, sort_keys=True),
        ]

    def failure(self) -> str:
        """Why nothing was measured (``made_effect`` False): both requests failed."""
        maybe = (
            " (an ambiguous failure may still have left one at the test endpoint)"
            if self.first.ambiguous or self.second.ambiguous
            else ""
        )
        return (
            f"neither request made an effect{maybe}: both failed, so nothing was measured and there "
            "are no capabilities to declare; fix the arguments or the endpoint and probe again"
        )


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


def key_verdict(
    first: Sent, second: Sent, found: LookupResult, key: str, *, key_sent: bool = True
) -> tuple[bool | None, str]:
    """Whether the provider deduplicated the repeated key, and why (module docstring).

    Args:
        first, second: the two requests under one key.
        found: the lookup right after; its references count the effects for the key.
        key: our key (an adapter whose answer has no id reports the key as the reference; an
            email's reference may be its Message-ID, made from the key: neither is the
            provider's own id, so neither shows that the provider answered with a first effect).
        key_sent: False when no key was sent (``"keys": "none"``): the provider cannot have
            deduplicated a key, so the answer is False (two effects) or None.
    """
    listed = len(set(found.provider_references)) if found.status == LookupStatus.FOUND else None
    answered = not first.error and not second.error
    one = "one key" if key_sent else "two requests"
    if answered and first.reference != second.reference:
        made = f"two requests{' with one key' if key_sent else ''} made two effects"
        return False, f"{made} ({first.reference}, {second.reference})"
    if listed is not None and listed >= 2:
        return False, f"the lookup lists {listed} effects for the {one}"
    if not answered:
        return None, f"a request failed ({first.error or second.error})"
    providers_id = first.reference and key not in first.reference
    if providers_id:
        answered_first = f"the repeated request was answered with the first effect, {first.reference}"
        if key_sent:
            return True, answered_first
        return None, f"{answered_first}, although no key was sent (it matches requests on something else)"
    if listed == 1:
        if key_sent:
            return True, "the lookup lists one effect for the key"
        return None, "the lookup lists one effect for two requests, although no key was sent"
    if first.reference == key or not first.reference:
        ids = "the answers carry no id"
    else:
        ids = f"the answers carry only an id made from our key ({first.reference}), not one of the provider's own"
    if found.status == LookupStatus.UNSUPPORTED:
        return None, f"{ids}; the action has no lookup to count the effects"
    return None, f"{ids}; the lookup right after could not count the effects"


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
