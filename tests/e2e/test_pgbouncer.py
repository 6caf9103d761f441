"""The product behind a real PgBouncer in transaction pooling mode (issue 35): web and worker
processes whose ``DATABASE_URL`` goes through the pooler (``tests.support.pgbouncer``, a pool of
four server connections so that session state left on a pooled connection bites at once).

On main before issue 35, sign-ins of one (user, address) pair hung (a session advisory lock
stayed on a pooled connection), webhook passes returned nothing (the same, for the delivery
pass), ``?wait=`` waited its full time (LISTEN through the pooler hears nothing) and a recovery
left its session lock behind.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from axes.models import AccessAttempt
from django.db import connection

from console.lab.cluster import Process
from operations.models import Intent, WebhookDelivery
from operations.selectors.leases import lease_held
from operations.services import agent_callback_set, intent_cancel
from operations.services.failover import RECOVERY_LEASE
from tests.factories import UserFactory, charge_arguments, make_agent, submit
from tests.support.pgbouncer import PgBouncer, free_port
from tests.support.webhook_receiver import Receiver
from tests.support.workers import Cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _database() -> str:
    return str(connection.settings_dict["NAME"])


def _pooled_env(bouncer: PgBouncer, **extra: str) -> dict[str, str]:
    """The environment of a process whose database is reached through ``bouncer``."""
    return {
        **os.environ,
        "DATABASE_URL": bouncer.url(_database()),
        "DATABASE_POOL_MODE": "transaction",
        "EFFECT_LEDGER_RATE_AGENT": "off",
        "EFFECT_LEDGER_RATE_TENANT": "off",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


@pytest.fixture
def start_web(transactional_db: None) -> Iterator[Any]:
    """A factory of gunicorn processes (``console.gunicorn_conf``, one gthread worker) with the
    given environment; returns ``(base URL, Process)``."""
    started: list[Process] = []

    def start(env: dict[str, str], threads: int = 8) -> tuple[str, Process]:
        port = free_port()
        command = [sys.executable, "-m", "gunicorn", "-c", "python:console.gunicorn_conf", "console.wsgi:application",
                   "-b", f"127.0.0.1:{port}", "-w", "1", "--threads", str(threads), "--no-control-socket"]  # fmt: skip
        server = Process(f"web-{port}", command, env)
        started.append(server)
        wait_for(lambda: "Listening at: " in server.output() or not server.alive(), 30, "gunicorn")
        assert server.alive(), server.output()[-2000:]
        return f"http://127.0.0.1:{port}", server

    try:
        yield start
    finally:
        for server in started:
            server.stop(timeout=10)


def _advisory_locks() -> int:
    """Advisory locks held on the test database now, by any session (pooled ones included)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
            " WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database()"
        )
        (count,) = cursor.fetchone()
    return int(count)


def test_i35_a_sign_in_storm_through_pgbouncer_all_answer_and_the_lockout_counts_right(
    pgbouncer: PgBouncer, start_web: Any, settings: Any
) -> None:
    # given: a web process on the pooler, and one account
    UserFactory(username="stormy", groups=["viewer"])
    base, _ = start_web(_pooled_env(pgbouncer))
    with httpx.Client(base_url=base, timeout=10) as first:
        page = first.get("/login/")
        token = first.cookies["csrftoken"]
    assert page.status_code == 200
    guesses = 30
    barrier = threading.Barrier(guesses)

    def guess(n: int) -> tuple[int, float]:
        with httpx.Client(base_url=base, timeout=90, cookies={"csrftoken": token}) as client:
            barrier.wait()
            started = time.monotonic()
            response = client.post(
                "/login/",
                data={"username": "stormy", "password": f"wrong-{n}", "csrfmiddlewaretoken": token},
                headers={"Referer": f"{base}/login/"},
            )
            return response.status_code, time.monotonic() - started

    # when: thirty wrong passwords for one account from one address at once, twice over
    # (the second storm meets whatever the first left on pooled connections)
    answers: list[tuple[int, float]] = []
    for _ in range(2):
        with ThreadPoolExecutor(max_workers=guesses) as pool:
            try:
                answers += list(pool.map(guess, range(guesses), timeout=120))
            except TimeoutError:
                pytest.fail(
                    "a sign-in through PgBouncer never answered (a lock left on a pooled connection?)"
                )
    # then: every one answered, in bounded time; four failures shown, the fifth and every later
    # one locked out; the failures counted stop at the limit
    statuses = [status for status, _ in answers]
    assert max(elapsed for _, elapsed in answers) < 60, answers
    assert statuses.count(200) == settings.AXES_FAILURE_LIMIT - 1, statuses
    assert statuses.count(429) == 2 * guesses - statuses.count(200), statuses
    failures = sum(a.failures_since_start for a in AccessAttempt.objects.filter(username="stormy"))
    assert failures == 2 * guesses  # every attempt counted once, none lost
    # and the right password is refused now: the pair is locked
    with httpx.Client(base_url=base, timeout=30, cookies={"csrftoken": token}) as client:
        right = client.post(
            "/login/",
            data={"username": "stormy", "password": "correct horse battery", "csrfmiddlewaretoken": token},
            headers={"Referer": f"{base}/login/"},
        )
    assert right.status_code == 429
    assert _advisory_locks() == 0


