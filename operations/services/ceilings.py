"""Ceilings as reservations (issue 18): spend and effects per tenant, action, currency and day.

A claim reserves its amount and one effect against ``SpendWindow`` rows *in the claim's own
transaction* (no extra commit), each with one conditional upsert that refuses to pass the cap::

    INSERT INTO operations_spendwindow (tenant, action, currency, day, spent_minor, effects)
    VALUES (...) ON CONFLICT (tenant, action, currency, day) DO UPDATE
       SET spent_minor = w.spent_minor + EXCLUDED.spent_minor, effects = w.effects + EXCLUDED.effects
     WHERE w.spent_minor + EXCLUDED.spent_minor <= <cap>          -- or effects + 1 <= <cap>
    RETURNING spent_minor

Concurrent claims of one window queue on its row lock, and each sees what the previous ones
reserved (PostgreSQL re-evaluates the ``WHERE`` on the newest row version), so the sum never
passes the cap: O(1) per claim, never a scan of past intents. No row returned means the cap is
reached; the claim rolls back and the intent goes to its approvers (``wait_reason`` "ceiling").

Which states hold a reservation, and why: an intent reserves once, at its first claim after it
last held none, and keeps it while its effect may exist or may still be made: RUNNING, a retry
back in READY (the attempt that failed may still have taken effect at a keyed provider, which the
retry replays under the same key), UNKNOWN, SUCCEEDED, COMPENSATING and COMPENSATED (the money
moved, even if it came back). It is released, in the same statement as the transition, when the
intent surely made no effect: FAILED (refused or failed without effect, including "absent" with
no re-send), CANCELLED, EXPIRED, REJECTED, and back to AWAITING_APPROVAL or HELD (nothing may be
sent until a person decides; the next claim reserves again). A worker SIGKILLed after reserving
leaves the intent RUNNING with its reservation; the lease takeover either finds the effect (kept)
or ends it without one (released), so nothing leaks and nothing is spent twice.

The day is the calendar day in UTC of the claim's database time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from operations.models import Intent, Reservation, SpendWindow
from operations.money import Money, format_plain
from operations.policies.rules import Policy, amount_rule
from operations.statements import Statement, insert_statement

_WINDOW = SpendWindow._meta.db_table
_RESERVATION = Reservation._meta.db_table

_UPSERT = f"""
    INSERT INTO {_WINDOW} AS w (tenant, action, currency, day, spent_minor, effects)
    VALUES (%s, %s, %s, %s, %s, %s)
    ON CONFLICT (tenant, action, currency, day) DO UPDATE
       SET spent_minor = w.spent_minor + EXCLUDED.spent_minor, effects = w.effects + EXCLUDED.effects
"""

#: Released in the transition's own statement: every open share of the intent is given back to
#: its window and marked released. Both read the same snapshot, so each share is given back once.
_RELEASE_WINDOWS = f"""
    UPDATE {_WINDOW} AS w
       SET spent_minor = w.spent_minor - r.spent_minor, effects = w.effects - r.effects
      FROM {_RESERVATION} AS r
     WHERE r.intent_id = %s AND r.released_at IS NULL
       AND w.tenant = r.tenant AND w.action = r.action AND w.currency = r.currency AND w.day = r.day
"""
_RELEASE_SHARES = f"""
    UPDATE {_RESERVATION} SET released_at = statement_timestamp()
     WHERE intent_id = %s AND released_at IS NULL
