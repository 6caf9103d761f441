"""The benchmark's order of phases, against scratch databases on the configured server."""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.db import connection

from console.lab.bench import bulk, cpu, database, e2e, profile, reconciler, services
from console.lab.bench.choices import CeleryPool, WebWorkers
from console.lab.bench.console_pages import console_at_scale
from console.lab.bench.stats import ratio
from console.lab.cluster import LocalCluster
from console.lab.sandbox_provider.database import sandbox_database_name
from operations.services import status_rollup_refresh


@dataclass
class Options:
    """What ``manage.py bench`` was asked for (see its ``--help``)."""

    intents: int = 5000
    workers: int = 2
    clients: int = 8
    api_workers: int = 2
    api_seconds: float = 8.0
    console_rows: int = 1_000_000
    unknown_small: int = 1000
    unknown_large: int = 100_000
    reconcile_batch: int = 500
    page_repeat: int = 20
    ceiling_seconds: float = 3.0
    #: intents of the growth phase (bytes per intent per table)
    growth_intents: int = 100_000
    database: str = "effect_ledger_bench"
    keep: bool = False
    #: gunicorn of the end-to-end runs and of the API table; ``api_compare`` are also measured
    #: in the API phase (each on its own gunicorn, same number of processes).
    api_web: WebWorkers = WebWorkers("sync")
    api_compare: tuple[WebWorkers, ...] = ()
    #: the bare-Celery baseline is measured with each pool (``workers`` processes each) and the
    #: fastest is the baseline; the ledger's workers run ``ledger_pool``.
    bare_pools: tuple[CeleryPool, ...] = (CeleryPool("prefork", 1),)
    ledger_pool: CeleryPool = CeleryPool("prefork", 1)


def log(message: str) -> None:
    """Print a progress line, timestamped."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def machine() -> dict[str, Any]:
    """The machine, PostgreSQL and broker the figures were measured on (the report's first line)."""
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('server_version'), current_setting('synchronous_commit')")
        version, sync = cursor.fetchone()
    broker = str(settings.CELERY_BROKER_URL).split("://", 1)[0]
    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
            "postgresql": version, "synchronous_commit": sync, "broker": broker}  # fmt: skip