def test_i35_webhooks_through_pgbouncer_are_all_delivered(
    pgbouncer: PgBouncer, cluster: Cluster, receiver: Receiver, settings: Any
) -> None:
    # given: two workers and beat on the pooler, allowed to POST to loopback, and an agent that
    # registered the receiver
    cluster.use_database_url(pgbouncer.url(_database()))
    cluster.env["DATABASE_POOL_MODE"] = "transaction"
    cluster.env["EFFECT_LEDGER_WEBHOOK_ALLOWED_NETWORKS"] = "127.0.0.0/8"
    cluster.env["EFFECT_LEDGER_WEBHOOK_PERIOD_SECONDS"] = "0.5"
    cluster.env["EFFECT_LEDGER_WEBHOOK_BACKOFF_BASE_SECONDS"] = "0.5"
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "WEBHOOK_ALLOWED_NETWORKS": ["127.0.0.0/8"]}
    cluster.worker("w1", concurrency=2)
    cluster.worker("w2", concurrency=2)
    cluster.beat()
    agent, _ = make_agent()
    agent_callback_set(agent=agent, url=receiver.url)
    # when: forty charges
    intents = [submit(arguments=charge_arguments(100 + n), reference=f"pgb-hook-{n}") for n in range(40)]

    def settled() -> bool:
        return not Intent.objects.filter(id__in=[i.id for i in intents]).exclude(status="SUCCEEDED").exists()

    wait_for(settled, 120, "forty charges to succeed through PgBouncer")
    wait_for(
        lambda: WebhookDelivery.objects.filter(state="delivered").count() == len(intents),
        90,
        "every webhook to be delivered through PgBouncer",
    )
    # then: every one delivered, none left pending, no lock on any pooled connection
    assert not WebhookDelivery.objects.exclude(state="delivered").exists()
    assert len({r.headers["webhook-id"] for r in receiver.received}) == len(intents)
    assert _advisory_locks() == 0


def _wait_across_a_cancel(base: str, ready: Any) -> tuple[httpx.Response, float]:
    """A new intent's ``GET ?wait=25`` from another thread; once ``ready()`` holds, the intent is
    cancelled here (a committed transaction elsewhere). Returns the wait's answer and the seconds
    from the cancel to it."""
    _, token = make_agent()
    intent = submit()
    answer: dict[str, Any] = {}

    def wait() -> None:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=40) as client:
            answer["response"] = client.get(f"/api/v1/intents/{intent.id}", params={"wait": "25"})
        answer["at"] = time.monotonic()

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    ready()
    intent_cancel(intent_id=intent.id, actor="agent:agent-1", reason="no longer needed")
    changed_at = time.monotonic()
    waiter.join(40)
    return answer["response"], answer["at"] - changed_at


