"""Phase 4: console pages at scale, timed in-process (server time: view, queries, template),
with ``EXPLAIN (FORMAT JSON)`` of every query a page runs."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from console.lab.bench.stats import summary_ms

#: Queries of the framework itself (session, user), not of the page.
FRAMEWORK_TABLES = ("django_session", "auth_user", "auth_group", "auth_permission")


def _walk(plan: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes.extend(_walk(child))
    return nodes


def _node_label(node: dict[str, Any]) -> str:
    """``Index Only Scan using intent_open_status``, ``Seq Scan on operations_outcome``, ``Sort``."""
    if node.get("Index Name"):
        return f"{node['Node Type']} using {node['Index Name']}"
    if node.get("Relation Name"):
        return f"{node['Node Type']} on {node['Relation Name']}"
    return str(node["Node Type"])


def explain(sql: str) -> dict[str, Any]:
    """The plan of ``sql``: its nodes (``nodes``, depth first from the top, each labelled by
    ``_node_label``), indexes used, sequential scans (on tables over 10,000 rows: the ones that
    grow), and the estimated total cost."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql)
        raw = cursor.fetchone()[0]
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    nodes = _walk(plan)
    indexes = sorted({n["Index Name"] for n in nodes if n.get("Index Name")})
    seq_scans = sorted(
        {n["Relation Name"] for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Plan Rows", 0) > 0}
    )
    return {
        "nodes": [_node_label(n) for n in nodes],
        "indexes": indexes,
        "seq_scans": seq_scans,
        "cost": plan.get("Total Cost"),
    }


def _big_tables() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname FROM pg_class WHERE relkind = 'r' AND reltuples > 10000")
        return {row[0] for row in cursor.fetchall()}


def _timed(durations: list[float]) -> Callable[..., Any]:
    """A ``connection.execute_wrapper`` appending each statement's seconds to ``durations``."""

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        began = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            durations.append(time.perf_counter() - began)

    return wrapper


def time_page(client: Client, url: str, *, repeat: int) -> dict[str, Any]:
    """GET ``url`` ``repeat`` times after one warm-up; server time p50/p95 (ms) and the plans
    of the page's own queries (the slowest first)."""
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    seconds = []
    for _ in range(repeat):
        began = time.perf_counter()
        response = client.get(url)
        seconds.append(time.perf_counter() - began)
    connection.ensure_connection()
    durations: list[float] = []
    with CaptureQueriesContext(connection) as captured, connection.execute_wrapper(_timed(durations)):
        client.get(url)
    # Django's log keeps milliseconds only; the wrapper's timings are exact (same order, same count).
    exact = len(durations) == len(captured.captured_queries)
    big = _big_tables()
    queries = []
    for index, query in enumerate(captured.captured_queries):
        sql = query["sql"]
        if not sql.lstrip().upper().startswith("SELECT") or any(t in sql for t in FRAMEWORK_TABLES):
            continue
        plan = explain(sql)
        plan["seq_scans"] = [t for t in plan["seq_scans"] if t in big]
        seconds_taken = durations[index] if exact else float(query["time"])
        queries.append({"ms": round(seconds_taken * 1000, 2), "sql": sql[:160], **plan})
    queries.sort(key=lambda q: q["ms"], reverse=True)
    return {
        "url": url,
        **summary_ms(seconds),
        "queries": len(queries),
        "index_used": not any(q["seq_scans"] for q in queries),
        "main_query": queries[0] if queries else None,
        "seq_scans": sorted({t for q in queries for t in q["seq_scans"]}),
        "plans": queries,
    }


def console_at_scale(*, reference: str, intent_id: str, repeat: int = 20) -> dict[str, Any]:
    """Time every console page as a superuser against the loaded database."""
    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(
        username="bench-admin", defaults={"is_superuser": True, "is_staff": True}
    )
    client = Client()
    client.force_login(user)
    pages = {
        "dashboard": "/",
        "approvals inbox": "/approvals/",
        "UNKNOWN queue": "/unknown/",
        "intents by reference": f"/intents/?q={reference}",
        "intents by status": "/intents/?status=FAILED",
        "intent detail": f"/intents/{intent_id}/",
        "audit page": "/audit/",
    }
    return {name: time_page(client, url, repeat=repeat) for name, url in pages.items()}
