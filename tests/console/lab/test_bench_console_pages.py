"""The bench's console phase (``console.lab.bench.console_pages``) and its report
(``console.lab.bench.report.console_plans``): every page's query plans and the worst page are
printed (issue 37). Benchmarks are not timed tests: nothing here asserts a speed."""

from __future__ import annotations

import pytest

from console.lab.bench.console_pages import console_at_scale
from console.lab.bench.report import console_plans
from tests.console.conftest import gated, make_unknown
from tests.factories import submit

pytestmark = pytest.mark.django_db

#: The plan nodes that read a table or an index (a BitmapAnd, a Sort, a Limit read neither).
TABLE_SCANS = ("Seq Scan ", "Index Scan ", "Index Only Scan ", "Bitmap Index Scan ", "Bitmap Heap Scan ")


def test_i37_console_bench_report_prints_each_pages_query_plans_and_the_worst_page() -> None:
    # given: something on each page
    intent = submit(reference="order-1")
    gated(reference="order-2")
    make_unknown(reference="order-3")
    # when: the console phase's pages, timed twice each, and the report's lines about them
    pages = console_at_scale(reference="order-1", intent_id=str(intent.id), repeat=2)
    lines = console_plans(pages)
    # then: the worst page first, by its p95, with its slowest query's plan
    worst = max(pages, key=lambda name: pages[name]["p95_ms"] or 0)
    assert lines[0].startswith(f"Worst page: {worst}, p95 {pages[worst]['p95_ms']} ms")
    # and one row per query of every page, its plan's nodes (each scan names its index or table)
    for name, page in pages.items():
        rows = [line for line in lines if line.startswith(f"| {name} | ")]
        assert len(rows) == page["queries"] >= 1, name
        for query, row in zip(page["plans"], rows, strict=True):
            assert query["nodes"] and ", ".join(query["nodes"]) in row
            tables = [node for node in query["nodes"] if node.startswith(TABLE_SCANS)]
            assert all(" using " in node or " on " in node for node in tables), row
        assert any("Scan" in row for row in rows), name  # what each page reads, and how
