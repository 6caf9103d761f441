"""Operators' work on provider findings (issue 19): an orphan event, an effect extra at the
provider, an intent missing at the provider, an amount mismatch (``ProviderFinding``).

Three decisions, each with a required reason, on an open finding only:

* ``link``: the line or event is the effect of an intent the operator names (it must exist, be
  an intent of one of the source's actions and, where both are known, ask the amount and
  currency the line or event holds: another amount is not its effect, so compensate or close
  instead); the finding is resolved and the statement line (or the event, when it has none yet)
  records the intent. The intent's open ``missing_at_provider`` findings of the same source are
  resolved with it (``linked``: its effect is the linked one), in the same transaction. For
  lines and events only (``extra_at_provider``, ``orphan_event``).
* ``compensate``: open a compensation intent that undoes the finding's provider reference,
  where the finding's intent's action has a compensation (``reconciliation.finding_compensation``). An amount
  mismatch is the intent's own effect: the intent goes COMPENSATING, then COMPENSATED. Any other
  is an effect that is not the intent's own (never the one it holds): a compensation of cause
  ``duplicate``, the intent's state untouched; an effect no intent has (an orphan event, a line
  with no intent) is attributed to the intent the operator names (of the source's actions; any
  amount: the compensation is recorded with that intent). The compensation undoes the amount and
  currency the provider holds (the finding's), not the intent's: an amount mismatch's refund is
  of what was charged. The finding is ``compensating`` until it ends (``reconciliation.finding_follow_up``: resolved
  when it SUCCEEDED, open again when it cannot). Not for ``missing_at_provider``: a missing
  effect has nothing to undo.
* ``close``: the finding stands explained (resolved), e.g. a line of a provider fee.

Audit: a decision on a finding with an intent is an event ``provider_finding_<verb>`` on that
intent's hash-chained audit log (who, the reason, the finding; appended under the intent's row
lock, as ``operations.services.intent_record_refusal`` does) and, as duplicate findings are
(``reconciliation.resolution``), an ``Evidence`` row of kind ``resolution`` on it (the evidence
shown); ``link`` records both on the linked intent (and on the intent the finding had before,
if another). A finding without
an intent (an orphan event, a line no intent has) belongs to no intent's chain: the decision is
an event on the chain of events without an intent (``operations.audit.trail.audit_append_unattached``,
event ``provider_finding_<verb>``), which ``verify_audit`` checks. Refusals are recorded the
same two ways (``decision_refused``), after the refused decision was rolled back.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from operations.access.tenants import console_scope, role_scope
from operations.adapters.bounds import clean_text
from operations.audit.trail import REFUSAL_EVENT, audit_append, audit_append_unattached
from operations.exceptions import ResolutionRefused
from operations.models import Intent
from operations.money import format_plain
from operations.services import intent_record_refusal
from reconciliation.attribution import attribute
from reconciliation.decision_checks import RESOLVER_GROUPS
from reconciliation.finding_compensation import OWN_EFFECT, open_compensation
from reconciliation.models import Evidence, ProviderEvent, ProviderFinding, StatementLine
from reconciliation.selectors import intent_evidence
from reconciliation.statement_sources import StatementRefused, source_actions

VERBS = ("link", "compensate", "close")
#: Findings of a line or an event that an operator may link to an intent.
LINKABLE = (ProviderFinding.Kind.EXTRA_AT_PROVIDER, ProviderFinding.Kind.ORPHAN_EVENT)


def can_work(user: User, finding: ProviderFinding) -> bool:
    """Operators and admins may work a finding: of its intent's tenant, or, for a finding
    without an intent (it belongs to no tenant), on every tenant."""
    scope = role_scope(user, RESOLVER_GROUPS)
    if finding.intent_id is not None:
        return scope.allows(finding.intent.tenant)  # type: ignore[union-attr]
    return scope.every


def can_read(user: User, finding: ProviderFinding) -> bool:
    """A console reader sees a finding of a tenant they may read; one without an intent only
    with a role on every tenant."""
    scope = console_scope(user)
    return scope.allows(finding.intent.tenant) if finding.intent_id is not None else scope.every  # type: ignore[union-attr]


def _actor(user: User) -> str:
    return f"user:{user.get_username()}"


def _evidence(
    intent: Intent, user: User, verb: str, reason: str, finding: ProviderFinding, **detail: Any
) -> None:
    Evidence.objects.create(
        intent=intent,
        kind=Evidence.Kind.RESOLUTION,
        result=f"finding_{verb}",
        provider_references=[finding.provider_reference] if finding.provider_reference else [],
        actor=_actor(user),
        detail={
            "reason": reason,
            "finding_id": finding.id,
            "finding_kind": finding.kind,
            "source": finding.source,
            "evidence_shown": [e.id for e in intent_evidence(intent)],
            **detail,
        },
    )


def finding_data(finding: ProviderFinding) -> dict[str, Any]:
    """What an audit event of a decision on ``finding`` records of it: its id, kind, source,
    fingerprint and provider reference."""
    return {
        "finding_id": finding.id,
        "finding_kind": finding.kind,
        "source": finding.source,
        "fingerprint": finding.fingerprint,
        "provider_reference": finding.provider_reference,
    }


def _audit(
    intent_id: uuid.UUID, user: User, verb: str, reason: str, finding: ProviderFinding, **detail: Any
) -> None:
    """Append ``provider_finding_<verb>`` to the intent's audit chain, under its row lock."""
    Intent.objects.select_for_update().filter(id=intent_id).values("id").first()
    audit_append(
        intent_id=intent_id,
        event=f"provider_finding_{verb}",
        actor=_actor(user),
        reason=clean_text(reason),
        data={**finding_data(finding), **detail},
    )