def run(options: Options) -> dict[str, Any]:
    """Run every phase and return the results (see ``report.render`` for their meaning)."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
    user_db = str(connection.settings_dict["NAME"])
    bench_db, sandbox_db = options.database, sandbox_database_name(options.database)
    for name in (bench_db, sandbox_db):
        database.recreate_database(name, admin_db=user_db)
    database.use_database(bench_db)
    cluster: LocalCluster | None = None
    try:
        call_command("migrate", verbosity=0)
        results: dict[str, Any] = {"options": _labelled(options), "machine": machine()}
        from operations.api.authentication import agent_create

        _, token = agent_create(name="bench", tenant="acme")
        log("measuring the single-row commit ceiling")
        results["ceiling"] = {
            "one_client": database.commit_ceiling(bench_db, clients=1, seconds=options.ceiling_seconds),
            "many_clients": database.commit_ceiling(
                bench_db, clients=options.clients, seconds=options.ceiling_seconds
            ),
        }
        results["pg_stat_statements"] = database.pg_stat_statements_available(bench_db)
        cluster = LocalCluster(relay_period=2.0, reconcile_period=5.0)
        sandbox_url = services.start_sandbox(cluster, dsn=database.server_dsn(sandbox_db))
        settings.SANDBOX_PROVIDER_URL = sandbox_url
        cluster.use_queue_here()
        web = options.api_web
        gunicorn, api_url = services.start_gunicorn(
            cluster, workers=options.api_workers, worker_class=web.worker_class, threads=web.threads
        )
        target = e2e.Target(api_url, token, bench_db, sandbox_db, sandbox_url)
        shared = _shared_groups(cluster)
        results["bare"] = _bare_baseline(options, cluster, target, shared)
        ledger = options.ledger_pool
        workers = [
            cluster.start_worker(
                f"bench-w{i}", pool=ledger.pool, concurrency=ledger.concurrency, prefetch=ledger.prefetch
            )
            for i in range(options.workers)
        ]
        beat = cluster.start_beat()
        log(
            f"{options.workers} worker(s) {ledger.label}, gunicorn x{options.api_workers} {web.label} at {api_url},"
            f" sandbox at {sandbox_url}"
        )
        e2e.run_half_load(target, intents=4 * options.clients, rate=20, clients=options.clients)  # warm-up
        log(f"end to end at full load: {options.intents} intents, {options.clients} clients")
        own = cpu.own_groups(
            web=[gunicorn.popen.pid], celery=[w.popen.pid for w in workers], beat=[beat.popen.pid]
        )
        full = e2e.run_full_load(
            target, intents=options.intents, clients=options.clients, cpu_groups=[*own, *shared]
        )
        results["full"] = full
        half_rate = max(1.0, full["intents_per_second"] / 2)
        log(f"end to end at half load: {half_rate:.0f} intents/s")
        results["half"] = e2e.run_half_load(
            # at most a minute of it: latency at a steady rate needs time, not volume
            target,
            intents=max(20, min(options.intents // 2, int(half_rate * 60))),
            rate=half_rate,
            clients=options.clients,
        )
        for process in [*workers, beat]:
            process.kill_group()
        log("API submit vs trivial view (workers stopped)")
        results["api"] = e2e.run_api(target, clients=options.clients, seconds=options.api_seconds)
        results["api"]["web"] = web.label
        results["api_compare"] = _api_alternatives(options, cluster, target)
        log("statement profile of one happy-path intent (in-process)")
        results["profile"] = profile.happy_path(token=token)
        log(f"bulk-loading {options.console_rows} intents (COPY)")
        results["console"] = _console_and_reconciler(options, results)
        results["ratios"] = _ratios(results)
        return results
    finally:
        if cluster is not None:
            cluster.stop()
            _delete_queue(cluster.queue)
        database.use_database(user_db)
        if not options.keep:
            for name in (bench_db, sandbox_db):
                database.drop_database(name, admin_db=user_db)


def _labelled(options: Options) -> dict[str, Any]:
    """``options`` as JSON-ready values (pools and worker classes by their labels)."""
    return {
        **options.__dict__,
        "api_web": options.api_web.label,
        "api_compare": [web.label for web in options.api_compare],
        "bare_pools": [pool.label for pool in options.bare_pools],
        "ledger_pool": options.ledger_pool.label,
    }


def _shared_groups(cluster: LocalCluster) -> list[cpu.Group]:
    """The shared infrastructure's CPU groups: the sandbox provider ``services.start_sandbox``
    started, the PostgreSQL server of this process's connection, the broker, this process."""
    sandbox = next((p.popen.pid for p in cluster.processes if p.name == "bench-sandbox"), None)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = int(cursor.fetchone()[0])
    return cpu.shared_groups(
        sandbox_pid=sandbox, backend_pid=backend, broker_url=str(settings.CELERY_BROKER_URL)
    )


