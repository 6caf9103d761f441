"""The text of notices to approvers and operators: a deep link to the exact console page and a
summary of the intent, never its arguments (an approver reads those on the page, signed in).

A notice is our words with others' values in them: one field per line, each value an agent or
an administrator chose (the reference, the principal, the tenant, a currency code we do not
know) written by ``operations.notifications.quoting.as_data`` (quoted, escaped, links defanged),
so no value can start a line, pass for a field or a headline, or add a link: the deep link is
the only one (issue 39, item 8).

One notice is a message of its own; several for the same recipient are one digest listing each
with its link (``operations.services.notifications`` decides which).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from django.conf import settings
from django.urls import reverse

from operations.models import Intent, Notification
from operations.money import Money, format_plain, is_currency
from operations.notifications.quoting import as_data, one_line
from operations.policies.rules import Policy

SUBJECT_PREFIX = "[Effect Ledger]"

_HEADLINES = {
    Notification.Kind.APPROVAL_REQUESTED: "Approval requested",
    Notification.Kind.APPROVAL_EXPIRING: "Approval request about to expire",
    Notification.Kind.ESCALATED: "Escalated to operators",
    Notification.Kind.EFFECT_FOUND_LATE: "Effect found after the intent ended",
}
_PLURALS = {
    Notification.Kind.APPROVAL_REQUESTED: "approvals requested",
    Notification.Kind.APPROVAL_EXPIRING: "approval requests about to expire",
    Notification.Kind.ESCALATED: "escalated to operators",
    Notification.Kind.EFFECT_FOUND_LATE: "effects found after their intent ended",
}


@dataclass(frozen=True)
class Notice:
    """One notice, ready to write: its kind, headline, the deep link and the summary lines."""

    kind: str
    headline: str
    link: str
    lines: tuple[str, ...]

    def text(self) -> str:
        return "\n".join([f"{self.headline}: {self.link}", *(f"  {line}" for line in self.lines)])


def deep_link(kind: str, intent_id: object) -> str:
    """The absolute URL of the page where the notice is acted on: the approval page for an
    approval notice, the UNKNOWN item's page for an escalation, the intent's page (its timeline
    and its open finding) for an effect found late; ``EFFECT_LEDGER["PUBLIC_URL"]`` is the
    console's address as people reach it."""
    name = {
        Notification.Kind.ESCALATED: "unknown-detail",
        Notification.Kind.EFFECT_FOUND_LATE: "intent-detail",
    }.get(Notification.Kind(kind), "approval-detail")
    base = str(settings.EFFECT_LEDGER["PUBLIC_URL"]).rstrip("/")
    return f"{base}{reverse(name, args=[intent_id])}"


def _when(value: object) -> str:
    return value.strftime("%Y-%m-%d %H:%M UTC") if hasattr(value, "strftime") else "-"


def _amount(money: Money) -> str:
    if is_currency(money.currency):
        return format_plain(money.amount_minor, money.currency)
    # Refused at submission today, but possibly stored long ago: the code is the agent's text.
    return f"{money.amount_minor} minor units of {as_data(money.currency)}"


def notice_for(notification: Notification, intent: Intent) -> Notice:
    """The notice for ``notification``: action (and version), amount with its currency when the
    action moves money (``operations.money.format_plain``), reference, principal, tenant, risk
    tier and, for approvals, the request's expiry (UTC). The arguments themselves never appear.

    The reference, principal and tenant are written with ``as_data`` (``Reference: "ord-77"``,
    ``-`` when there is none); the action is a name this deployment registered (submission
    refuses any other, ``operations.adapters.registry.UnknownAction``), written with ``one_line``.
    """
    policy = Policy.from_snapshot(intent.policy)
    money = Money.of(intent.arguments)
    lines = [
        f"Action: {one_line(intent.action)} v{intent.action_version}",
        *([f"Amount: {_amount(money)}"] if money else []),
        f"Reference: {as_data(intent.reference) if intent.reference else '-'}",
        f"Principal: {as_data(intent.principal)}",
        f"Tenant: {as_data(intent.tenant)}",
        f"Risk: {one_line(policy.risk_tier)}",
    ]
    if notification.kind == Notification.Kind.ESCALATED:
        lines.append(f"Status: {intent.status}, escalated {_when(intent.escalated_at)}")
    elif notification.kind == Notification.Kind.EFFECT_FOUND_LATE:
        lines.append(
            f"Status: {intent.status}: it had ended without effect, and the provider has its effect "
            f"(found {_when(notification.created_at)}); its finding is open"
        )
    else:
        lines.append(f"Expires: {_when(intent.approval_expires_at)}")
    return Notice(
        kind=notification.kind,
        headline=_HEADLINES[Notification.Kind(notification.kind)],
        link=deep_link(notification.kind, intent.id),
        lines=tuple(lines),
    )


def render_message(notices: Sequence[Notice]) -> tuple[str, str]:
    """(subject, body) of one message carrying ``notices`` (at least one): the notice itself,
    or a digest counting them by kind and listing each with its link."""
    if len(notices) == 1:
        (notice,) = notices
        return f"{SUBJECT_PREFIX} {notice.headline}: {notice.lines[0].removeprefix('Action: ')}", (
            f"{notice.text()}\n"
        )
    counts = Counter(notice.kind for notice in notices)
    what = ", ".join(f"{n} {_PLURALS[Notification.Kind(kind)]}" for kind, n in counts.items())
    body = "\n\n".join(notice.text() for notice in notices)
    return f"{SUBJECT_PREFIX} {len(notices)} notices: {what}", f"{what}.\n\n{body}\n"
