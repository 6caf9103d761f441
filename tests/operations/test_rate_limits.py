"""The API's rate limits (issue 18, item 7; one round trip since issue 37): per agent and per
tenant, on windows every web process shares (PostgreSQL, or Redis when configured), answered
429 with Retry-After. Two real web processes: tests/e2e/test_rate_limits.py."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from console.lab.bench.profile import Tally, tallying
from console.settings_ledger import _rate
from operations.api import rate_windows, throttling
from operations.api.rate_windows import Limit, redis_prefix, retry_after, windows_check
from operations.api.rates import rate_parse
from operations.models import RateWindow
from tests.factories import make_agent

pytestmark = pytest.mark.django_db

URL = "/api/v1/intents"
#: The Redis the Redis-store tests use (database 15); they skip when none answers there.
REDIS_URL = os.environ.get("EFFECT_LEDGER_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def redis_or_skip() -> str:
    """``REDIS_URL`` emptied of earlier windows; skips the test when no Redis answers there."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        for key in client.scan_iter("effect-ledger:*"):
            client.delete(key)
    except redis.RedisError as error:
        pytest.skip(f"no Redis at {REDIS_URL} ({error}): set EFFECT_LEDGER_TEST_REDIS_URL")
    return REDIS_URL


@pytest.fixture(params=["postgres", "redis"])
def store(request: pytest.FixtureRequest, settings: Any) -> str:
    """Each test on both stores: the database's table, and Redis."""
    RateWindow.objects.all().delete()
    settings.EFFECT_LEDGER_CACHE_URL = redis_or_skip() if request.param == "redis" else ""
    return str(request.param)


