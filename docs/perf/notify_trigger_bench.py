"""Micro-benchmark of migration 0028's status NOTIFY trigger (issue 15, "Waiting without polling").

Times N committed single-row status updates (each its own transaction, as transitions are) on a
scratch table shaped like ``operations_intent`` (id uuid, status varchar(20)): without the
trigger, with the migration's own trigger SQL while no request waits (the common case: one probe
of the waiter table, no NOTIFY), and with every intent awaited (a NOTIFY per update); then the
same with CLIENTS connections committing concurrently, since a NOTIFY takes a server-wide lock
at commit (PostgreSQL source, ``async.c``, ``PreCommit_Notify``).
One connection LISTENs throughout, as a web process's listener does. Prints figures; asserts
nothing.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/effect_ledger \\
        python docs/perf/notify_trigger_bench.py [--updates 2000] [--clients 4] [--rounds 3]

A scratch database ``el_notify_bench`` on the same server is created and dropped.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
migration = importlib.import_module("operations.migrations.0028_intent_status_notify")

SCRATCH = "el_notify_bench"


def _updates(dsn: str, ids: list[uuid.UUID], start: threading.Barrier | None = None) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        if start is not None:
            start.wait()
        for intent_id in ids:
            # autocommit: one transaction, one commit per update (as transition() commits); the
            # status always changes, so the trigger always notifies
            conn.execute(
                "UPDATE operations_intent SET status = CASE status WHEN 'READY' THEN 'RUNNING' ELSE 'READY' END"
                " WHERE id = %s",
                (intent_id,),
            )


def _run(dsn: str, ids: list[uuid.UUID], clients: int) -> float:
    chunks = [ids[i::clients] for i in range(clients)]
    barrier = threading.Barrier(clients + 1)
    threads = [threading.Thread(target=_updates, args=(dsn, chunk, barrier)) for chunk in chunks]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server = conninfo_to_dict(os.environ["DATABASE_URL"])
    admin = make_conninfo("", **{**server, "dbname": "postgres"})
    dsn = make_conninfo("", **{**server, "dbname": SCRATCH})
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {SCRATCH} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {SCRATCH}")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn, autocommit=True) as listener:
            version = conn.execute("SHOW server_version").fetchone()
            sync = conn.execute("SHOW synchronous_commit").fetchone()
            conn.execute("CREATE TABLE operations_intent (id uuid PRIMARY KEY, status varchar(20) NOT NULL)")
            conn.execute(
                "CREATE TABLE operations_intentwaiter (id bigserial PRIMARY KEY, intent_id uuid NOT NULL,"
                " expires_at timestamptz NOT NULL)"
            )
            conn.execute("CREATE INDEX ON operations_intentwaiter (intent_id)")
            ids = [uuid.uuid4() for _ in range(args.updates)]
            with conn.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO operations_intent (id, status) VALUES (%s, 'READY')", [(i,) for i in ids]
                )
            listener.execute(f"LISTEN {migration.CHANNEL}")
            print(
                f"PostgreSQL {version[0] if version else '?'}, synchronous_commit={sync[0] if sync else '?'}, "
                f"{os.cpu_count()} CPU; {args.updates} committed status updates"
            )
            for clients in (1, args.clients):
                _run(dsn, ids[:200], clients)  # warm-up
                times: dict[str, list[float]] = {"without trigger": [], "nobody waits": [], "all awaited": []}
                heard = 0
                for round_no in range(args.rounds):
                    # alternate the order, so a slower moment of a busy machine hits each
                    for label in sorted(times, reverse=round_no % 2 == 1):
                        if label != "without trigger":
                            conn.execute(migration.CREATE)
                        if label == "all awaited":
                            conn.execute(
                                "INSERT INTO operations_intentwaiter (intent_id, expires_at)"
                                " SELECT id, now() + interval '1 hour' FROM operations_intent"
                            )
                        times[label].append(_run(dsn, ids, clients))
                        if label != "without trigger":
                            conn.execute("TRUNCATE operations_intentwaiter")
                            conn.execute(migration.DROP)
                            heard += sum(1 for _ in listener.notifies(timeout=0.5))
                for label, runs in times.items():
                    seconds = statistics.median(runs)
                    print(
                        f"  {clients} client(s), {label:15}: median {seconds:6.2f} s of {args.rounds} runs "
                        f"({', '.join(f'{r:.2f}' for r in runs)}), {args.updates / seconds:5.0f} updates/s, "
                        f"{seconds / args.updates * 1e3:5.2f} ms each"
                    )
                base = statistics.median(times["without trigger"])
                idle, awaited = (
                    statistics.median(times[label]) / base for label in ("nobody waits", "all awaited")
                )
                print(
                    f"  {clients} client(s): the trigger costs {100 * (idle - 1):+.0f}% while nobody waits, "
                    f"{100 * (awaited - 1):+.0f}% with every intent awaited "
                    f"({heard} of {args.updates * args.rounds} notifications heard)"
                )
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {SCRATCH} WITH (FORCE)")


if __name__ == "__main__":
    main()