def _unattached(event: str, user: User, reason: str, finding: ProviderFinding, **detail: Any) -> None:
    audit_append_unattached(
        event=event,
        actor=_actor(user),
        reason=reason[:2000],
        data={**finding_data(finding), **detail},
    )


def resolve_provider_finding(
    *, finding_id: int, user: User, verb: str, reason: str, intent_id: str = ""
) -> ProviderFinding:
    """Decide on an open provider finding (module docstring); the decision and any refusal
    are audited.

    Args:
        verb: ``link``, ``compensate`` or ``close``.
        intent_id: for ``link``, the intent the line or event belongs to (text, a UUID).

    Raises:
        ResolutionRefused: no such finding (or one the user may not read), no permission, no
            reason, not open, an unknown verb; link: not a line or event, no such intent, or an
            intent of another source's action; compensate: no intent, nothing to undo, or no
            compensation action.
    """
    try:
        with transaction.atomic():
            return _decide(finding_id, user, verb, reason, intent_id)
    except ResolutionRefused as refused:
        finding = ProviderFinding.objects.select_related("intent").filter(id=finding_id).first()
        if finding is not None and can_read(user, finding):
            if finding.intent_id is not None:
                intent_record_refusal(
                    intent_id=finding.intent_id,
                    actor=_actor(user),
                    decision=f"provider finding {verb}",
                    reason=refused.detail,
                    shown={"finding_id": str(finding_id), "intent_id": intent_id[:100]},
                    given_reason=reason,
                )
            else:
                _unattached(
                    REFUSAL_EVENT,
                    user,
                    refused.detail,
                    finding,
                    decision=f"provider finding {verb}",
                    given_reason=reason[:2000],
                    intent_id=intent_id[:100],
                )
        raise