@pytest.fixture
def rates(store: str, settings: Any) -> Any:
    """Set the limits (windows start empty: ``store``)."""

    def set_rates(agent: str | None, tenant: str | None) -> None:
        settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "RATE_AGENT": agent, "RATE_TENANT": tenant}

    return set_rates


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The limiter's clock, set by the test (Unix seconds; starts at a window's edge)."""
    now = [1_800_000_000.0]
    monkeypatch.setattr(throttling, "clock", lambda: now[0])
    return now


def client_of(name: str, tenant: str = "acme") -> APIClient:
    _, token = make_agent(name, tenant)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def assert_throttled(response: Any, *, at_most: int = 120) -> int:
    assert response.status_code == 429, response.content
    assert response["Content-Type"] == "application/problem+json"
    wait = int(response["Retry-After"])
    assert 1 <= wait <= at_most
    problem = response.json()
    assert (problem["status"], problem["code"]) == (429, "rate-limited")
    return wait


def test_i18_7_an_agent_over_its_limit_gets_429_with_retry_after(rates: Any) -> None:
    # given: 3 requests a minute per agent
    rates("3/min", None)
    bot, other = client_of("bot"), client_of("other")
    # when
    answers = [bot.get(URL).status_code for _ in range(3)]
    over = bot.get(URL)
    # then: the fourth is refused; another agent of the tenant is not
    assert answers == [200, 200, 200]
    assert_throttled(over)
    assert other.get(URL).status_code == 200


def test_i18_7_a_tenant_over_its_limit_gets_429_and_other_tenants_are_not_starved(rates: Any) -> None:
    # given: 5 requests a minute per agent, 8 per tenant; two agents of acme, one of globex
    rates("5/min", "8/min")
    first, second, elsewhere = client_of("first"), client_of("second"), client_of("g", "globex")
    # when: the first agent floods (5 served, then its own limit), the second adds 3 more
    flood = [first.get(URL).status_code for _ in range(6)]
    more = [second.get(URL).status_code for _ in range(3)]
    tenant_over = second.get(URL)
    # then: acme is at its limit although the second agent sent only 4 ...
    assert flood == [200] * 5 + [429] and more == [200, 200, 200]
    assert_throttled(tenant_over)
    # ... and the other tenant is served as if nothing happened
    assert [elsewhere.get(URL).status_code for _ in range(5)] == [200] * 5


def test_i18_7_unauthenticated_requests_are_401_not_throttled(rates: Any) -> None:
    rates("1/min", "1/min")
    answers = {APIClient().get(URL, HTTP_AUTHORIZATION="Bearer nope").status_code for _ in range(3)}
    assert answers == {401}


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("600/min", (600, 60)),
        ("20/s", (20, 1)),
        ("10000/hour", (10000, 3600)),
        ("5/day", (5, 86400)),
        ("off", None),
    ],
)
def test_i18_7_rates_are_parsed(text: str, parsed: Any) -> None:
    assert rate_parse(text) == parsed


@pytest.mark.parametrize("text", ["600", "0/min", "-1/min", "ten/min", "600/fortnight", "600/min/extra"])
def test_i18_7_a_malformed_rate_refuses_to_start(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EFFECT_LEDGER_RATE_AGENT", text)
    with pytest.raises(ValueError, match="EFFECT_LEDGER_RATE_AGENT"):
        _rate("EFFECT_LEDGER_RATE_AGENT", "600/min")


def test_i18_7_requests_an_agent_s_own_limit_refused_do_not_use_up_its_colleagues_tenant_limit(
    rates: Any,
) -> None:
    # given: 3 a minute per agent, 5 per tenant
    rates("3/min", "5/min")
    noisy, colleague = client_of("noisy"), client_of("colleague")
    # when: one agent keeps sending far past its own limit
    answers = [noisy.get(URL).status_code for _ in range(20)]
    # then: only its 3 served requests count for the tenant; the colleague still gets the other 2
    assert answers == [200] * 3 + [429] * 17
    assert [colleague.get(URL).status_code for _ in range(2)] == [200, 200]
    assert_throttled(colleague.get(URL))


def test_i37_a_burst_across_the_window_edge_passes_no_more_than_the_limit(
    rates: Any, clock: list[float]
) -> None:
    # given: 3 a minute, all 3 used in the last second of a window
    rates("3/min", None)
    bot = client_of("bot")
    clock[0] += 59
    assert [bot.get(URL).status_code for _ in range(3)] == [200] * 3
    # when: the next window opens (a fixed window would serve 3 more at once)
    clock[0] += 2
    refused = bot.get(URL)
    # then: refused, and told when the earlier three weigh little enough to serve one more ...
    wait = assert_throttled(refused)
    assert 19 <= wait <= 21  # 3 * (1 - t / 60) + 1 <= 3 from t = 20 s into the window
    # ... which is true: two seconds early it is still refused, a second after it is served
    clock[0] += wait - 2
    assert bot.get(URL).status_code == 429
    clock[0] += 3
    assert bot.get(URL).status_code == 200


def test_i37_refused_requests_are_not_counted_so_a_retrying_agent_is_served_again(
    rates: Any, clock: list[float]
) -> None:
    # given: 2 a minute, used up, then 50 refused retries within the same window
    rates("2/min", None)
    bot = client_of("bot")
    assert [bot.get(URL).status_code for _ in range(2)] == [200, 200]
    assert {bot.get(URL).status_code for _ in range(50)} == {429}
    # when: two windows later (its served requests have aged out)
    clock[0] += 120
    # then: served; the 50 refusals left nothing behind
    assert [bot.get(URL).status_code for _ in range(2)] == [200, 200]


@pytest.mark.django_db(transaction=True)
def test_i37_concurrent_requests_never_pass_the_limit(store: str) -> None:
    # given: a limit of 25, and 8 threads each on its own database connection
    limit = Limit("agent:race:60", 25, 60)
    served: list[bool] = []
    lock, start = threading.Lock(), threading.Barrier(8)

    def hammer() -> None:
        start.wait()
        try:
            for _ in range(10):
                verdict = windows_check([limit], now=1_800_000_010.0)
                with lock:
                    served.append(verdict.refused is None)
        finally:
            connections.close_all()

    # when: 80 requests at once
    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # then: exactly the limit was served (DRF's read-then-write window let a burst past it)
    assert (served.count(True), served.count(False)) == (25, 55)


@pytest.mark.django_db(transaction=True)
def test_i37_the_limits_cost_one_statement_that_stands_in_for_the_health_check(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: both limits on (the defaults), the database store, health checks on, a warm client
    settings.EFFECT_LEDGER_CACHE_URL = ""
    assert connection.settings_dict["CONN_HEALTH_CHECKS"]
    client = client_of("bot")
    assert client.get(URL).status_code == 200  # the token is verified and cached
    checks: list[bool] = []
    usable = connection.is_usable

    def counted() -> bool:
        checks.append(True)
        return usable()

    monkeypatch.setattr(connection, "is_usable", counted)
    tally = Tally()
    # when: one more request (a list: one read of its own)
    with tallying(tally), CaptureQueriesContext(connection) as captured:
        tally.step = "list"
        connection.close_if_unusable_or_obsolete()  # request_started does it (the test client not)
        assert client.get(URL).status_code == 200
    # then: the two limits took one statement, and Django's own health check (a SELECT 1 and a
    # commit of its own) did not run: the limits' statement was it. Before: six statements of
    # Django's database cache plus the health check.
    limit_statements = [q["sql"] for q in captured.captured_queries if "effect_ledger_rate_check" in q["sql"]]
    assert len(limit_statements) == 1, tally.sql
    assert tally.statements["list"] == 2 and tally.commits["list"] == 2, tally.sql
    assert checks == []


@pytest.mark.django_db(transaction=True)
def test_i37_a_connection_the_server_dropped_is_replaced_by_the_limits_statement(settings: Any) -> None:
    # given: a served request, then the server ends this process's connection (a restart, a pooler)
    settings.EFFECT_LEDGER_CACHE_URL = ""
    client = client_of("bot")
    assert client.get(URL).status_code == 200
    pid = connection.connection.info.backend_pid
    params = connection.get_connection_params()
    params.pop("cursor_factory", None), params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    # when: the next request
    connection.close_if_unusable_or_obsolete()  # request_started does it (the test client not)
    answer = client.get(URL)
    # then: served on a new connection, as Django's health check would have arranged
    assert answer.status_code == 200, answer.content
    assert connection.connection.info.backend_pid != pid


def test_i37_when_redis_cannot_be_reached_requests_are_served_and_it_is_logged(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.EFFECT_LEDGER_CACHE_URL = "redis://127.0.0.1:1/0"
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "RATE_AGENT": "1/min"}
    bot = client_of("bot")
    assert [bot.get(URL).status_code for _ in range(3)] == [200] * 3
    assert "rate limits not checked" in caplog.text


@pytest.mark.parametrize(
    ("hits", "previous", "elapsed", "expected"),
    [
        (2, 0, 10.0, 0.0),  # room in this window
        (3, 0, 10.0, 50.0 + 20.0),  # full: the next window, once 3 * (1 - t/60) <= 2
        (0, 3, 1.0, 19.0),  # the previous window weighs 3 * (1 - 1/60): wait until t = 20
        (1, 6, 30.0, 20.0),  # 6 * (1 - t/60) + 1 + 1 <= 3: t >= 50
    ],
)
def test_i37_retry_after_is_when_the_window_would_serve_the_request(
    hits: int, previous: int, elapsed: float, expected: float
) -> None:
    limit = Limit("agent:x:60", 3, 60)
    assert retry_after(limit, now=1_800_000_000.0 + elapsed, hits=hits, previous=previous) == pytest.approx(
        expected
    )


@pytest.fixture(autouse=True)
def _no_redis_script_across_urls() -> Iterator[None]:
    yield
    rate_windows._redis_script.cache_clear()
    rate_windows._redis_paused_until = 0.0


EDGE = 1_800_000_001.0  # a window's edge for a limit per second


def test_i37_a_request_that_read_its_clock_before_the_window_s_edge_does_not_reset_the_window(
    store: str,
) -> None:
    # given: 5 a second, all 5 used just before an edge, and a request refused just after it
    limit = Limit("agent:edge:1", 5, 1)
    assert [windows_check([limit], now=EDGE - 0.1 + i / 100).refused for i in range(5)] == [None] * 5
    assert windows_check([limit], now=EDGE + 0.05).refused == limit
    # when: a request that read its clock before the edge reaches the window after it moved on
    late = windows_check([limit], now=EDGE - 0.01)
    # then: counted in the stored window with the earlier five at full weight: refused, and the
    # windows are not reset (before: served, and four more after it within the same second)
    assert late.refused == limit
    assert [windows_check([limit], now=EDGE + 0.06 + i / 100).refused for i in range(4)] == [limit] * 4


def test_i37_a_request_its_tenant_refused_is_not_counted_against_its_agent(rates: Any) -> None:
    # given: 10 a minute per agent, 5 per tenant; one agent uses the tenant's 5, then is refused
    # by the tenant's limit 5 times
    rates("10/min", "5/min")
    bot = client_of("bot")
    assert [bot.get(URL).status_code for _ in range(10)] == [200] * 5 + [429] * 5
    # when: the tenant's limit is raised (the same window: the same period)
    rates("10/min", "100/min")
    # then: the agent still has its other 5 (before: the 5 refusals had used them up)
    assert [bot.get(URL).status_code for _ in range(6)] == [200] * 5 + [429]


def test_i37_deployments_sharing_one_redis_do_not_count_against_each_other(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: Redis, and an agent key that the next deployment's agent with the same id also has
    settings.EFFECT_LEDGER_CACHE_URL = redis_or_skip()
    limit = Limit("agent:1:60", 2, 60)
    assert [windows_check([limit], now=EDGE).refused for _ in range(3)] == [None, None, limit]
    # when: another deployment (another database) counts its agent 1
    monkeypatch.setattr(rate_windows, "_this_database", lambda: ("db.example", "5432", "other"))
    # then: a window of its own
    assert windows_check([limit], now=EDGE).refused is None
    assert redis_prefix(("a", "5432", "x")) != redis_prefix(("a", "5432", "y"))


def test_i37_a_hung_redis_costs_one_timeout_then_is_left_alone_for_a_while(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # given: a "Redis" that accepts connections and never answers
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    settings.EFFECT_LEDGER_CACHE_URL = f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "RATE_AGENT": "1/min"}
    bot = client_of("bot")
    try:
        # when: five requests
        answers = [bot.get(URL).status_code for _ in range(5)]
        # then: all served; Redis was tried once (one connection, one timeout), then left
        # alone for REDIS_PAUSE_SECONDS, with one warning
        listener.settimeout(0.5)
        accepted = []
        with contextlib.suppress(TimeoutError):
            while True:
                accepted.append(listener.accept()[0])
    finally:
        listener.close()
    assert answers == [200] * 5
    assert len(accepted) == 1
    assert caplog.text.count("rate limits not checked") == 1


@pytest.mark.django_db(transaction=True)
def test_i37_a_read_only_database_serves_requests_with_the_limits_unchecked(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # given: the database store, and a database that refuses writes (a standby, a demoted primary)
    settings.EFFECT_LEDGER_CACHE_URL = ""
    client = client_of("bot")
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION default_transaction_read_only = on")
    try:
        # when
        answer = client.get(URL)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION default_transaction_read_only = off")
    # then: the list is served (it only reads); the limiter's refusal is a warning, not a 500
    assert answer.status_code == 200, answer.content
    assert "rate limits not checked: the database refused" in caplog.text


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:notaport/0", "redis://127.0.0.1:6379/0?socket_timeout=abc"]
)
def test_i37_an_unusable_redis_url_stops_the_process_at_start_up(url: str) -> None:
    import subprocess
    import sys

    from django.conf import settings

    child = subprocess.run(  # noqa: S603 - this interpreter, fixed code
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=settings.BASE_DIR,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings", "EFFECT_LEDGER_CACHE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode != 0 and "EFFECT_LEDGER_CACHE_URL is not a usable Redis URL" in child.stderr
