"""Which intents the archive may take (``ELIGIBLE``, ``SETTLED_AND_FREE``) and when
(``CUTOFF``): SQL fragments over ``operations_intent i`` with the parameters of
``due_params``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings

from operations.models import SETTLED_STATUS_VALUES, ArchivedIntent

#: Whether intent ``i`` may leave the live tables (besides its age and whether it is already
#: indexed): settled; nothing still open points at it (an intent held behind it or compensating
#: it, a finding naming it as a compensation, a provider finding about one of its events filed on
#: another intent); no open finding of its own; no webhook to its agent still to be delivered.
#: Foreign keys of ``INTENT_TABLES`` rows are the rows deleted with it; these are the others.
SETTLED_AND_FREE = """
    i.status = ANY(%(settled)s)
    AND NOT EXISTS (SELECT 1 FROM operations_intent o WHERE o.held_behind_id = i.id)
    AND NOT EXISTS (SELECT 1 FROM operations_intent o WHERE o.compensates_id = i.id)
    AND NOT EXISTS (SELECT 1 FROM reconciliation_duplicatefinding f WHERE f.intent_id = i.id AND f.state <> 'resolved')
    AND NOT EXISTS (SELECT 1 FROM reconciliation_duplicatefinding f WHERE f.compensation_id = i.id)
    AND NOT EXISTS (SELECT 1 FROM reconciliation_providerfinding f WHERE f.intent_id = i.id AND f.state <> 'resolved')
    AND NOT EXISTS (SELECT 1 FROM reconciliation_providerfinding f WHERE f.compensation_id = i.id)
    AND NOT EXISTS (SELECT 1 FROM reconciliation_providerfinding f
                    JOIN reconciliation_providerevent e ON e.id = f.event_id
                    WHERE e.intent_id = i.id AND f.intent_id IS DISTINCT FROM i.id)
    AND NOT EXISTS (SELECT 1 FROM operations_webhookdelivery w WHERE w.intent_id = i.id AND w.state = 'pending')
"""

#: ``SETTLED_AND_FREE`` and not indexed yet (a ``superseded`` one may be written again).
ELIGIBLE = f"""{SETTLED_AND_FREE}
    AND NOT EXISTS (SELECT 1 FROM {ArchivedIntent._meta.db_table} a
                    WHERE a.intent_id = i.id AND a.state <> 'superseded')
"""

#: The latest settlement time an intent of each tenant may have to be archived now: the
#: earlier of ``%(before)s`` and now minus the tenant's retention (``TENANT_RETENTION_DAYS``,
#: else ``INTENT_RETENTION_DAYS``), on the database clock.
CUTOFF = """
    LEAST(%(before)s, statement_timestamp() - make_interval(secs => 86400 * COALESCE(
        (SELECT days FROM unnest(%(tenants)s::text[], %(tenant_days)s::float8[]) AS r(tenant, days)
         WHERE r.tenant = i.tenant),
        %(default_days)s)))
"""


def due_params(before: datetime) -> dict[str, Any]:
    """The parameters of ``ELIGIBLE`` and ``CUTOFF``: the settled states, ``before`` (aware),
    and the retention days per tenant and by default (``TENANT_RETENTION_DAYS``,
    ``INTENT_RETENTION_DAYS``)."""
    per_tenant = settings.EFFECT_LEDGER["TENANT_RETENTION_DAYS"]
    return {
        "settled": SETTLED_STATUS_VALUES,
        "before": before,
        "tenants": list(per_tenant),
        "tenant_days": [float(days) for days in per_tenant.values()],
        "default_days": float(settings.EFFECT_LEDGER["INTENT_RETENTION_DAYS"]),
    }
