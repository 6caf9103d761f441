"""What ``manage.py provider_probe`` reports (``reconciliation.provider_probe``, issue 33): the two
requests sent under one key, the verdict on whether the provider deduplicated them, and the
report's text with the capabilities to declare.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from operations.adapters.base import LookupResult, LookupStatus

#: What the lookup right after the effect said, by its status.
LOOKUP_VERDICTS = {
    LookupStatus.FOUND: "found",
    LookupStatus.NOT_FOUND_YET: "not found yet",
    LookupStatus.ABSENT: "not found yet",
    LookupStatus.UNSUPPORTED: "unsupported",
    LookupStatus.WITHDRAWN: "inconclusive",
    LookupStatus.INCONCLUSIVE: "inconclusive",
}


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


def key_verdict(
    first: Sent, second: Sent, found: LookupResult, key: str, *, key_sent: bool = True
) -> tuple[bool | None, str]:
    """Whether the provider deduplicated the repeated key, and why (the rules:
    ``reconciliation.provider_probe``'s module docstring).

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