def _decide(finding_id: int, user: User, verb: str, reason: str, intent_id: str) -> ProviderFinding:
    finding = ProviderFinding.objects.select_for_update().filter(id=finding_id).first()
    if finding is None or not can_read(user, finding):
        raise ResolutionRefused(f"no provider finding {finding_id}")
    if not can_work(user, finding):
        raise ResolutionRefused("only operators and admins can work provider findings")
    reason = reason.strip()
    if not reason:
        raise ResolutionRefused("a decision on a finding needs a reason")
    if verb not in VERBS:
        raise ResolutionRefused(f"unknown decision {verb!r}: link, compensate or close")
    if finding.state != ProviderFinding.State.OPEN:
        raise ResolutionRefused(f"this finding is {finding.get_state_display().lower()}, not open")
    actor = _actor(user)
    if verb == "link":
        target = _link_target(finding, user, intent_id)
        same_money(finding, target)
        before = finding.intent_id
        _evidence(target, user, "link", reason, finding, linked_from=str(before or ""))
        if finding.intent_id is None:
            _unattached("provider_finding_link", user, reason, finding, intent_id=str(target.id))
        elif before != target.id:
            _audit(before, user, "link", reason, finding, linked_to=str(target.id))  # type: ignore[arg-type]
        cleared = _clear_missing(finding, target, actor)
        _audit(
            target.id,
            user,
            "link",
            reason,
            finding,
            linked_from=str(before or ""),
            missing_findings_resolved=cleared,
        )
        finding.intent = target
        if finding.line_id is not None:
            StatementLine.objects.filter(id=finding.line_id).update(intent=target)
        if finding.event_id is not None:  # the event is now on the intent's timeline
            ProviderEvent.objects.filter(id=finding.event_id, intent__isnull=True).update(intent=target)
        finding.state, finding.resolution = ProviderFinding.State.RESOLVED, "linked"
        finding.note = f"linked to {target.id}: {reason}"[:1000]
    elif verb == "compensate":
        original = finding.intent
        if original is None:
            if not intent_id.strip():
                raise ResolutionRefused(
                    "this effect has no intent: name the intent whose compensation undoes it, or close it"
                )
            original = _link_target(finding, user, intent_id)
            finding.intent = original
        if finding.kind == ProviderFinding.Kind.MISSING_AT_PROVIDER:
            raise ResolutionRefused("the effect is missing at the provider: there is nothing to undo")
        if not finding.provider_reference:
            raise ResolutionRefused("this finding names no provider reference to undo")
        if finding.kind not in OWN_EFFECT and finding.provider_reference in _kept(original):
            raise ResolutionRefused(
                f"{finding.provider_reference} is the effect intent {original.id} holds, not an extra one: "
                "undoing it is the intent's own compensation (the operators' queue), or close this finding"
            )
        compensation = open_compensation(finding, original, user=user, actor=actor, reason=reason)
        _evidence(original, user, "compensate", reason, finding, compensation=str(compensation.id))
        _audit(original.id, user, "compensate", reason, finding, compensation=str(compensation.id))
        finding.state, finding.compensation = ProviderFinding.State.COMPENSATING, compensation
        finding.resolution = "compensated"
        finding.note = f"compensation opened by {actor}: {reason}"[:1000]
    else:
        if finding.intent is not None:
            _evidence(finding.intent, user, "close", reason, finding)
            _audit(finding.intent.id, user, "close", reason, finding)
        else:
            _unattached("provider_finding_close", user, reason, finding)
        finding.state, finding.resolution = ProviderFinding.State.RESOLVED, "closed"
        finding.note = f"closed: {reason}"[:1000]
    finding.resolved_by = actor
    finding.save()
    return finding


def _provider_money(finding: ProviderFinding) -> tuple[int | None, str]:
    """The amount (minor units) and currency the provider holds for the finding's effect: its
    statement line's, else its event's, else the finding's own."""
    if finding.line_id is not None:
        line = StatementLine.objects.get(id=finding.line_id)
        return line.amount, line.currency
    if finding.event_id is not None:
        event = ProviderEvent.objects.get(id=finding.event_id)
        return event.amount, event.currency
    return finding.amount, finding.currency


