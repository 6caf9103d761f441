"""A metrics file a killed process left empty must not turn /metrics and the dashboard's
counters into a 500 (found in CI: one 0-byte file failed 91 tests)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from operations.metrics import process_counters, render_metrics


@pytest.mark.django_db
def test_i37_an_empty_metrics_file_is_left_out_not_a_500() -> None:
    # given: a process's file cut short at creation, beside the live ones
    empty = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]) / "counter_999999999.db"
    empty.write_bytes(b"")
    try:
        # when / then: both readers answer
        body, _ = render_metrics()
        assert b"effect_ledger" in body
        assert set(process_counters()) == {"duplicate_deliveries", "stale_fences_rejected"}
    finally:
        empty.unlink()
