"""Render the benchmark's results as Markdown (the table of docs/explanation/performance.md)."""

from __future__ import annotations

from typing import Any

from console.lab.bench.stats import ratio


def _ok(met: bool | None) -> str:
    return "n/a" if met is None else ("met" if met else "**not met**")


def _cmp(value: float | None, limit: float, *, at_least: bool) -> bool | None:
    if value is None:
        return None
    return value >= limit if at_least else value <= limit


def targets(r: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """(measure, result, target, met) for each target of issue 7."""
    ratios, half = r["ratios"], r["half"]
    rec = r["reconciler"]
    p99 = half["submit_to_succeeded"]["p99_ms"]
    return [
        ("ledger / bare-Celery throughput",
         f"{r['full']['intents_per_second']} / {r['bare']['effects_per_second']} per s = {ratios['ledger_over_bare']}",
         ">= 0.5", _cmp(ratios["ledger_over_bare"], 0.5, at_least=True)),
        ("database commits per intent (pg_stat_database)",
         f"{r['full']['db']['commits_per_intent']} (write transactions: {r['profile']['write_commits_per_intent']})",
         "<= 4", _cmp(r["full"]["db"]["commits_per_intent"], 4, at_least=False)),
        ("submit-to-SUCCEEDED p99 at half load", f"{p99} ms", "<= 250 ms", _cmp(p99, 250, at_least=False)),
        ("console p95 server time, worst page", f"{ratios['console_worst_p95_ms']} ms at {r['options']['console_rows']:,} intents",
         "<= 100 ms", _cmp(ratios["console_worst_p95_ms"], 100, at_least=False)),
        ("reconciler pass, many / few UNKNOWN",
         f"{rec['large']['pass_ms']} / {rec['small']['pass_ms']} ms = {ratios['reconciler_large_over_small']}",
         "<= 1.2", _cmp(ratios["reconciler_large_over_small"], 1.2, at_least=False)),
        ("API submit / trivial DRF view",
         f"{r['api']['submit']['requests_per_second']} / {r['api']['trivial']['requests_per_second']} req/s = {ratios['api_submit_over_trivial']}",
         ">= 0.6", _cmp(ratios["api_submit_over_trivial"], 0.6, at_least=True)),
        *_cpu_target(r),
    ]  # fmt: skip


def _cpu_target(r: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """Issue 37's row: CPU per intent of our processes against the bare task's per effect."""
    ledger, bare = r["full"].get("cpu"), r["bare"].get("cpu")
    if not ledger or not bare:
        return []
    over = ratio(ledger["ours_ms_per_unit"], bare["ours_ms_per_unit"])
    return [("CPU per intent, ledger / bare Celery task (own processes)",
             f"{ledger['ours_ms_per_unit']} / {bare['ours_ms_per_unit']} ms = {over}",
             "<= 2", _cmp(over, 2, at_least=False))]  # fmt: skip


def cpu_table(r: dict[str, Any]) -> list[str]:
    """The "CPU ms per intent" table: user + system CPU milliseconds per intent (full load) and
    per bare effect (the chosen bare run) of each process group (``console.lab.bench.cpu``),
    our own processes summed and divided, the shared infrastructure listed apart; empty when
    ``r`` has no CPU figures."""
    ledger, bare = r["full"].get("cpu"), r["bare"].get("cpu")
    if not ledger and not bare:
        return []
    ledger, bare = ledger or {"groups": {}}, bare or {"groups": {}}
    names = list(dict.fromkeys([*ledger["groups"], *bare["groups"]]))
    over = ratio(ledger.get("ours_ms_per_unit"), bare.get("ours_ms_per_unit"))

    def row(name: str) -> str:
        both = (ledger["groups"].get(name), bare["groups"].get(name))
        ms = [
            f"{g['ms_per_unit']}{'' if g['complete'] else ' (incomplete: a root exited)'}" if g else "-"
            for g in both
        ]
        cores = [str(g["cores"]) if g else "-" for g in both]
        return f"| {name} | {ms[0]} | {ms[1]} | {cores[0]} | {cores[1]} |"

    def ours(name: str) -> bool:
        return bool((ledger["groups"].get(name) or bare["groups"].get(name))["ours"])

    return [
        f"CPU ms per intent: user + system CPU of each process tree (live processes, and exited children"
        f" through the parent that reaped them: psutil's children_user/children_system), sampled at the first"
        f" request and when the last intent was SUCCEEDED ({ledger.get('seconds')} s, ledger at full load) or"
        f" the last charge was in the sandbox ({bare.get('seconds')} s, bare run {r['bare'].get('chosen')});"
        f" cores = CPU seconds per wall second. PostgreSQL and the broker count everything they served"
        f" meanwhile, other users' work included.{_short_bare_warning(bare)}",
        "",
        "| process group | ledger ms/intent | bare ms/effect | ledger cores | bare cores |",
        "|---|---|---|---|---|",
        *(row(name) for name in names if ours(name)),
        f"| **own processes** | **{ledger.get('ours_ms_per_unit', '-')}** | **{bare.get('ours_ms_per_unit', '-')}** | | |",
        f"| ledger / bare, own processes | {over if over is not None else '-'} | | | |",
        "| *shared infrastructure, not in the ratio:* | | | | |",
        *(row(name) for name in names if not ours(name)),
        "",
    ]  # fmt: skip


def _short_bare_warning(bare: dict[str, Any]) -> str:
    """A caution when the bare run lasted under a second: its CPU figures, counted in 10 ms
    ticks per process, are then coarse; ``--intents`` larger makes it longer."""
    seconds = bare.get("seconds")
    if seconds is None or seconds >= 1.0:
        return ""
    return (
        f" **The bare run lasted {seconds} s, under a second: its figures are coarse (10 ms ticks);"
        " run with more --intents.**"
    )


def render(r: dict[str, Any], command: str) -> str:
    """The whole report: machine, targets, and one table per phase."""
    m, o = r["machine"], r["options"]
    lines = [
        f"Command: `{command}`",
        "",
        f"Machine: {m['cpus']} CPU ({m['cpu']}), PostgreSQL {m['postgresql']} (synchronous_commit={m['synchronous_commit']}),"
        f" broker {m['broker']}, Python {m['python']}; {o['workers']} Celery worker process(es), ledger pool"
        f" {o['ledger_pool']}, bare pool {r['bare']['chosen']} (fastest tried); gunicorn x{o['api_workers']}"
        f" {o['api_web']}; {o['clients']} HTTP clients, load generator on the same machine.",
        "",
        "| measure | result | target | |",
        "|---|---|---|---|",
        *(f"| {a} | {b} | {c} | {_ok(d)} |" for a, b, c, d in targets(r)),
        "",
        "End to end (HTTP API -> outbox -> broker -> worker -> sandbox provider -> SUCCEEDED):",
        "",
        "| load | intents | intents/s | p50 ms | p95 ms | p99 ms | API p50 ms | API p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in ("full", "half"):
        e = r[name]
        s, a = e["submit_to_succeeded"], e["api_response"]
        label = (
            f"full ({o['clients']} clients, closed loop)"
            if name == "full"
            else f"half (open loop, {e['offered_rate_per_second']}/s)"
        )
        lines.append(
            f"| {label} | {e['intents']} | {e['intents_per_second']} | {s['p50_ms']} | {s['p95_ms']} | {s['p99_ms']} | {a['p50_ms']} | {a['p99_ms']} |"
        )
    b = r["bare"]
    lines += [
        f"| bare Celery task ({b['processes']} processes {b['chosen']}, same broker, endpoint) | {b['effects']} | {b['effects_per_second']} | | | | | |",
        "",
        f"Bare-Celery baseline, each pool on {b['processes']} worker processes (pool:concurrency:prefetch; the fastest is the baseline):",
        "",
        "| pool | effects | effects/s | publish s |",
        "|---|---|---|---|",
        *(f"| {run['pool']} | {run['effects']} | {run['effects_per_second']} | {run['publish_seconds']} |" for run in b["runs"]),
        "",
        *cpu_table(r),
    ]  # fmt: skip
    db, p, c, ratios = r["full"]["db"], r["profile"], r["ceiling"], r["ratios"]
    lines += [
        "Database cost per intent (happy path):",
        "",
        "| figure | value |",
        "|---|---|",
        f"| commits (pg_stat_database delta / intents, full-load run) | {db['commits_per_intent']} |",
        f"| sessions opened (connections) | {db['sessions_per_intent']} |",
        f"| rows inserted / updated | {db['rows_inserted_per_intent']} / {db['rows_updated_per_intent']} |",
        f"| statements (pg_stat_statements) | {'see profile' if r['pg_stat_statements'] else 'n/a (not in shared_preload_libraries)'} |",
        f"| statements, in-process profile | {p['statements_per_intent']} ({p['commits_per_intent']} commits, of which {p['write_commits_per_intent']} not single autocommit reads) |",
        *(f"| - {step} | {v['statements']} statements, {v['commits']} commits ({v['autocommit_reads']} autocommit reads), {v['ms']} ms |" for step, v in p["steps"].items()),
        f"| single-row commit ceiling | {c['one_client']['commits_per_second']:.0f}/s (1 client), {c['many_clients']['commits_per_second']:.0f}/s ({c['many_clients']['clients']} clients) |",
        f"| ceiling / commits per intent | {ratios['intents_per_second_bound_by_commits']} intents/s |",
        f"| achieved / that bound | {ratios['achieved_over_commit_bound']} |",
        "",
        f"Console at {o['console_rows']:,} intents (loaded with their outbox messages, attempts, outcomes and audit chains by COPY in {r['console']['load']['copy_seconds']} s; status rollup refreshed after the load in {r['console']['load']['status_rollup_refresh_ms']} ms, as the beat would), server time in-process, {o['page_repeat']} requests each:",
        "",
        "| page | p50 ms | p95 ms | queries | seq scan on a big table | slowest query ms | its indexes |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for name, page in r["console"]["pages"].items():
        q = page["main_query"] or {}
        lines.append(
            f"| {name} | {page['p50_ms']} | {page['p95_ms']} | {page['queries']} | {', '.join(page['seq_scans']) or 'none'} | {q.get('ms')} | {', '.join(q.get('indexes') or []) or '-'} |"
        )
    lines += ["", *console_plans(r["console"]["pages"])]
    rec = r["reconciler"]
    lines += [
        "",
        f"Reconciler, one pass over a batch of {rec['batch']} (median of 2; lookups go to the sandbox over HTTP):",
        "",
        "| UNKNOWN rows | pass ms | batch claim ms |",
        "|---|---|---|",
        *(f"| {rec[k]['unknown_rows']:,} | {rec[k]['pass_ms']} | {rec[k]['claim_ms']} |" for k in ("small", "large")),
        "",
        f"API, closed loop, {r['api']['clients']} clients, {r['api']['seconds_each']} s each (workers stopped),"
        f" gunicorn x{o['api_workers']} per worker class:",
        "",
        "| gunicorn | endpoint | req/s | p50 ms | p99 ms |",
        "|---|---|---|---|---|",
        *(f"| {api['web']} | {n} | {api[k]['requests_per_second']} | {api[k]['latency']['p50_ms']} | {api[k]['latency']['p99_ms']} |"
          for api in (r["api"], *r.get("api_compare", ()))
          for k, n in (("trivial", "trivial DRF view"), ("submit", "POST /api/v1/intents"))),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def console_plans(pages: dict[str, Any]) -> list[str]:
    """Markdown lines after the console table: the worst page (highest p95) and every page's
    query plans (``console.lab.bench.console_pages.time_page``'s ``plans``, slowest query
    first): the plan's nodes depth first, and its sequential scans of big tables (issue 37)."""
    if not pages:
        return []
    name, worst = max(pages.items(), key=lambda item: item[1]["p95_ms"] or 0)
    slowest = worst["main_query"] or {}
    lines = [
        f"Worst page: {name}, p95 {worst['p95_ms']} ms, {worst['queries']} queries; its slowest query"
        f" {slowest.get('ms')} ms: {_plan(slowest)}.",
        "",
        "Query plans of each page (EXPLAIN of every query it ran, slowest first; nodes depth first):",
        "",
        "| page | query ms | plan nodes | seq scan on a big table |",
        "|---|---|---|---|",
    ]
    for page_name, page in pages.items():
        lines += [f"| {page_name} | {q['ms']} | {_plan(q)} | {', '.join(q['seq_scans']) or 'none'} |"
                  for q in page["plans"]]  # fmt: skip
    return lines


def _plan(query: dict[str, Any]) -> str:
    return ", ".join(query.get("nodes") or query.get("indexes") or []) or "-"


def _mb(size: int) -> str:
    return f"{size / 1_000_000:,.1f} MB"


def render_growth(r: dict[str, Any], command: str) -> str:
    """The growth phase (bytes per intent per table) and the archive phase (p95 before and after
    archiving, and the sizes), whichever ``r`` holds (``console.lab.bench.growth.run``)."""
    m = r["machine"]
    lines = [
        f"Command: `{command}`",
        "",
        f"Machine: {m['cpus']} CPU ({m['cpu']}), PostgreSQL {m['postgresql']}, Python {m['python']}.",
        "",
    ]
    if "growth" in r:
        g = r["growth"]
        labels = {"intent": "intent", "outbox": "outbox message", "attempts": "attempt", "outcomes": "outcome",
                  "events": "audit events"}  # fmt: skip
        shape = ", ".join(f"{n} {labels.get(name, name)}" for name, n in g["rows_per_intent"].items() if n)
        lines += [
            f"Growth at {g['intents']:,} intents, each {g['state']} by the happy path with the rows the real write"
            f" path leaves ({shape}; audit chains hashed as operations.audit.trail does), loaded with COPY in"
            f" {g['load_seconds']} s, then VACUUM ANALYZE: no dead row versions, so a lower bound for a live"
            " database. Bytes are pg_total_relation_size (heap, indexes, TOAST) grown since the empty database,"
            " divided by the intents.",
            f"Not generated, though the real path writes them for some intents: {g['not_generated']}.",
            "",
            "| table | rows | rows per intent | bytes per intent | of which indexes | of which TOAST |",
            "|---|---|---|---|---|---|",
            *(f"| {t['table']} | {t['rows']:,} | {t['rows_per_intent']} | {t['bytes_per_intent']:,} |"
              f" {t['index_bytes_per_intent']:,} | {t['toast_bytes_per_intent']:,} |" for t in g["tables"]),
            f"| total | | | {g['total_bytes_per_intent']:,} | | |",
            "",
            f"Database size: {_mb(g['database_bytes'])}.",
            "",
        ]  # fmt: skip
    if "archive" in r:
        a = r["archive"]
        load, before, after = a["load"], a["before"], a["after"]
        lines += [
            f"Archive at {load['rows']:,} intents: {load['archivable']:,} settled before the cutoff"
            f" ({a['cutoff'][:10]}), {load['live']:,} live after it (loaded with COPY in {load['copy_seconds']} s);"
            f" server time in-process, {r['options']['page_repeat']} requests each, before and after"
            " operations.archive.services.archive_run then VACUUM (ANALYZE) of the ledger's tables.",
            "",
        ]
        if after is None:
            lines += [f"The archiver is {a['archiver']}: only the figures before archiving.", ""]
        archive = a["archive"]
        if archive is not None:
            lines += [
                f"Archived {archive['intents_archived']:,} intents in {archive['segments']} segment(s) in"
                f" {archive['seconds']} s (VACUUM (ANALYZE) {archive['vacuum_analyze_seconds']} s);"
                f" archive on disk {_mb(archive['bytes_on_disk'])} ({_mb(archive['bytes_written'])} written).",
                "",
            ]
        lines += [
            "| page | p50 ms before | p95 ms before | p50 ms after | p95 ms after |",
            "|---|---|---|---|---|",
        ]
        for name, page in before["pages"].items():
            later = (after or {}).get("pages", {}).get(name) or {}
            lines.append(
                f"| {name} | {page['p50_ms']} | {page['p95_ms']} | {later.get('p50_ms', '')} | {later.get('p95_ms', '')} |"
            )
        sizes = [("intents in the live tables", f"{before['intent_rows']:,}",
                  f"{after['intent_rows']:,}" if after else ""),
                 ("ledger tables (pg_total_relation_size)", _mb(before["ledger_table_bytes"]),
                  _mb(after["ledger_table_bytes"]) if after else ""),
                 ("live database (pg_database_size)", _mb(before["database_bytes"]),
                  _mb(after["database_bytes"]) if after else ""),
                 ("archive on disk", "", _mb(archive["bytes_on_disk"]) if archive else "")]  # fmt: skip
        compacted = a.get("compacted")
        if compacted:
            sizes += [("ledger tables after VACUUM FULL", "", _mb(compacted["ledger_table_bytes"])),
                      ("of which the archive index (operations_archivedintent, _archivesegment)", "",
                       _mb(compacted["archive_index_bytes"]))]  # fmt: skip
        lines += [
            "",
            "| size | before | after |",
            "|---|---|---|",
            *(f"| {name} | {was} | {now} |" for name, was, now in sizes),
            "",
            "VACUUM (not FULL) makes the deleted rows' space reusable by new rows; it does not give it back to"
            " the file system, so the files keep their size until new intents fill it (and the archive index's"
            " rows, updated once from pending to archived, leave a dead version each until then). The last rows"
            " are after VACUUM FULL, once the timings were taken: what the live rows take.",
        ]
    return "\n".join(lines) + "\n"
