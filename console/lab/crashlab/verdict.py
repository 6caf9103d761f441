"""Judging crash-lab rows. Pure functions over measured numbers, so the verdict itself can be
tested by feeding it any row (for instance a control's row in the ledger's place).

The reference table (shared/seeds/000): with every tenth first attempt interrupted, retrying
without deduplication and recording completion after the call both repeat the interrupted
effects after an after-effect crash (110 for 100 operations); recording completion before the
call loses them after a before-effect crash (90 effects, 10 missing); a stable key that the
provider deduplicates gives 100 effects and 0 missing in every column.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

LEDGER = "ledger"
#: The duplicate drill's row (``duplicate_drill``): duplicates at providers without keys.
DRILL = "duplicate-drill"
#: The restore drill's row (``restore_drill``): the ledger's database restored from a dump.
RESTORE = "restore-drill"
#: The failover drill's row (``failover_drill``): a lagging streaming replica promoted.
FAILOVER = "failover-drill"


@dataclass
class Row:
    """One measured cell: a strategy at a crash boundary, counted at the provider.

    Attributes:
        strategy: ``retry``, ``record-after``, ``record-before``, ``ledger`` or
            ``duplicate-drill``, ``restore-drill`` or ``failover-drill``.
        boundary: ``none``, ``before-effect``, ``after-effect`` or ``timeout``
            (``operator-absent`` for the duplicate drill, ``restore`` for the restore drill,
            ``failover`` for the failover drill).
        provider: ``payments``, ``email`` or ``reservations`` (``email+reservations`` for the
            duplicate drill).
        ops: distinct operations submitted.
        interrupted: first attempts interrupted at the boundary (every tenth).
        effects: effects in the provider's ledger for these operations.
        missing: operations with no effect at all.
        duplicates: effects beyond the first for an operation (``effects - (ops - missing)``).
        active: effects still active (reservations: not cancelled); equals effects elsewhere.
        requests: requests the provider received for these operations.
        kills: worker processes killed with SIGKILL.
        not_terminal: (ledger) intents not in a terminal state at the end.
        compensations: (ledger) compensation intents opened.
        seconds: wall time of the cell.
        found: (drill) duplicate findings recorded for these intents.
        compensated: (drill) extra effects whose finding is resolved by a compensation that
            SUCCEEDED and that the provider shows cancelled.
        flagged: (drill) extra effects whose finding is open for operators.
        missed: (drill) extra effects neither compensated nor flagged when the wait ended.
        failed_with_effect: (restore) references whose intent is FAILED although the
            provider holds an effect for them.
        operator: (restore) references whose intent is UNKNOWN or HELD in front of an operator
            at the end (not lost, not done: counted apart).
        detail: (drills) the same counts per provider, and the drill's timings.
    """

    strategy: str
    boundary: str
    provider: str
    ops: int
    interrupted: int
    effects: int
    missing: int
    duplicates: int
    active: int
    requests: int
    kills: int
    not_terminal: int = 0
    compensations: int = 0
    seconds: float = 0.0
    found: int = 0
    compensated: int = 0
    flagged: int = 0
    missed: int = 0
    failed_with_effect: int = 0
    operator: int = 0
    detail: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        return asdict(self)


def judge_ledger_row(row: Row) -> list[str]:
    """What is wrong with a row that claims to be the product's path: every operation exactly
    one (active) effect, nothing missing, every intent terminal, every planned kill done."""
    problems = []
    if row.missing:
        problems.append(f"{row.missing} operation(s) missing")
    if row.provider == "reservations":
        if row.active != row.ops:
            problems.append(f"{row.active} active reservations for {row.ops} operations")
    elif row.duplicates or row.effects != row.ops:
        problems.append(f"{row.effects} effects for {row.ops} operations ({row.duplicates} duplicate(s))")
    if row.not_terminal:
        problems.append(f"{row.not_terminal} intent(s) not terminal")
    if row.boundary in {"before-effect", "after-effect"} and row.kills != row.interrupted:
        problems.append(f"{row.kills} kill(s) for {row.interrupted} planned")
    return problems


def judge_drill_row(row: Row) -> list[str]:
    """What is wrong with the duplicate drill's row: it must have created duplicates (else it
    proved nothing), and every one must be compensated or flagged, none missed, no finding for
    an effect that is not a duplicate, no finding left half-handled; every intent SUCCEEDED
    with an effect, and only compensated duplicates cancelled."""
    problems = []
    if row.duplicates <= 0:
        problems.append("no duplicate was created: the drill exercised nothing")
    if row.missed:
        problems.append(
            f"{row.missed} of {row.duplicates} duplicate(s) missed (neither compensated nor flagged)"
        )
    if row.compensated + row.flagged != row.found:
        problems.append(f"{row.found} finding(s), but {row.compensated} compensated + {row.flagged} flagged")
    if row.found > row.duplicates:
        problems.append(f"{row.found} finding(s) for {row.duplicates} duplicate(s)")
    if row.missing:
        problems.append(f"{row.missing} intent(s) without any effect")
    if row.not_terminal:
        problems.append(f"{row.not_terminal} intent(s) not SUCCEEDED")
    if row.active != row.effects - row.compensated:
        problems.append(
            f"{row.active} active effect(s); expected {row.effects - row.compensated} "
            f"({row.effects} minus {row.compensated} compensated)"
        )
    return problems


def judge_restore_row(row: Row) -> list[str]:
    """What is wrong with the restore drill's row: the kill drills' bar (no reference with a
    second effect, none without its effect unless an operator holds it), no intent FAILED whose
    reference has an effect, every kind of the lab exercised, the restore lost intents (else it
    proved nothing), and recovery ran and ended the pause."""
    problems = []
    if row.duplicates:
        problems.append(f"{row.duplicates} duplicate effect(s) at the provider")
    if row.missing:
        problems.append(f"{row.missing} reference(s) lost (no effect, not in front of an operator)")
    if row.failed_with_effect:
        problems.append(f"{row.failed_with_effect} intent(s) FAILED whose effect the provider holds")
    if row.interrupted <= 0:
        event = "promotion" if row.strategy == FAILOVER else "restore"
        problems.append(f"the {event} lost no intent: the drill exercised nothing")
    if row.not_terminal:
        problems.append(f"{row.not_terminal} intent(s) neither ended nor in front of an operator")
    kinds = [name for name in row.provider.split("+") if name]
    absent = [name for name in kinds if not (row.detail.get(name) or {}).get("references")]
    if absent:
        problems.append(f"no intent of {', '.join(absent)}")
    recovery = row.detail.get("recovery") or {}
    if not recovery.get("ok"):
        problems.append(f"recovery did not finish and resume execution ({recovery.get('by', 'none')})")
    return problems


def judge_failover_row(row: Row) -> list[str]:
    """What is wrong with the failover drill's row: the restore drill's bar
    (``judge_restore_row``), and proof that the promoted replica really lagged: the primary's
    last WAL position past the replica's, and intents the primary held that the promoted
    database did not (``detail["lag"]``, measured by ``failover_drill``)."""
    problems = judge_restore_row(row)
    lag = row.detail.get("lag") or {}
    if int(lag.get("wal_bytes_behind") or 0) <= 0:
        problems.append("the promoted replica was not behind the primary's WAL: no lag to fail over from")
    if int(lag.get("primary_intents") or 0) <= int(lag.get("promoted_intents") or 0):
        problems.append(
            f"the promoted database held {lag.get('promoted_intents')} of the primary's "
            f"{lag.get('primary_intents')} intents: it lacked no commit"
        )
    return problems


#: What each control must show, for the crashes to count as real.
CONTROL_EXPECTATIONS = {
    ("retry", "after-effect"): "duplicates",
    ("record-after", "after-effect"): "duplicates",
    ("retry", "timeout"): "duplicates",
    ("record-after", "timeout"): "duplicates",
    ("record-before", "before-effect"): "missing",
}


def judge_control_row(row: Row) -> list[str]:
    """What is wrong with a control row: where the reference table predicts duplicates or
    losses, exactly one per interrupted operation must appear (proof that the crash was real)."""
    expected = CONTROL_EXPECTATIONS.get((row.strategy, row.boundary))
    problems = []
    if row.boundary in {"before-effect", "after-effect"} and row.kills != row.interrupted:
        problems.append(f"{row.kills} kill(s) for {row.interrupted} planned")
    if expected == "duplicates" and row.duplicates != row.interrupted:
        problems.append(f"expected {row.interrupted} duplicate(s), measured {row.duplicates}")
    if expected == "missing" and row.missing != row.interrupted:
        problems.append(f"expected {row.interrupted} missing, measured {row.missing}")
    return problems


def judge(rows: list[Row]) -> bool:
    """Fill each row's ``problems`` and return True when every row passes."""
    for row in rows:
        if row.strategy == DRILL:
            row.problems = judge_drill_row(row)
        elif row.strategy == RESTORE:
            row.problems = judge_restore_row(row)
        elif row.strategy == FAILOVER:
            row.problems = judge_failover_row(row)
        elif row.strategy == LEDGER:
            row.problems = judge_ledger_row(row)
        else:
            row.problems = judge_control_row(row)
    return not any(row.problems for row in rows)


def rows_from_json(data: dict[str, Any]) -> list[Row]:
    """Rows of a saved report (``--json`` output), problems cleared for re-judging."""
    return [Row(**{**row, "problems": []}) for row in data["rows"]]
