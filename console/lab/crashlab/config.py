"""What a crash-lab run does (``LabConfig``): the matrix of boundaries, strategies and variants,
the timings of the lab's cluster, the fault each boundary injects at the sandbox provider, and
the action and arguments each provider kind is driven with (``arguments_for``, shared by the
drills and the acceptance gate).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from console.lab.crashlab.naive import STRATEGIES as NAIVE_STRATEGIES
from console.lab.crashlab.verdict import LEDGER

BOUNDARIES = ("none", "before-effect", "after-effect", "timeout")
STRATEGIES = (*NAIVE_STRATEGIES, LEDGER)
#: Variants of the ledger row on providers without keys (from the article's discussion).
VARIANTS = (("email", "after-effect"), ("reservations", "after-effect"))

PROVIDER_TIMEOUT = 3.0  # the workers' provider deadline, seconds
LEASE_SECONDS = 6
HOLD_SECONDS = 30.0
FAULTS = {
    "before-effect": "hold_before_effect",
    "after-effect": "hold_after_effect",
    "timeout": "delay_after_effect",
}
ACTIONS = {"payments": "payments.charge", "email": "email.send", "reservations": "reservations.create"}
#: Settings (and environment variables of the lab's workers) holding the adapters' windows.
WINDOW_SETTINGS = (
    "SANDBOX_EMAIL_CONSISTENCY_WINDOW_SECONDS",
    "SANDBOX_RESERVATIONS_CONSISTENCY_WINDOW_SECONDS",
)


@dataclass
class LabConfig:
    """What to run: ``ops`` per cell, which boundaries, strategies and variants, whether the
    duplicate drill runs (``drill``, ``drill_intents`` per provider), whether the restore drill
    runs (``restore``, ``restore_intents`` per kind and batch, ``restore_by_command``: recovery by
    ``manage.py recover`` instead of the workers' automatic one; the failover drill's too), whether
    the failover drill runs (``failover``, ``failover_intents`` per kind and batch), and how many
    worker processes (``workers`` x ``concurrency`` pool processes)."""

    ops: int = 100
    boundaries: tuple[str, ...] = BOUNDARIES
    strategies: tuple[str, ...] = STRATEGIES
    variants: bool = True
    workers: int = 2
    concurrency: int = 4
    drill: bool = True
    drill_intents: int | None = None
    restore: bool = True
    restore_intents: int | None = None
    restore_by_command: bool = False
    failover: bool = False
    failover_intents: int | None = None

    @property
    def intents_per_drill_provider(self) -> int:
        """Intents per provider in the duplicate drill: ``drill_intents``, else one per ten
        operations (as many as a cell interrupts), at least one."""
        return self.drill_intents if self.drill_intents is not None else max(1, self.ops // 10)

    @property
    def intents_per_restore_batch(self) -> int:
        """Intents per provider kind in each batch of the restore drill: ``restore_intents``,
        else one per ten operations, at least three (done, held and just submitted at the dump)."""
        return self.restore_intents if self.restore_intents is not None else max(3, self.ops // 10)

    @property
    def intents_per_failover_batch(self) -> int:
        """Intents per provider kind in each batch of the failover drill: ``failover_intents``,
        else one per ten operations, at least three (done, held and just submitted at the cut)."""
        return self.failover_intents if self.failover_intents is not None else max(3, self.ops // 10)


def arguments_for(provider: str, reference: str, n: int) -> dict[str, Any]:
    """Valid arguments of ``ACTIONS[provider]`` carrying ``reference``."""
    if provider == "email":
        return {"to": f"lab{n}@example.test", "subject": "Lab", "body": "crash lab", "reference": reference}
    if provider == "reservations":
        return {"resource": "lab-room", "start": "2026-12-01T09:00:00Z", "seats": 1, "reference": reference}
    return {"amount": 100 + n, "currency": "EUR", "customer": "cus_lab", "reference": reference}