def _kept(intent: Intent) -> set[str]:
    """The provider references of ``intent``'s recorded outcomes (the effect it holds)."""
    return set(intent.outcomes.exclude(provider_reference="").values_list("provider_reference", flat=True))


def same_money(finding: ProviderFinding, target: Intent) -> None:
    """Refuse linking an effect to an intent whose amount or currency (where the provider's and
    the intent's are both known) differ from the effect's: another amount is not that intent's
    effect.

    Raises:
        ResolutionRefused: they differ (the message says both, and what to do instead).
    """
    amount, currency = _provider_money(finding)
    arguments = target.arguments if isinstance(target.arguments, dict) else {}
    asked = arguments.get("amount")
    asked = asked if isinstance(asked, int) and not isinstance(asked, bool) else None
    asked_currency = str(arguments.get("currency") or "").upper()
    amount_differs = amount is not None and asked is not None and amount != asked
    currency_differs = bool(currency) and bool(asked_currency) and currency.upper() != asked_currency
    if amount_differs or currency_differs:

        def shown(value: int | None, code: str) -> str:
            if value is None:
                return code or "no amount"
            return format_plain(value, code) if code else f"{value} minor units"

        raise ResolutionRefused(
            f"the provider's effect {finding.provider_reference or ''} is {shown(amount, currency)} but "
            f"intent {target.id} asked {shown(asked, asked_currency)}: it is not that intent's effect. "
            "Compensate it (against an intent you name) or close it instead"
        )


def _clear_missing(finding: ProviderFinding, target: Intent, actor: str) -> list[int]:
    """Resolve ``target``'s open ``missing_at_provider`` findings of the finding's source: the
    linked line or event is its effect. Returns their ids."""
    missing = ProviderFinding.objects.select_for_update().filter(
        source=finding.source,
        kind=ProviderFinding.Kind.MISSING_AT_PROVIDER,
        state=ProviderFinding.State.OPEN,
        intent=target,
    )
    ids = sorted(missing.values_list("id", flat=True))
    ProviderFinding.objects.filter(id__in=ids).update(
        state=ProviderFinding.State.RESOLVED,
        resolution="linked",
        resolved_by=actor,
        note=f"its effect is {finding.provider_reference}, linked by {actor}"[:1000],
    )
    return ids


def _link_target(finding: ProviderFinding, user: User, intent_id: str) -> Intent:
    if finding.kind not in LINKABLE:
        raise ResolutionRefused("only a statement line or an event with no intent can be linked to an intent")
    try:
        wanted = uuid.UUID(intent_id.strip())
    except ValueError as exc:
        raise ResolutionRefused(f"{intent_id.strip()[:60]!r} is not an intent id") from exc
    target = Intent.objects.filter(id=wanted).first()
    if target is None or not console_scope(user).allows(target.tenant):
        raise ResolutionRefused(f"no intent {wanted}")
    if not role_scope(user, RESOLVER_GROUPS).allows(target.tenant):
        raise ResolutionRefused(
            f"only operators and admins of tenant {target.tenant} can link to its intents"
        )
    try:
        actions = source_actions(finding.source)
    except StatementRefused as exc:
        raise ResolutionRefused(str(exc)) from exc
    if target.action not in actions:
        raise ResolutionRefused(
            f"intent {wanted} is a {target.action}, not an intent of {finding.source} ({', '.join(actions)})"
        )
    # One effect is one intent's (``reconciliation.attribution``, C34): an effect another intent
    # already holds (a lookup attributed it meanwhile) is not linked or charged to this one.
    taken = (
        attribute(target, [finding.provider_reference], by_key=True).others.get(finding.provider_reference)
        if finding.provider_reference
        else None
    )
    if taken:
        raise ResolutionRefused(
            f"{finding.provider_reference} is {taken}: it cannot be intent {wanted}'s; close this finding"
        )
    return target
