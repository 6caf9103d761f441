"""Growth and archive phases (issue 36): what an intent costs the database's disk, table by
table, and the console's and API's p95 before and after archiving 90 % of the intents.

Both run in-process against a scratch database of their own (``scratch_ledger``), with intents
bulk-loaded by ``console.lab.bench.bulk`` in the shape the real write path leaves them; neither
needs the broker, workers or the sandbox provider.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from console.lab.bench import bulk, database
from console.lab.bench.console_pages import console_at_scale, time_page
from console.lab.bench.runner import Options, machine
from console.lab.bench.shapes import NOT_GENERATED, rows_per_table
from operations.services import status_rollup_refresh

#: The ledger's tables: every one whose name starts so is measured.
TABLE_PREFIXES = ("operations_", "reconciliation_")
#: Share of the intents the archive phase archives (the issue's 90 %).
ARCHIVED_SHARE = 0.9
#: Days before now the archived intents end and the live ones begin: the cutoff lies between,
#: past the default retention (``INTENT_RETENTION_DAYS``, 90).
ARCHIVED_BEFORE_DAYS, LIVE_DAYS = 100, 10

Log = Callable[[str], None]


@contextlib.contextmanager
def scratch_ledger(name: str, *, keep: bool) -> Iterator[str]:
    """A migrated, empty ledger database ``name`` (dropped first when it exists) that Django's
    default connection uses inside the block; yields its DSN. Dropped at the end unless
    ``keep``; Django's connection goes back to the user's database either way."""
    user_db = str(connection.settings_dict["NAME"])
    database.recreate_database(name, admin_db=user_db)
    database.use_database(name)
    try:
        call_command("migrate", verbosity=0)
        yield database.server_dsn(name)
    finally:
        database.use_database(user_db)
        if not keep:
            database.drop_database(name, admin_db=user_db)


def table_sizes(dsn: str) -> dict[str, dict[str, int]]:
    """Every ledger table (``TABLE_PREFIXES``) of the database at ``dsn``: exact ``rows`` and
    its size in bytes, ``total`` (``pg_total_relation_size``: heap, indexes, TOAST and its
    index, free space and visibility maps), of which ``indexes`` and ``toast``."""
    like = " OR ".join("c.relname LIKE %s" for _ in TABLE_PREFIXES)
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid), pg_indexes_size(c.oid),"
            " COALESCE(pg_total_relation_size(NULLIF(c.reltoastrelid, 0)), 0)"
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            f" WHERE c.relkind = 'r' AND n.nspname = current_schema() AND ({like}) ORDER BY c.relname",
            [f"{prefix}%" for prefix in TABLE_PREFIXES],
        ).fetchall()
        sizes = {}
        for name, total, indexes, toast in tables:
            row = conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()
            sizes[str(name)] = {"rows": int(row[0]) if row else 0, "total": int(total),
                                "indexes": int(indexes), "toast": int(toast)}  # fmt: skip
    return sizes


def database_bytes(dsn: str) -> int:
    """``pg_database_size`` of the database at ``dsn``, in bytes."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    return int(row[0]) if row else 0


def growth(dsn: str, *, intents: int, log: Log) -> dict[str, Any]:
    """Load ``intents`` intents that SUCCEEDED by the happy path into the empty ledger at
    ``dsn``, ``VACUUM ANALYZE`` them, and return what each table grew by per intent: ``tables``
    (only those that grew, largest first: ``rows``, ``rows_per_intent``, ``bytes_per_intent``
    and of it ``index_bytes_per_intent`` and ``toast_bytes_per_intent``) and
    ``total_bytes_per_intent``.

    Raises:
        ValueError: ``intents`` is below 1 (nothing is loaded).
    """
    if intents < 1:
        raise ValueError(f"the growth phase needs at least one intent, not {intents}")
    empty = table_sizes(dsn)
    log(f"growth: loading {intents:,} SUCCEEDED intents with their rows (COPY)")
    loaded = bulk.load_intents(dsn, count=intents, status="SUCCEEDED", tag="growth")
    vacuum = bulk.analyze(dsn)
    grown: list[dict[str, Any]] = []
    for table, size in table_sizes(dsn).items():
        before = empty.get(table, {"rows": 0, "total": 0, "indexes": 0, "toast": 0})
        delta = {key: size[key] - before[key] for key in size}
        if delta["rows"] > 0 or delta["total"] > 0:
            grown.append({
                "table": table, "rows": delta["rows"], "rows_per_intent": round(delta["rows"] / intents, 2),
                "bytes_per_intent": round(delta["total"] / intents),
                "index_bytes_per_intent": round(delta["indexes"] / intents),
                "toast_bytes_per_intent": round(delta["toast"] / intents),
            })  # fmt: skip
    grown.sort(key=lambda table: -table["bytes_per_intent"])
    return {
        "intents": intents,
        "state": "SUCCEEDED",
        "rows_per_intent": rows_per_table("SUCCEEDED"),
        "load_seconds": loaded["seconds"],
        "vacuum_analyze_seconds": vacuum,
        "tables": grown,
        "total_bytes_per_intent": sum(table["bytes_per_intent"] for table in grown),
        "database_bytes": database_bytes(dsn),
        "not_generated": NOT_GENERATED,
    }


