"""Smoke test of ``manage.py bench``: a tiny run has every section, with numbers.

Benchmarks are not timed tests: nothing here asserts a speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.workers import requires_real_broker

BASE_DIR = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.integration, requires_real_broker]


def _numbers(section: dict[str, object], *keys: str) -> None:
    for key in keys:
        assert isinstance(section[key], int | float), (key, section[key])


def test_a_tiny_bench_run_reports_every_section(tmp_path: Path) -> None:
    # given a scratch database name of our own (the bench creates and drops it)
    scratch = os.environ.get("EFFECT_LEDGER_TEST_DATABASE", "test_effect_ledger") + "_bench_smoke"
    out = tmp_path / "bench.json"

    # when
    completed = subprocess.run(
        [sys.executable, "manage.py", "bench", "--intents", "40", "--workers", "1", "--clients", "4",
         "--api-seconds", "1", "--skip-console-scale", "--database", scratch, "--json", str(out)],
        cwd=BASE_DIR, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip

    # then
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    results = json.loads(out.read_text())
    _numbers(results["bare"], "effects_per_second")
    for load in ("full", "half"):
        _numbers(results[load], "intents_per_second")
        _numbers(results[load]["submit_to_succeeded"], "p50_ms", "p95_ms", "p99_ms")
    _numbers(results["full"]["db"], "commits_per_intent", "sessions_per_intent")
    _numbers(results["profile"], "statements_per_intent", "commits_per_intent")
    _numbers(results["ceiling"]["many_clients"], "commits_per_second")
    for page in results["console"]["pages"].values():
        _numbers(page, "p50_ms", "p95_ms")
        assert isinstance(page["index_used"], bool)
    _numbers(results["reconciler"]["small"], "pass_ms", "claim_ms")
    _numbers(results["reconciler"]["large"], "pass_ms", "claim_ms")
    _numbers(results["api"]["trivial"], "requests_per_second")
    _numbers(results["api"]["submit"], "requests_per_second")
    _numbers(results["ratios"], "ledger_over_bare", "api_submit_over_trivial", "reconciler_large_over_small")
    assert "| measure | result | target |" in completed.stdout
    # CPU per intent of every process group, and of the bare task's workers (issue 37)
    _numbers(results["full"]["cpu"], "ours_ms_per_unit")
    _numbers(results["bare"]["cpu"], "ours_ms_per_unit")
    assert {"web (gunicorn master and workers)", "beat"} <= set(results["full"]["cpu"]["groups"])
    _numbers(results["ratios"], "cpu_ledger_over_bare")
    assert "| process group | ledger ms/intent | bare ms/effect |" in completed.stdout
