"""What the restore drill counts: effects and requests read from the sandbox provider's own
ledger (never the ledger's tables), per provider kind (``KindCount``), and the drill's ``Row``
(judged by ``verdict.judge_restore_row``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
from django.db import connection

from console.lab.crashlab.restore_agent import KINDS, RestoreAgent
from console.lab.crashlab.verdict import RESTORE, Row
from operations.models import TERMINAL_STATUSES, Intent

#: States in which an intent stands in front of an operator (counted apart, never as lost).
OPERATOR_STATES = frozenset({Intent.Status.UNKNOWN, Intent.Status.HELD})


@dataclass
class KindCount:
    """What the drill measured for one provider kind (counts of references or effects)."""

    references: int = 0
    at_dump: dict[str, int] = field(default_factory=dict)
    lost_by_restore: int = 0
    resubmitted: int = 0
    effects: int = 0
    active: int = 0
    requests: int = 0
    duplicates: int = 0
    lost: int = 0
    failed_with_effect: int = 0
    operator: int = 0
    final: dict[str, int] = field(default_factory=dict)
    duplicate_references: list[str] = field(default_factory=list)
    lost_references: list[str] = field(default_factory=list)
    failed_references: list[str] = field(default_factory=list)


def provider_effects(
    provider: httpx.Client, kind: str, prefix: str, ref: str | None = None
) -> list[dict[str, Any]]:
    """The provider's effects of ``kind`` whose reference starts with ``prefix`` (only ``ref``'s
    when given), from ``GET /ledger``."""
    params = {"product": kind, **({"reference": ref} if ref else {})}
    response = provider.get("/ledger", params=params)
    response.raise_for_status()
    return [e for e in response.json()["effects"] if str(e.get("reference") or "").startswith(prefix)]


def provider_requests(provider: httpx.Client, kind: str, prefix: str) -> list[dict[str, Any]]:
    """The requests of ``kind`` the provider received whose reference starts with ``prefix``."""
    response = provider.get("/_sandbox/requests", params={"product": kind})
    response.raise_for_status()
    return [r for r in response.json()["requests"] if str(r.get("reference") or "").startswith(prefix)]


def newest_effect_age(provider: httpx.Client, kind: str, prefix: str) -> float | None:
    """Seconds since the drill's newest effect of ``kind`` at the provider (database clock):
    below the lookup lag, the restore guard's look-ups cannot see it yet."""
    effects = provider_effects(provider, kind, prefix)
    if not effects:
        return None
    newest = max(datetime.fromisoformat(str(e["created_at"])) for e in effects)
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        now: datetime = cursor.fetchone()[0]
    return round((now - newest).total_seconds(), 2)


def count_kind(
    provider: httpx.Client, agent: RestoreAgent, kind: str, at_dump: dict[str, str], lost: list[str]
) -> KindCount:
    """Count one provider kind once everything settled.

    Args:
        at_dump: the status of each reference's intent in the restored database.
        lost: the references the restore lost (re-submitted by the agent).
    """
    refs = agent.references(kind)
    effects = provider_effects(provider, kind, agent.prefix)
    per_ref = Counter(str(e["reference"]) for e in effects)
    states = agent.states_by_reference()
    duplicates = sorted(r for r in refs if per_ref[r] > 1)
    missing = sorted(r for r in refs if per_ref[r] == 0 and states.get(r) not in OPERATOR_STATES)
    failed = sorted(r for r in refs if per_ref[r] and states.get(r) == Intent.Status.FAILED)
    return KindCount(
        references=len(refs),
        at_dump=dict(Counter(at_dump.get(r, "lost") for r in refs)),
        lost_by_restore=sum(1 for r in refs if r in lost),
        resubmitted=sum(1 for r in refs if r in lost),
        effects=len(effects),
        active=sum(1 for e in effects if e.get("status") not in {"cancelled", "withdrawn"}),
        requests=len(provider_requests(provider, kind, agent.prefix)),
        duplicates=sum(per_ref[r] - 1 for r in duplicates),
        lost=len(missing),
        failed_with_effect=len(failed),
        operator=sum(1 for r in refs if states.get(r) in OPERATOR_STATES),
        final=dict(Counter(states.get(r, "absent") for r in refs)),
        duplicate_references=duplicates[:20],
        lost_references=missing[:20],
        failed_references=failed[:20],
    )


def restore_row(
    counts: dict[str, KindCount],
    groups: dict[str, list[str]],
    seconds: float,
    *,
    detail: dict[str, Any],
    strategy: str = RESTORE,
    boundary: str = "restore",
) -> Row:
    """The drill's row: the kinds' counts summed.

    Args:
        counts: per provider kind.
        groups: the references done / held / just submitted at the dump (the failover drill:
            when the replica was cut off).
        seconds: how long the drill ran.
        detail: more of the row's ``detail`` (recovery, notes, settings), after the counts.
        strategy, boundary: the row's (``restore-drill``/``restore`` or ``failover-drill``/``failover``).
    """

    def total(attribute: str) -> int:
        return sum(int(getattr(c, attribute)) for c in counts.values())

    not_terminal = sum(
        n for c in counts.values() for status, n in c.final.items()
        if status not in {*TERMINAL_STATUSES, Intent.Status.SUCCEEDED, *OPERATOR_STATES}
    )  # fmt: skip
    return Row(
        strategy=strategy,
        boundary=boundary,
        provider="+".join(KINDS),
        ops=total("references"),
        interrupted=total("lost_by_restore"),
        effects=total("effects"),
        missing=total("lost"),
        duplicates=total("duplicates"),
        active=total("active"),
        requests=total("requests"),
        kills=0,
        not_terminal=not_terminal,
        seconds=round(seconds, 2),
        failed_with_effect=total("failed_with_effect"),
        operator=total("operator"),
        detail={
            **{kind: count.__dict__ for kind, count in counts.items()},
            "groups_at_dump": {name: len(refs) for name, refs in groups.items()},
            **detail,
        },
    )