def _archiver() -> Callable[..., Any] | None:
    """``operations.archive.services.archive_run``, or None while the archiver is not built."""
    try:
        from operations.archive.services import archive_run
    except ImportError:
        return None
    return archive_run


@contextlib.contextmanager
def _archive_settings(directory: Path) -> Iterator[None]:
    """Point the archive, the audit signing key and the checkpoint file at ``directory`` (a new
    key is made there) for the block, so a bench run never signs with, or writes beside, the
    user's own."""
    from operations.audit.keys import signing_key_create

    saved = dict(settings.EFFECT_LEDGER)
    key = directory / "audit-signing-key.pem"
    signing_key_create(key)
    settings.EFFECT_LEDGER.update({
        "ARCHIVE_DIR": str(directory / "archive"),
        "AUDIT_SIGNING_KEY_FILE": str(key),
        "AUDIT_PUBLIC_KEY_FILE": "",
        "AUDIT_CHECKPOINT_FILE": str(directory / "audit-checkpoints.jsonl"),
    })  # fmt: skip
    try:
        yield
    finally:
        settings.EFFECT_LEDGER.clear()
        settings.EFFECT_LEDGER.update(saved)


def _bytes_under(directory: Path) -> int:
    """Bytes of every file under ``directory`` (0 when it does not exist)."""
    return (
        sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())
        if directory.exists()
        else 0
    )


def _api_pages(*, token: str, intent_id: str, reference: str, repeat: int) -> dict[str, Any]:
    """``time_page`` of the API's list and detail as the bench's agent (``Bearer`` token)."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    pages = {
        "API list": "/api/v1/intents",
        "API list by status": "/api/v1/intents?status=FAILED",
        "API list by reference": f"/api/v1/intents?reference={reference}",
        "API detail": f"/api/v1/intents/{intent_id}",
    }
    return {name: time_page(client, url, repeat=repeat) for name, url in pages.items()}


def _measure(dsn: str, *, token: str, intent_id: str, reference: str, repeat: int) -> dict[str, Any]:
    """The console pages and the API's list and detail (server time, in-process), and sizes."""
    pages = console_at_scale(reference=reference, intent_id=intent_id, repeat=repeat)
    pages.update(_api_pages(token=token, intent_id=intent_id, reference=reference, repeat=repeat))
    sizes = table_sizes(dsn)
    return {
        "pages": pages,
        "database_bytes": database_bytes(dsn),
        "intent_rows": sizes.get("operations_intent", {}).get("rows", 0),
        "ledger_table_bytes": sum(size["total"] for size in sizes.values()),
    }


def _live_intent(*, tag: str) -> tuple[str, str]:
    """An intent of the bench agent's tenant from the live load ``tag`` (id and reference),
    that the archive leaves: the console and the API open the same one before and after."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, reference FROM operations_intent WHERE tenant = 'acme' AND client_key LIKE %s"
            " AND status = 'SUCCEEDED' ORDER BY created_at DESC OFFSET 10 LIMIT 1",
            [f"{tag}-%"],
        )
        row = cursor.fetchone()
    assert row is not None, "the live load holds no SUCCEEDED intent of tenant acme"
    return str(row[0]), str(row[1])


def _vacuum_analyze(dsn: str) -> float:
    """``VACUUM (ANALYZE)`` every ledger table; returns seconds."""
    began = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in table_sizes(dsn):
            conn.execute(f'VACUUM (ANALYZE) "{table}"')
    return round(time.perf_counter() - began, 1)


def _compacted(dsn: str) -> dict[str, Any]:
    """``VACUUM FULL`` every ledger table (each rewritten without its dead rows: what the live
    rows take), then their total bytes, of which the archive's index in the database."""
    began = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in table_sizes(dsn):
            conn.execute(f'VACUUM (FULL, ANALYZE) "{table}"')
    sizes = table_sizes(dsn)
    index = ("operations_archivedintent", "operations_archivesegment")
    return {
        "ledger_table_bytes": sum(size["total"] for size in sizes.values()),
        "archive_index_bytes": sum(sizes.get(table, {}).get("total", 0) for table in index),
        "seconds": round(time.perf_counter() - began, 1),
    }


