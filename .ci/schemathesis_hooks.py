"""Schemathesis hooks for .ci/schemathesis (loaded through SCHEMATHESIS_HOOKS).

``GET /api/v1/intents/{intent_id}?wait=SECONDS`` may legitimately hold a request for up to 30 s
when the intent does not change, and no worker runs here, so an intent the stateful phase
created never does: every generated ``wait`` would be spent in full (and most would pass
schemathesis' 10 s request timeout). A valid ``wait`` above ``WAIT_CAP_SECONDS`` is sent as
``WAIT_CAP_SECONDS``: still a valid wait that runs out, answered with the same documented
status, body and ``Effect-Ledger-Wait`` header. Invalid values (0, negatives, above 30, text)
are sent unchanged, so the 400 answers are still exercised. tests/operations/test_wait.py
covers the waiting itself.
"""

from __future__ import annotations

import math
from typing import Any

import schemathesis

DETAIL_PATH = "/api/v1/intents/{intent_id}"
WAIT_CAP_SECONDS = 0.05
MAX_WAIT_SECONDS = 30


@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    """The case with a valid ``wait`` above the cap lowered to it."""
    if case.operation.path != DETAIL_PATH or case.method.upper() != "GET" or not isinstance(case.query, dict):
        return case
    wait = case.query.get("wait")
    if isinstance(wait, bool) or not isinstance(wait, int | float | str):
        return case
    try:
        seconds = float(wait)
    except ValueError:
        return case
    if math.isfinite(seconds) and WAIT_CAP_SECONDS < seconds <= MAX_WAIT_SECONDS:
        case.query["wait"] = WAIT_CAP_SECONDS
    return case
