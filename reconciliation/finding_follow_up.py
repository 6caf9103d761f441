"""The reconciler's follow-up of provider findings (issue 19): findings whose compensation ended,
and strays the ledger has since attributed to an intent (``reconciliation.findings`` holds the
operators' decisions these complete).
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from operations.audit.trail import audit_append
from operations.exceptions import ResolutionRefused
from operations.models import Intent, Outcome
from reconciliation.duplicates import COMPENSATION_ENDED, compensation_end
from reconciliation.findings import LINKABLE, finding_data, same_money
from reconciliation.models import ProviderEvent, ProviderFinding, StatementLine
from reconciliation.statement_sources import StatementRefused, source_actions


def follow_up() -> int:
    """Findings whose compensation ended: resolved when it SUCCEEDED, open again (with why) when
    it cannot succeed; and strays the ledger has since attributed (``_attributed_meanwhile``).
    Returns how many changed. Run by the reconciler's pass."""
    changed = _attributed_meanwhile()
    for finding in ProviderFinding.objects.filter(
        state=ProviderFinding.State.COMPENSATING, compensation__status__in=COMPENSATION_ENDED
    ).select_related("compensation")[:200]:
        assert finding.compensation is not None
        resolved, note = compensation_end(finding.compensation)
        state = ProviderFinding.State.RESOLVED if resolved else ProviderFinding.State.OPEN
        changed += ProviderFinding.objects.filter(
            id=finding.id, state=ProviderFinding.State.COMPENSATING
        ).update(state=state, note=note)
    return changed


def _attributed_meanwhile(batch: int = 200) -> int:
    """Open findings of an effect no intent had (an orphan event, a line extra at the provider,
    without an intent) whose provider reference is now an intent's recorded effect (a lookup, a
    late event or an operator's confirmation attributed it since): resolved ``linked`` by the
    reconciler to that intent (of the source's actions), audited on its chain as a person's link
    is. Returns how many. A shared reference makes such a finding; the lookup that later tells
    the effects apart closes it, so operators are not left a finding already answered."""
    holder = Outcome.objects.filter(provider_reference=OuterRef("provider_reference")).order_by("created_at")
    strays = (
        ProviderFinding.objects.filter(
            state=ProviderFinding.State.OPEN, intent__isnull=True, kind__in=LINKABLE
        )
        .exclude(provider_reference="")
        .annotate(holder=Subquery(holder.values("intent_id")[:1]))
        .filter(holder__isnull=False)
        .values_list("id", "holder")[:batch]
    )
    changed = 0
    for finding_id, intent_id in list(strays):
        with transaction.atomic():
            intent = Intent.objects.select_for_update().get(id=intent_id)
            finding = ProviderFinding.objects.select_for_update().get(id=finding_id)
            try:
                actions = source_actions(finding.source)
            except StatementRefused:
                continue
            if finding.state != ProviderFinding.State.OPEN or intent.action not in actions:
                continue
            try:
                same_money(finding, intent)
            except ResolutionRefused:
                continue  # another amount than the intent asked: a person decides
            keys = {
                finding.event.idempotency_key if finding.event is not None else "",
                finding.line.idempotency_key if finding.line is not None else "",
            } - {""}
            if keys and keys != {intent.idempotency_key}:
                continue  # the evidence names another key: our key decides, a person looks
            note = f"its effect is intent {intent.id}'s recorded outcome: linked by the reconciler"
            audit_append(
                intent_id=intent.id,
                event="provider_finding_link",
                actor="reconciler",
                reason=note,
                data=finding_data(finding),
            )
            if finding.line_id is not None:
                StatementLine.objects.filter(id=finding.line_id).update(intent=intent)
            if finding.event_id is not None:
                ProviderEvent.objects.filter(id=finding.event_id, intent__isnull=True).update(intent=intent)
            ProviderFinding.objects.filter(id=finding.id).update(
                intent=intent,
                state=ProviderFinding.State.RESOLVED,
                resolution="linked",
                resolved_by="reconciler",
                note=note[:1000],
                updated_at=timezone.now(),
            )
            changed += 1
    return changed