def archive_growth(dsn: str, *, rows: int, unknown: int, repeat: int, token: str, log: Log,
                   now: datetime | None = None) -> dict[str, Any]:  # fmt: skip
    """Load ``rows`` intents into the empty ledger at ``dsn``: ``ARCHIVED_SHARE`` of them settled
    (``bulk.SETTLED_MIX``) and updated more than ``ARCHIVED_BEFORE_DAYS`` days ago, the rest
    over the last ``LIVE_DAYS`` days (``bulk.STATE_MIX``, of them ``unknown`` UNKNOWN). Time
    the console pages and the API's list and detail (``repeat`` requests each, as the agent of
    ``token``), archive every intent settled before the cutoff between them with
    ``operations.archive.services.archive_run``, ``VACUUM (ANALYZE)``, and time them again.

    Returns ``load``, ``cutoff``, ``before`` and ``after`` (``pages``, ``database_bytes``,
    ``intent_rows``, ``ledger_table_bytes``), ``compacted`` (the ledger's tables after ``VACUUM
    FULL``, of them the archive index), ``archive`` (the archiver's report and the archive's
    bytes on disk). When the archiver is not built yet, ``archiver`` says so and
    ``after`` and ``archive`` are None.

    Raises:
        ValueError: fewer than 10 live intents besides the UNKNOWN ones.
    """
    archived = int(rows * ARCHIVED_SHARE)
    live = rows - archived - unknown
    if live < 10:
        raise ValueError(f"{rows} intents leave {live} live ones besides {unknown} UNKNOWN: give more")
    now = now or timezone.now()
    cutoff = now - timedelta(days=(ARCHIVED_BEFORE_DAYS + LIVE_DAYS) / 2)
    log(
        f"archive: loading {archived:,} settled intents before {cutoff:%Y-%m-%d} and {live + unknown:,} live ones"
    )
    old = bulk.load_intents(dsn, count=archived, tag="old", mix=bulk.SETTLED_MIX, span_days=90,
                            ends_at=now - timedelta(days=ARCHIVED_BEFORE_DAYS))  # fmt: skip
    recent = bulk.load_intents(dsn, count=live, tag="bulk", span_days=LIVE_DAYS, ends_at=now)
    stuck = bulk.load_intents(
        dsn, count=unknown, status="UNKNOWN", tag="unk1", span_days=LIVE_DAYS, ends_at=now
    )
    vacuum = bulk.analyze(dsn)
    status_rollup_refresh()
    load = {"rows": rows, "archivable": archived, "live": live + unknown, "vacuum_analyze_seconds": vacuum,
            "copy_seconds": round(old["seconds"] + recent["seconds"] + stuck["seconds"], 1)}  # fmt: skip
    intent_id, reference = _live_intent(tag="bulk")
    log(f"archive: loaded in {load['copy_seconds']:.0f} s; timing the console and the API before archiving")
    before = _measure(dsn, token=token, intent_id=intent_id, reference=reference, repeat=repeat)
    result: dict[str, Any] = {"load": load, "cutoff": cutoff.isoformat(), "before": before, "after": None,
                              "archive": None, "archiver": "available"}  # fmt: skip
    archive_run = _archiver()
    if archive_run is None:
        log("archive: archiver not available (operations.archive.services.archive_run): no after figures")
        result["archiver"] = "not available"
        return result
    with tempfile.TemporaryDirectory(prefix="el-bench-archive-") as scratch, _archive_settings(Path(scratch)):
        log(f"archive: archiving the intents settled before {cutoff:%Y-%m-%d}")
        began = time.perf_counter()
        report = archive_run(before=cutoff, progress=log)
        seconds = round(time.perf_counter() - began, 1)
        archive_bytes = _bytes_under(Path(settings.EFFECT_LEDGER["ARCHIVE_DIR"]))
    vacuum = _vacuum_analyze(dsn)
    status_rollup_refresh()
    log(f"archive: {report.intents_archived:,} intents archived in {seconds:.0f} s, VACUUM (ANALYZE) {vacuum:.0f} s;"
        " timing again")  # fmt: skip
    result["after"] = _measure(dsn, token=token, intent_id=intent_id, reference=reference, repeat=repeat)
    log("archive: VACUUM FULL of the ledger's tables, to size what the live rows take")
    result["compacted"] = _compacted(dsn)
    result["archive"] = {
        "intents_archived": report.intents_archived,
        "segments": report.segments,
        "bytes_written": report.bytes_written,
        "bytes_on_disk": archive_bytes,
        "seconds": seconds,
        "vacuum_analyze_seconds": vacuum,
    }
    return result


def run(options: Options, *, growth_phase: bool, archive_phase: bool, log: Log) -> dict[str, Any]:
    """The growth phase (``options.growth_intents`` intents) and/or the archive phase
    (``options.console_rows`` intents), each in a scratch ledger named ``options.database``;
    returns ``options``, ``machine`` and ``growth`` / ``archive`` for ``report.render_growth``."""
    chosen = ("growth_intents", "console_rows", "unknown_small", "page_repeat", "database", "keep")
    results: dict[str, Any] = {
        "options": {name: getattr(options, name) for name in chosen},
        "machine": machine(),
    }
    if growth_phase:
        with scratch_ledger(options.database, keep=options.keep) as dsn:
            results["growth"] = growth(dsn, intents=options.growth_intents, log=log)
    if archive_phase:
        from operations.api.authentication import agent_create

        with scratch_ledger(options.database, keep=options.keep) as dsn:
            _, token = agent_create(name="bench", tenant="acme")
            results["archive"] = archive_growth(dsn, rows=options.console_rows, unknown=options.unknown_small,
                                                repeat=options.page_repeat, token=token, log=log)  # fmt: skip
    return results
