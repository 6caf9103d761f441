"""Phase 5: one reconciliation pass over a batch of 500 with few and with many UNKNOWN rows."""

from __future__ import annotations

import time
from typing import Any
from unittest import mock

from django.conf import settings

from console.lab.bench.stats import percentile


def timed_passes(*, passes: int, batch: int) -> dict[str, Any]:
    """Run ``reconcile_pass`` ``passes`` times with ``RECONCILE_BATCH = batch``; the pass time
    and, inside it, the time of the UNKNOWN batch claim (the part that depends on table size),
    in ms (medians)."""
    from reconciliation import lookups
    from reconciliation.services import reconcile_pass

    claim_seconds: list[float] = []
    original = lookups.claim_unknown_batch

    def timed_claim(*, batch: int) -> Any:
        began = time.perf_counter()
        try:
            return original(batch=batch)
        finally:
            claim_seconds.append(time.perf_counter() - began)

    pass_seconds, examined = [], []
    with (
        mock.patch.dict(settings.EFFECT_LEDGER, {"RECONCILE_BATCH": batch}),
        mock.patch.object(lookups, "claim_unknown_batch", timed_claim),
    ):
        for _ in range(passes):
            began = time.perf_counter()
            detail = reconcile_pass()
            pass_seconds.append(time.perf_counter() - began)
            examined.append(detail["unknown_examined"])
    return {
        "pass_ms": round(1000 * (percentile(pass_seconds, 50) or 0), 1),
        "claim_ms": round(1000 * (percentile(claim_seconds, 50) or 0), 2),
        "examined_per_pass": examined,
    }