def test_i35_a_wait_through_pgbouncer_answers_soon_after_the_change(
    pgbouncer: PgBouncer, start_web: Any
) -> None:
    # given: a web process on the pooler whose listener connects directly (DATABASE_LISTEN_URL)
    direct = pgbouncer.direct_url(_database())
    base, _ = start_web(_pooled_env(pgbouncer, DATABASE_LISTEN_URL=direct), threads=4)

    def listening() -> None:
        wait_for(lambda: _listener_on(direct), 20, "the web process's LISTEN connection")
        time.sleep(0.5)  # the request registers its wait

    # when: the intent is cancelled while a request waits for it
    response, seconds = _wait_across_a_cancel(base, listening)
    # then: the wait answered the change within about two seconds, not after its 25 s
    assert (response.json()["status"], response.headers["effect-ledger-wait"]) == ("CANCELLED", "changed")
    assert seconds < 2.5, seconds


def test_i35_without_a_listen_url_a_pooled_web_process_says_so_and_waits_poll(
    pgbouncer: PgBouncer, start_web: Any
) -> None:
    # given: a web process on the pooler in transaction mode, without DATABASE_LISTEN_URL
    base, server = start_web(_pooled_env(pgbouncer), threads=4)
    # when
    response, seconds = _wait_across_a_cancel(
        base,
        lambda: wait_for(
            lambda: "status listener not started" in server.output(), 20, "the fallback's log line"
        ),
    )
    # then: the once-a-second re-read found it; no listener connected anywhere
    assert response.json()["status"] == "CANCELLED"
    assert seconds < 3.5, seconds  # one re-read a second
    assert "DATABASE_LISTEN_URL" in server.output()


@pytest.mark.parametrize("listen_through", ["the pooler", "nothing set, pool mode unset"])
def test_i35_a_listener_behind_the_pooler_is_refused_by_its_proof_and_waits_poll(
    pgbouncer: PgBouncer, start_web: Any, listen_through: str
) -> None:
    # given: a web process whose listener would connect through the pooler: DATABASE_LISTEN_URL
    # naming it, or DATABASE_URL the pooler with DATABASE_POOL_MODE left unset (a newcomer's
    # mistakes: every wait lasted its full time, with an INFO "listening" line)
    if listen_through == "the pooler":
        env = _pooled_env(pgbouncer, DATABASE_LISTEN_URL=pgbouncer.url(_database()))
    else:
        env = {**_pooled_env(pgbouncer), "DATABASE_POOL_MODE": ""}
    base, server = start_web(env, threads=4)
    # when
    response, seconds = _wait_across_a_cancel(
        base,
        lambda: wait_for(lambda: "status listener not used" in server.output(), 20, "the listener's refusal"),
    )
    # then: the warning says why and what to set, and the wait answered by its re-read
    assert "connection pooler" in server.output() and "DATABASE_LISTEN_URL" in server.output()
    assert response.json()["status"] == "CANCELLED"
    assert seconds < 3.5, seconds


def _listener_on(direct_url: str) -> bool:
    with psycopg.connect(direct_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'effect-ledger-listener' AND query ILIKE 'LISTEN%'"
        ).fetchone()
    return bool(row and row[0] >= 1)


def test_i35_recover_through_pgbouncer_releases_its_lock(pgbouncer: PgBouncer, tmp_path: Any) -> None:
    # given: other clients keep the pooler's server connections busy, so that consecutive
    # transactions of one client land on different server connections
    stop = threading.Event()

    def churn() -> None:
        with psycopg.connect(pgbouncer.url(_database()), autocommit=True, prepare_threshold=None) as conn:
            while not stop.is_set():
                conn.execute("SELECT pg_sleep(0.02)")

    churners = [threading.Thread(target=churn, daemon=True) for _ in range(3)]
    for thread in churners:
        thread.start()
    env = _pooled_env(
        pgbouncer,
        EFFECT_LEDGER_AUDIT_CHECKPOINT_FILE=str(tmp_path / "checkpoints.jsonl"),
        EFFECT_LEDGER_AUDIT_SIGNING_KEY_FILE=str(tmp_path / "signing-key.pem"),
        EFFECT_LEDGER_AUDIT_SIGNING_KEY_CREATE="1",
    )
    since = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    try:
        # when: two recoveries, one after the other, through the pooler
        results = []
        for n in range(2):
            recovery = Process(
                f"recover-{n}",
                [sys.executable, "manage.py", "recover", "--since", since],
                env,
            )
            recovery.popen.wait(timeout=120)
            results.append((recovery.popen.returncode, recovery.output()[-1500:]))
    finally:
        stop.set()
        for thread in churners:
            thread.join(5)
    # then: both ran (the first released its lock); nothing is left held
    assert [code for code, _ in results] == [0, 0], results
    assert not lease_held(name=RECOVERY_LEASE)
    assert _advisory_locks() == 0


