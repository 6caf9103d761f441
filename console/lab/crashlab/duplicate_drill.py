"""The duplicate drill (case C18): duplicates at providers without idempotency keys, caused the
way operators cause them, must each be compensated or flagged by the reconciler's duplicate
checks — none missed.

Per provider, ``intents`` intents whose first send is lost while its effect exists:

* ``email.send``: the provider applies the email and drops the connection
  (``crash_after_effect``); its lookup by Message-ID lags, so the reconciler cannot see it yet.
* ``reservations.create``: the provider books late, after the client's deadline
  (``delay_after_effect``); until then its list by reference is empty. (A
  ``crash_after_effect`` booking is listed at once and the reconciler resolves it before any
  operator could: no duplicate would be created.)

The intent goes UNKNOWN; an operator marks it ``absent`` accepting the duplicate risk
(``reconciliation.resolution.resolve_absent``), so it is sent again and SUCCEEDED: two effects.
Then the email lag ends and the late bookings land, and the drill waits (bounded) for the
periodic reconcile pass, run by the cluster's beat and workers, to find every extra effect.

Everything is counted from the sandbox provider's ledger (created, active) and matched against
``DuplicateFinding`` rows (found, compensated, flagged); ``missed`` are extra effects that are
neither compensated nor flagged when the wait ends.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from console.lab.cluster import wait_until
from console.lab.crashlab.verdict import DRILL, Row
from operations.access.tenants import role_grants_set
from operations.exceptions import IntentMoved, ResolutionRefused
from operations.models import Intent, Outcome
from reconciliation.models import DuplicateFinding
from reconciliation.resolution import resolve_absent

if TYPE_CHECKING:
    from console.lab.crashlab.runner import CrashLab

logger = logging.getLogger("crashlab")

PROVIDERS = ("email", "reservations")
#: The adapters' consistency window during the lab (seconds): duplicate checks keep looking
#: this long after an intent ends. Set for the lab's workers through the environment.
CONSISTENCY_WINDOW_SECONDS = 15.0
#: The email lookup lag while the first sends are lost and re-sent (seconds); the drill ends
#: it as soon as every intent SUCCEEDED, a few seconds in, well inside the window.
EMAIL_LAG_SECONDS = 60.0
#: How long after the client's deadline a lost booking lands (seconds): long enough for the
#: operator's ``absent`` and the second send to come first.
LATE_BOOKING_SECONDS = 5.0
#: Bounds of the drill's waits (seconds).
FORCE_TIMEOUT = 45.0
CHECKS_TIMEOUT = CONSISTENCY_WINDOW_SECONDS + 25.0
OPERATOR = "crashlab-operator"


@dataclass
class ProviderCount:
    """What the drill measured at one provider (all counts, no units)."""

    intents: int = 0
    resolved_absent: int = 0
    effects: int = 0
    missing: int = 0
    created: int = 0
    active: int = 0
    requests: int = 0
    found: int = 0
    compensated: int = 0
    flagged: int = 0
    missed: int = 0
    false_findings: int = 0
    compensations: int = 0
    not_terminal: int = 0
    missed_references: list[str] = field(default_factory=list)

    @property
    def settled(self) -> bool:
        """Every duplicate compensated or flagged, no finding still in progress."""
        return self.missed == 0 and self.compensated + self.flagged == self.found


def _operator() -> Any:
    user, _ = get_user_model().objects.get_or_create(username=OPERATOR, defaults={"is_active": True})
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    role_grants_set(user=user, roles=["operator"], tenants=None)  # the lab's tenants: every one
    return user


class DuplicateDrill:
    """One run of the drill on a running crash lab (its cluster, beat and sandbox provider).

    Args:
        lab: the ``CrashLab`` whose cluster and sandbox provider the drill uses.
        intents: intents per provider.
        provider_timeout: the workers' provider deadline in seconds.
    """

    def __init__(self, lab: CrashLab, *, intents: int, provider_timeout: float) -> None:
        self.lab = lab
        self.intents = intents
        self.provider_timeout = provider_timeout
        self.prefix = f"dup-{uuid.uuid4().hex[:8]}-"
        self.refs = {p: [f"{self.prefix}{p[:3]}-{n:04d}" for n in range(intents)] for p in PROVIDERS}
        self.ids: dict[str, list[uuid.UUID]] = {}
        self.resolved: set[uuid.UUID] = set()

    def run(self) -> Row:
        """Force the duplicates, wait for the reconciler, and count; one row for both providers.

        Raises:
            HarnessError: a submission refused, or the intents did not end within
                ``FORCE_TIMEOUT`` seconds (the drill could not set itself up).
        """
        started = time.monotonic()
        provider = self.lab.sandbox_client()
        provider.post("/_sandbox/reset").raise_for_status()
        try:
            self._force(provider)
            provider.post("/_sandbox/config", json={"email_lookup_lag_seconds": 0}).raise_for_status()
            counts = self._wait_for_checks()
        finally:
            provider.post("/_sandbox/config", json={"email_lookup_lag_seconds": 0})
        return self._row(counts, time.monotonic() - started)

    # --- forcing the duplicates ----------------------------------------------------------------

    def _force(self, provider: Any) -> None:
        provider.post(
            "/_sandbox/config", json={"email_lookup_lag_seconds": EMAIL_LAG_SECONDS}
        ).raise_for_status()
        for ref in self.refs["email"]:
            provider.post(
                "/_sandbox/faults",
                json={"product": "email", "mode": "crash_after_effect", "match": {"reference": ref}},
            ).raise_for_status()
        for ref in self.refs["reservations"]:
            provider.post(
                "/_sandbox/faults",
                json={
                    "product": "reservations",
                    "mode": "delay_after_effect",
                    "delay_seconds": self.provider_timeout + LATE_BOOKING_SECONDS,
                    "match": {"reference": ref},
                },
            ).raise_for_status()
        for name in PROVIDERS:
            self.ids[name] = [uuid.UUID(str(i)) for i in self.lab.submit_intents(name, self.refs[name])]
        every = [i for ids in self.ids.values() for i in ids]
        operator = _operator()

        def operator_round() -> bool:
            for intent_id, status, attempts in Intent.objects.filter(id__in=every).values_list(
                "id", "status", "attempt_count"
            ):
                if intent_id in self.resolved or status != Intent.Status.UNKNOWN or attempts != 1:
                    continue
                try:
                    resolve_absent(
                        intent_id=intent_id,
                        user=operator,
                        reason="crash lab duplicate drill: the provider shows nothing yet; resend",
                        accept_duplicate_risk=True,
                    )
                    self.resolved.add(intent_id)
                except (IntentMoved, ResolutionRefused) as exc:  # the reconciler came first
                    logger.warning(
                        "operator's absent refused", extra={"intent_id": str(intent_id), "error": str(exc)}
                    )
            return not Intent.objects.filter(id__in=every).exclude(status=Intent.Status.SUCCEEDED).exists()

        wait_until(
            operator_round, FORCE_TIMEOUT, "every drill intent to be resent and SUCCEEDED", interval=0.1
        )

    # --- waiting for the reconciler -------------------------------------------------------------

    def _landed(self) -> bool:
        """Every request the provider received for the drill has applied its effect (the late
        bookings have landed)."""
        for name in PROVIDERS:
            effects = len(self.lab.provider_effects(name, self.prefix))
            requests = len(self.lab.provider_requests(name, self.prefix))
            if effects < requests:
                return False
        return True

    def _wait_for_checks(self) -> dict[str, ProviderCount]:
        deadline = time.monotonic() + CHECKS_TIMEOUT
        while time.monotonic() < deadline:
            if self._landed():
                counts = {name: self.count(name) for name in PROVIDERS}
                if all(c.settled for c in counts.values()):
                    return counts
            time.sleep(0.25)
        return {name: self.count(name) for name in PROVIDERS}

    # --- counting ---------------------------------------------------------------------------------

    def count(self, name: str) -> ProviderCount:
        """Match the provider's ledger for ``name`` against the intents' outcomes and findings."""
        ids = self.ids[name]
        effects = self.lab.provider_effects(name, self.prefix)
        per_ref = Counter(str(e["reference"]) for e in effects)
        status_of = {str(e["id"]): e.get("status") for e in effects}
        intents = {i.id: i for i in Intent.objects.filter(id__in=ids)}
        kept = dict(
            Outcome.objects.filter(intent_id__in=ids)
            .order_by("-created_at")
            .values_list("intent_id", "provider_reference")
        )  # the first outcome of each intent wins (later rows are overwritten)
        extras: set[str] = set()
        for intent in intents.values():
            mine = [str(e["id"]) for e in effects if e["reference"] == intent.reference]
            keep = kept.get(intent.id) or (mine[0] if mine else "")
            extras.update(ref for ref in mine if ref != keep)
        findings = list(DuplicateFinding.objects.filter(intent_id__in=ids).select_related("compensation"))
        compensated = {
            f.provider_reference
            for f in findings
            if f.state == DuplicateFinding.State.RESOLVED
            and f.compensation is not None
            and f.compensation.status == Intent.Status.SUCCEEDED
            and status_of.get(f.provider_reference) == "cancelled"
        }
        flagged = {f.provider_reference for f in findings if f.state == DuplicateFinding.State.OPEN}
        missed = sorted(extras - compensated - flagged)
        return ProviderCount(
            intents=len(ids),
            resolved_absent=len(self.resolved & set(ids)),
            effects=len(effects),
            missing=sum(1 for i in intents.values() if per_ref[i.reference] == 0),
            created=len(effects) - sum(1 for i in intents.values() if per_ref[i.reference]),
            active=sum(1 for e in effects if e.get("status") not in {"cancelled", "withdrawn"}),
            requests=len(self.lab.provider_requests(name, self.prefix)),
            found=len(findings),
            compensated=len(compensated & extras),
            flagged=len(flagged & extras),
            missed=len(missed),
            false_findings=sum(1 for f in findings if f.provider_reference not in extras),
            compensations=Intent.objects.filter(compensates_id__in=ids).count(),
            not_terminal=sum(1 for i in intents.values() if i.status != Intent.Status.SUCCEEDED),
            missed_references=missed[:20],
        )

    def _row(self, counts: dict[str, ProviderCount], seconds: float) -> Row:
        email, reservations = counts["email"], counts["reservations"]

        def total(attribute: str) -> int:
            return sum(int(getattr(c, attribute)) for c in counts.values())

        return Row(
            strategy=DRILL,
            boundary="operator-absent",
            provider="+".join(PROVIDERS),
            ops=total("intents"),
            interrupted=total("intents"),
            effects=total("effects"),
            missing=total("missing"),
            duplicates=total("created"),
            active=total("active"),
            requests=total("requests"),
            kills=0,
            not_terminal=total("not_terminal"),
            compensations=total("compensations"),
            seconds=round(seconds, 2),
            found=total("found"),
            compensated=total("compensated"),
            flagged=total("flagged"),
            missed=total("missed"),
            detail={
                "email": email.__dict__,
                "reservations": reservations.__dict__,
                "consistency_window_seconds": CONSISTENCY_WINDOW_SECONDS,
                "late_booking_seconds": self.provider_timeout + LATE_BOOKING_SECONDS,
                "false_findings": total("false_findings"),
            },
        )
