"""Phases 1, 2 and 6: intents end to end through the API, the bare-Celery baseline, and the
API submit against a trivial view."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg

from console.lab.bench import cpu
from console.lab.bench.database import db_counters, server_dsn, settle_stats
from console.lab.bench.load import Sample, closed_loop, open_loop
from console.lab.bench.stats import summary_ms


@dataclass
class Target:
    """Where the load goes: the API base URL, an agent token, the databases' names."""

    api_url: str
    token: str
    ledger_db: str
    sandbox_db: str
    sandbox_url: str


def _charge_sender(target: Target, prefix: str) -> Any:
    def send(client: httpx.Client, seq: int) -> tuple[int, str]:
        body = {
            "action": "payments.charge",
            "arguments": {"amount": 1000 + seq % 9000, "currency": "EUR", "customer": f"cus_{seq % 997}"},
            "reference": f"{prefix}-{seq}",
        }
        response = client.post(
            f"{target.api_url}/api/v1/intents",
            json=body,
            headers={"Authorization": f"Bearer {target.token}", "Idempotency-Key": f"{prefix}-{seq}"},
        )
        intent_id = response.json().get("intent_id", "") if response.status_code == 201 else ""
        return response.status_code, str(intent_id)

    return send


def _wait_for(conn: psycopg.Connection[Any], sql: str, args: list[Any], want: int, timeout: float) -> int:
    """Poll ``sql`` (a count) every 0.1 s until it reaches ``want``; returns the polls made."""
    polls, deadline = 0, time.monotonic() + timeout
    while time.monotonic() < deadline:
        polls += 1
        row = conn.execute(sql, args).fetchone()
        if row and int(row[0]) >= want:
            return polls
        time.sleep(0.1)
    raise TimeoutError(f"only part of {want} rows reached the state within {timeout:.0f} s")


def _finished(target: Target, prefix: str, samples: list[Sample], timeout: float) -> dict[str, Any]:
    """Wait for every accepted intent of ``prefix`` to be SUCCEEDED; latency and throughput."""
    accepted = [s for s in samples if s.status == 201]
    with psycopg.connect(server_dsn(target.ledger_db), autocommit=True) as conn:
        polls = _wait_for(
            conn,
            "SELECT count(*) FROM operations_intent WHERE reference LIKE %s AND status = 'SUCCEEDED'",
            [f"{prefix}-%"],
            len(accepted),
            timeout,
        )
        rows = conn.execute(
            "SELECT reference, EXTRACT(EPOCH FROM updated_at) FROM operations_intent WHERE reference LIKE %s",
            [f"{prefix}-%"],
        ).fetchall()
    done_at = {str(ref): float(epoch) for ref, epoch in rows}
    latencies = [
        done_at[f"{prefix}-{s.seq}"] - s.started_at for s in accepted if f"{prefix}-{s.seq}" in done_at
    ]
    first = min(s.started_at for s in samples)
    last = max(done_at.values())
    return {
        "intents": len(accepted),
        "errors": len(samples) - len(accepted),
        "seconds": round(last - first, 3),
        "intents_per_second": round(len(accepted) / (last - first), 1),
        "submit_to_succeeded": summary_ms(latencies),
        "api_response": summary_ms([s.seconds for s in samples]),
        "_polls": polls + 1,
    }


def run_full_load(
    target: Target, *, intents: int, clients: int, cpu_groups: Sequence[cpu.Group] = ()
) -> dict[str, Any]:
    """Closed loop: ``clients`` agents submit ``intents`` as fast as the API answers; measured
    until the last is SUCCEEDED, with the ``pg_stat_database`` delta of the ledger database and,
    under ``"cpu"``, the CPU of ``cpu_groups`` over the same interval (``cpu.per_unit``, per
    intent)."""
    prefix = f"full-{uuid.uuid4().hex[:6]}"
    settle_stats()
    before = db_counters(target.ledger_db)
    meter = cpu.Meter(cpu_groups)
    meter.start()
    samples = closed_loop(_charge_sender(target, prefix), total=intents, clients=clients)
    result = _finished(target, prefix, samples, timeout=max(120.0, intents / 5))
    reading = meter.stop()
    settle_stats()
    delta = db_counters(target.ledger_db).minus(before)
    polls = result.pop("_polls")
    n = max(1, result["intents"])
    result["clients"] = clients
    result["db"] = {
        "commits_per_intent": round((delta.commits - polls) / n, 2),
        "rollbacks_per_intent": round(delta.rollbacks / n, 3),
        "sessions_per_intent": round(delta.sessions / n, 2),
        "rows_inserted_per_intent": round(delta.tuples_inserted / n, 2),
        "rows_updated_per_intent": round(delta.tuples_updated / n, 2),
        "note": "whole-database delta over the run (API, relay, workers, beat); bench polls subtracted",
    }
    if cpu_groups:
        result["cpu"] = cpu.per_unit(reading, result["intents"])
    return result