"""


class CeilingReached(Exception):
    """The claim would pass a ceiling: ``reason`` for the approver, ``data`` for the audit."""

    def __init__(self, reason: str, data: dict[str, Any]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.data = data


@dataclass(frozen=True)
class _Share:
    currency: str
    spent_minor: int
    effects: int
    cap: int | None  # the spend cap (currency rows) or the effects cap (the blank row)


def reservation_statements(intent: Intent, *, now: datetime, made: bool = False) -> list[Statement]:
    """The writes that reserve ``intent``'s share of its windows at claim, for ``run_together``.

    Each window upsert ``returns`` (None: the cap is reached; the caller rolls back and calls
    ``ceiling_refusal``). Empty when the policy sets no daily ceiling. ``now`` is the claim's
    database time (its UTC date is the window).

    ``made``: the effect already exists (late evidence after an ending that released the
    reservation, issue 38): it is counted whatever the caps say (``over_ceiling``), since the
    money moved; nothing is refused.

    Raises:
        CeilingReached: before any write, when one effect alone passes a cap (the amount is above
            the per-effect ceiling or the day's spend cap), unless a person allowed it
            (``intent.ceiling_override``).
    """
    policy = Policy.from_snapshot(intent.policy)
    ceilings = policy.ceilings
    money = Money.of(intent.arguments)
    override = intent.ceiling_override or made
    if money is not None and not override:
        max_amount = amount_rule(ceilings.max_amount_minor, money.currency)
        if max_amount is not None and money.amount_minor > max_amount:
            raise CeilingReached(
                f"amount {format_plain(money.amount_minor, money.currency)} ({money.amount_minor} minor units) "
                f"is above the per-effect ceiling of {format_plain(max_amount, money.currency)} "
                f"({max_amount} minor units)",
                {
                    "ceiling": "max_amount_minor",
                    "cap": max_amount,
                    "amount": money.amount_minor,
                    "currency": money.currency,
                },
            )
    if not ceilings.reserves:
        return []
    day = now.astimezone(UTC).date()
    shares = []
    if ceilings.effects_per_day is not None:
        shares.append(_Share("", 0, 1, ceilings.effects_per_day))
    if money is not None:
        cap = amount_rule(ceilings.spend_per_day_minor, money.currency)
        if ceilings.spend_per_day_minor is not None:
            shares.append(_Share(money.currency, money.amount_minor, 0, cap))
    statements: list[Statement] = []
    for share in shares:
        alone = share.effects if share.currency == "" else share.spent_minor
        if share.cap is not None and alone > share.cap and not override:
            raise CeilingReached(*_refusal(intent, share, day, spent=0))
        statements.append(_upsert(intent, share, day, override=override))
        statements.append(
            insert_statement(
                Reservation(
                    intent_id=intent.id,
                    tenant=intent.tenant,
                    action=intent.action,
                    currency=share.currency,
                    day=day,
                    spent_minor=share.spent_minor,
                    effects=share.effects,
                    over_ceiling=override,
                )
            )
        )
    return statements


def _upsert(intent: Intent, share: _Share, day: date, *, override: bool) -> Statement:
    params: list[Any] = [intent.tenant, intent.action, share.currency, day, share.spent_minor, share.effects]
    sql = _UPSERT
    if share.cap is not None and not override:
        column = "effects" if share.currency == "" else "spent_minor"
        sql += f" WHERE w.{column} + EXCLUDED.{column} <= %s"
        params.append(share.cap)
    return Statement(sql + " RETURNING w.spent_minor", tuple(params), returns=True)


def ceiling_refusal(intent: Intent, *, now: datetime) -> CeilingReached:
    """After a reservation came back empty (and the claim rolled back): which ceiling, and what
    the window holds now, for the approver and the audit."""
    policy = Policy.from_snapshot(intent.policy)
    money = Money.of(intent.arguments)
    day = now.astimezone(UTC).date()
    windows = {
        w.currency: w for w in SpendWindow.objects.filter(tenant=intent.tenant, action=intent.action, day=day)
    }
    effects_cap = policy.ceilings.effects_per_day
    if effects_cap is not None and "" in windows and windows[""].effects + 1 > effects_cap:
        return CeilingReached(
            *_refusal(intent, _Share("", 0, 1, effects_cap), day, spent=windows[""].effects)
        )
    if money is not None:
        cap = amount_rule(policy.ceilings.spend_per_day_minor, money.currency)
        spent = windows[money.currency].spent_minor if money.currency in windows else 0
        return CeilingReached(
            *_refusal(intent, _Share(money.currency, money.amount_minor, 0, cap), day, spent=spent)
        )
    return CeilingReached("a ceiling was reached", {"ceiling": "unknown", "day": day.isoformat()})


def _refusal(intent: Intent, share: _Share, day: date, *, spent: int) -> tuple[str, dict[str, Any]]:
    if share.currency == "":
        reason = (
            f"effects ceiling reached: {spent} of {share.cap} {intent.action} effects reserved on "
            f"{day.isoformat()} (UTC) for tenant {intent.tenant}"
        )
        return reason, {
            "ceiling": "effects_per_day",
            "cap": share.cap,
            "reserved": spent,
            "day": day.isoformat(),
        }
    cap = format_plain(share.cap, share.currency) if share.cap is not None else "no cap"  # a cap when refused
    reason = (
        f"spend ceiling reached: {format_plain(spent, share.currency)} + "
        f"{format_plain(share.spent_minor, share.currency)} would pass {cap} "
        f"({spent} + {share.spent_minor} > {share.cap} minor units) on {day.isoformat()} (UTC) for tenant {intent.tenant}"
    )
    return reason, {
        "ceiling": "spend_per_day_minor",
        "cap": share.cap,
        "reserved": spent,
        "amount": share.spent_minor,
        "currency": share.currency,
        "day": day.isoformat(),
    }


def release_statements(intent_id: Any) -> list[Statement]:
    """The writes that give back every open share ``intent_id`` holds (none: no rows touched);
    sent with the transition that ends its chance of an effect (``RELEASING_STATES``)."""
    return [Statement(_RELEASE_WINDOWS, (intent_id,)), Statement(_RELEASE_SHARES, (intent_id,))]


#: Entering one of these, an intent surely made no effect (or may make none before a person
#: decides again): its reservation is released in the same statement.
RELEASING_STATES = frozenset(
    {
        Intent.Status.FAILED,
        Intent.Status.CANCELLED,
        Intent.Status.EXPIRED,
        Intent.Status.REJECTED,
        Intent.Status.AWAITING_APPROVAL,
        Intent.Status.HELD,
    }
)