def test_i35_one_idempotency_key_through_pgbouncer_makes_one_intent(
    pgbouncer: PgBouncer, start_web: Any
) -> None:
    # given: a web process on the pooler, and twenty submissions with one Idempotency-Key
    base, _ = start_web(_pooled_env(pgbouncer))
    _, token = make_agent()
    body = {"action": "payments.charge", "action_version": 1, "arguments": charge_arguments(4321)}
    barrier = threading.Barrier(20)

    def post(_: int) -> httpx.Response:
        with httpx.Client(base_url=base, timeout=60) as client:
            barrier.wait()
            return client.post(
                "/api/v1/intents",
                json=body,
                headers={"Authorization": f"Bearer {token}", "Idempotency-Key": "pgb-one-key"},
            )

    # when: all at once
    with ThreadPoolExecutor(max_workers=20) as pool:
        responses = list(pool.map(post, range(20), timeout=90))
    # then: one intent, and every answer names it
    assert {r.status_code for r in responses} <= {200, 201}, [
        (r.status_code, r.text[:200]) for r in responses
    ]
    assert Intent.objects.count() == 1
    assert {r.json()["intent_id"] for r in responses} == {str(Intent.objects.get().id)}


def test_i36_the_archive_through_pgbouncer_archives_verifies_and_leaves_no_lease(
    pgbouncer: PgBouncer, sandbox: Any, tmp_path: Any
) -> None:
    """``manage.py archive`` and ``verify_audit`` behind the pooler in transaction mode: the
    segment's REPEATABLE READ snapshot, the ``SET LOCAL`` that lets its deletes through, and the
    lease renewed on a second connection all hold on pooled connections."""
    import subprocess

    from django.utils import timezone

    from operations.engine.protocol import execute_intent
    from operations.models import ArchivedIntent

    intents = [submit() for _ in range(3)]
    for intent in intents:
        execute_intent(intent.id)
    Intent.objects.filter(id__in=[i.id for i in intents]).update(
        created_at=timezone.now() - timedelta(days=100), updated_at=timezone.now() - timedelta(days=100)
    )
    env = _pooled_env(
        pgbouncer,
        EFFECT_LEDGER_ARCHIVE_DIR=str(tmp_path / "archive"),
        EFFECT_LEDGER_AUDIT_SIGNING_KEY_FILE=str(tmp_path / "audit.pem"),
        EFFECT_LEDGER_AUDIT_SIGNING_KEY_CREATE="1",
        EFFECT_LEDGER_AUDIT_CHECKPOINT_FILE=str(tmp_path / "checkpoints.jsonl"),
    )
    archived = subprocess.run(  # noqa: S603 - this interpreter, fixed arguments
        [sys.executable, "manage.py", "archive"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert archived.returncode == 0, archived.stdout[-2000:] + archived.stderr[-2000:]
    assert "archived 3 intents in 1 new segments" in archived.stdout
    assert ArchivedIntent.objects.filter(state="archived").count() == 3 and not Intent.objects.exists()
    assert not lease_held(name="archive")
    verified = subprocess.run(  # noqa: S603 - this interpreter, fixed arguments
        [sys.executable, "manage.py", "verify_audit", "--database-only"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert verified.returncode == 0, verified.stdout[-2000:] + verified.stderr[-2000:]
    assert "audit archive verified" in verified.stdout
