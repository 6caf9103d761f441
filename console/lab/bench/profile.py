"""Phase 3, per statement: one happy-path intent run in this process (API submit through the
real view, the hand-off after commit, then the worker's ``execute_intent``), counting every
SQL statement and every server-side commit, by step."""

from __future__ import annotations

import collections
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection

#: The API's rate limits in the benchmark: on, as deployed, at a rate the load never reaches.
BENCH_RATE = "1000000/min"


class Tally:
    """Statements and commits seen on Django's connection while active.

    A commit is either an outermost ``transaction.atomic`` block that committed, or a statement
    run outside any atomic block (autocommit: the server commits each one by itself).
    """

    def __init__(self) -> None:
        self.step = "?"
        self.statements: collections.Counter[str] = collections.Counter()
        self.commits: collections.Counter[str] = collections.Counter()
        self.autocommit_reads: collections.Counter[str] = collections.Counter()
        self.sql: list[tuple[str, str]] = []

    def wrapper(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        """A Django ``execute_wrapper``."""
        self.statements[self.step] += 1
        self.sql.append((self.step, sql.split()[0].upper() + " " + " ".join(sql.split()[1:6])[:90]))
        if not connection.in_atomic_block:
            self.commits[self.step] += 1
            if sql.lstrip().upper().startswith("SELECT"):
                self.autocommit_reads[self.step] += 1
        return execute(sql, params, many, context)


@contextmanager
def tallying(tally: Tally) -> Iterator[None]:
    """Count statements (``execute_wrapper``) and atomic commits (wrapping ``commit``)."""
    original = connection.commit

    def commit() -> None:
        tally.commits[tally.step] += 1
        original()

    connection.commit = commit  # type: ignore[method-assign]
    try:
        with connection.execute_wrapper(tally.wrapper):
            yield
    finally:
        del connection.commit


def happy_path(*, token: str, runs: int = 5) -> dict[str, Any]:
    """Submit and execute ``runs`` auto-approved ``payments.charge`` intents in-process; return
    statements and commits per intent, by step (``submit`` includes the hand-off after commit).

    The sandbox provider must be running (``settings.SANDBOX_PROVIDER_URL``); the hand-off
    publishes to the broker, where no worker consumes it (harmless: a duplicate delivery).
    """
    from django.conf import settings
    from rest_framework.test import APIClient

    from operations.engine.protocol import execute_intent

    # the rate limits on, as in the bench's gunicorn (console.lab.bench.services), at the same
    # rate: the windows are shared, and the load phases counted thousands of this agent's requests
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "RATE_AGENT": BENCH_RATE, "RATE_TENANT": BENCH_RATE}
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    tally = Tally()
    connection.ensure_connection()
    timings: collections.defaultdict[str, float] = collections.defaultdict(float)
    sql_sample: list[tuple[str, str]] = []
    for run in range(runs):
        key = f"profile-{uuid.uuid4().hex[:8]}"
        with tallying(tally):
            tally.step = "submit (API + hand-off)"
            began = time.perf_counter()
            response = client.post(
                "/api/v1/intents",
                {
                    "action": "payments.charge",
                    "arguments": {"amount": 1200, "currency": "EUR", "customer": "c"},
                    "reference": key,
                },  # fmt: skip
                format="json",
                HTTP_IDEMPOTENCY_KEY=key,
            )
            timings[tally.step] += time.perf_counter() - began
            assert response.status_code == 201, response.content
            tally.step = "execute (claim, call, record)"
            began = time.perf_counter()
            outcome = execute_intent(uuid.UUID(response.json()["intent_id"]))
            timings[tally.step] += time.perf_counter() - began
            assert outcome == "succeeded", outcome
        if run == 0:
            sql_sample = list(tally.sql)
    steps = list(tally.statements)
    return {
        "runs": runs,
        "steps": {
            step: {
                "statements": tally.statements[step] / runs,
                "commits": tally.commits[step] / runs,
                "autocommit_reads": tally.autocommit_reads[step] / runs,
                "ms": round(1000 * timings[step] / runs, 2),
            }
            for step in steps
        },
        "statements_per_intent": sum(tally.statements.values()) / runs,
        "commits_per_intent": sum(tally.commits.values()) / runs,
        "write_commits_per_intent": (sum(tally.commits.values()) - sum(tally.autocommit_reads.values()))
        / runs,
        "statements_of_one_intent": [f"{step}: {sql}" for step, sql in sql_sample],
    }