def _bare_baseline(
    options: Options, cluster: LocalCluster, target: e2e.Target, shared: list[cpu.Group]
) -> dict[str, Any]:
    """The bare task with each of ``options.bare_pools`` on ``options.workers`` fresh worker
    processes of their own queue (nothing else consuming); the fastest is the baseline. Each
    run's ``"cpu"`` is its workers' and ``shared``'s (``cpu.per_unit``, per effect)."""
    runs = []
    for config in options.bare_pools:
        queue = f"{cluster.queue}-bare"
        started = [
            cluster.start_worker(f"bench-bare{i}", pool=config.pool, concurrency=config.concurrency,
                                 prefetch=config.prefetch, queue=queue)
            for i in range(options.workers)
        ]  # fmt: skip
        log(f"bare Celery baseline {config.label}: {options.intents} effects")
        e2e.run_bare(target, effects=max(20, options.intents // 10), queue=queue)  # warm-up
        groups = [*cpu.own_groups(celery=[p.popen.pid for p in started]), *shared]
        run = e2e.run_bare(target, effects=options.intents, queue=queue, cpu_groups=groups)
        runs.append({"pool": config.label, **run})
        for process in started:
            process.kill_group()
        _delete_queue(queue)
    best = max(runs, key=lambda run: run["effects_per_second"])
    return {**best, "chosen": best["pool"], "processes": options.workers, "runs": runs}


def _api_alternatives(options: Options, cluster: LocalCluster, target: e2e.Target) -> list[dict[str, Any]]:
    """``run_api`` on a fresh gunicorn per ``options.api_compare`` configuration."""
    out = []
    for web in options.api_compare:
        log(f"API with gunicorn x{options.api_workers} {web.label}")
        process, url = services.start_gunicorn(
            cluster, workers=options.api_workers, worker_class=web.worker_class, threads=web.threads
        )
        there = e2e.Target(url, target.token, target.ledger_db, target.sandbox_db, target.sandbox_url)
        out.append(
            {"web": web.label, **e2e.run_api(there, clients=options.clients, seconds=options.api_seconds)}
        )
        process.kill_group()
    return out


def _console_and_reconciler(options: Options, results: dict[str, Any]) -> dict[str, Any]:
    dsn = database.server_dsn(options.database)
    main = bulk.load_intents(dsn, count=options.console_rows - options.unknown_small, tag="bulk")
    unknown = bulk.load_intents(dsn, count=options.unknown_small, status="UNKNOWN", tag="unk1")
    vacuum = bulk.analyze(dsn)
    # The dashboard an operator sees: the beat has recounted the settled states since the load.
    began = time.perf_counter()
    status_rollup_refresh()
    rollup_ms = round((time.perf_counter() - began) * 1000, 1)
    log(
        f"loaded in {main['seconds'] + unknown['seconds']:.0f} s (+ VACUUM ANALYZE {vacuum:.0f} s,"
        f" status rollup {rollup_ms:.0f} ms); timing pages"
    )
    loaded = {"rows": options.console_rows, "copy_seconds": round(main["seconds"] + unknown["seconds"], 1),
              "vacuum_analyze_seconds": vacuum, "status_rollup_refresh_ms": rollup_ms}  # fmt: skip
    pages = console_at_scale(
        reference="bulk-order-1234", intent_id=str(main["ids_sample"][3]), repeat=options.page_repeat
    )
    log(f"reconciler: {options.unknown_small} UNKNOWN rows")
    passes = 2
    small = reconciler.timed_passes(passes=passes, batch=options.reconcile_batch)
    more = options.unknown_large - options.unknown_small
    bulk.load_intents(dsn, count=more, status="UNKNOWN", tag="unk2")
    bulk.analyze(dsn)
    log(f"reconciler: {options.unknown_large} UNKNOWN rows")
    large = reconciler.timed_passes(passes=passes, batch=options.reconcile_batch)
    results["reconciler"] = {
        "batch": options.reconcile_batch,
        "small": {"unknown_rows": options.unknown_small, **small},
        "large": {"unknown_rows": options.unknown_large, **large},
    }
    return {"load": loaded, "pages": pages}


def _ratios(results: dict[str, Any]) -> dict[str, Any]:
    full, ceiling = results["full"], results["ceiling"]
    best = max(ceiling["one_client"]["commits_per_second"], ceiling["many_clients"]["commits_per_second"])
    commits = full["db"]["commits_per_intent"]
    bound = best / commits if commits else None
    rec = results["reconciler"]
    return {
        "ledger_over_bare": ratio(full["intents_per_second"], results["bare"]["effects_per_second"]),
        "commit_ceiling_per_second": round(best, 1),
        "intents_per_second_bound_by_commits": round(bound, 1) if bound else None,
        "achieved_over_commit_bound": ratio(full["intents_per_second"], bound),
        "reconciler_large_over_small": ratio(rec["large"]["pass_ms"], rec["small"]["pass_ms"]),
        "reconciler_claim_large_over_small": ratio(rec["large"]["claim_ms"], rec["small"]["claim_ms"]),
        "api_submit_over_trivial": ratio(
            results["api"]["submit"]["requests_per_second"], results["api"]["trivial"]["requests_per_second"]
        ),
        "console_worst_p95_ms": max(page["p95_ms"] or 0 for page in results["console"]["pages"].values()),
        "cpu_ledger_over_bare": ratio(
            full.get("cpu", {}).get("ours_ms_per_unit"),
            results["bare"].get("cpu", {}).get("ours_ms_per_unit"),
        ),
    }


def _delete_queue(queue: str) -> None:
    from console.celery import app

    with contextlib.suppress(Exception), app.connection_for_write() as conn:
        conn.default_channel.queue_delete(queue)  # type: ignore[attr-defined]