def run_half_load(target: Target, *, intents: int, rate: float, clients: int) -> dict[str, Any]:
    """Open loop at ``rate`` intents per second (half the full-load throughput)."""
    prefix = f"half-{uuid.uuid4().hex[:6]}"
    samples = open_loop(_charge_sender(target, prefix), total=intents, rate=rate, clients=clients)
    result = _finished(target, prefix, samples, timeout=max(120.0, intents / 5))
    result.pop("_polls")
    result["offered_rate_per_second"] = round(rate, 1)
    return result


def run_bare(
    target: Target, *, effects: int, queue: str, cpu_groups: Sequence[cpu.Group] = ()
) -> dict[str, Any]:
    """Publish ``effects`` ``bench.bare_charge`` tasks and time them until the sandbox holds
    every charge (first publication to last charge row); under ``"cpu"``, the CPU of
    ``cpu_groups`` from the first publication until every charge is seen (per effect)."""
    from console.celery import app

    prefix = f"bare-{uuid.uuid4().hex[:6]}"
    url = f"{target.sandbox_url.rstrip('/')}/v1/charges"
    meter = cpu.Meter(cpu_groups)
    meter.start()
    started = time.time()
    with app.producer_or_acquire() as producer:
        for seq in range(effects):
            body = {"amount": 1000 + seq % 9000, "currency": "EUR", "customer": f"cus_{seq % 997}"}
            app.send_task(
                "bench.bare_charge",
                kwargs={"url": url, "key": f"{prefix}-{seq}", "body": body},
                queue=queue,
                producer=producer,
            )
    published = time.time()
    with psycopg.connect(server_dsn(target.sandbox_db), autocommit=True) as conn:
        _wait_for(
            conn,
            "SELECT count(*) FROM sandbox.charges WHERE idempotency_key LIKE %s",
            [f"{prefix}-%"],
            effects,
            max(120.0, effects / 5),
        )
        reading = meter.stop()
        row = conn.execute(
            "SELECT EXTRACT(EPOCH FROM max(created_at)) FROM sandbox.charges WHERE idempotency_key LIKE %s",
            [f"{prefix}-%"],
        ).fetchone()
    last = float(row[0]) if row and row[0] is not None else time.time()
    result: dict[str, Any] = {
        "effects": effects,
        "publish_seconds": round(published - started, 3),
        "seconds": round(last - started, 3),
        "effects_per_second": round(effects / (last - started), 1),
    }
    if cpu_groups:
        result["cpu"] = cpu.per_unit(reading, effects)
    return result


def run_api(target: Target, *, clients: int, seconds: float) -> dict[str, Any]:
    """Requests per second, closed loop for ``seconds`` each: the trivial DRF view, then
    ``POST /api/v1/intents`` (workers stopped, so only the web tier and the database work)."""
    headers = {"Authorization": f"Bearer {target.token}"}

    def trivial(client: httpx.Client, seq: int) -> tuple[int, str]:
        body = {
            "action": "payments.charge",
            "arguments": {"amount": 1000, "currency": "EUR", "customer": "c"},
        }
        return client.post(f"{target.api_url}/bench/trivial", json=body, headers=headers).status_code, ""

    def submit(client: httpx.Client, seq: int) -> tuple[int, str]:
        sent: tuple[int, str] = _charge_sender(target, f"api-{uuid.uuid4().hex[:6]}")(client, seq)
        return sent

    out: dict[str, Any] = {"clients": clients, "seconds_each": seconds}
    for name, sender in (("trivial", trivial), ("submit", submit)):
        closed_loop(sender, total=clients * 5, clients=clients)  # warm the workers up
        began = time.perf_counter()
        samples = closed_loop(sender, total=None, clients=clients, duration=seconds)
        elapsed = time.perf_counter() - began
        ok = [s for s in samples if s.status == 201]
        out[name] = {
            "requests": len(samples),
            "errors": len(samples) - len(ok),
            "requests_per_second": round(len(ok) / elapsed, 1),
            "latency": summary_ms([s.seconds for s in ok]),
        }
    return out
