"""The API's rate limits (issue 18, item 7): per agent and per tenant, on the cache every web
process shares, answered 429 with Retry-After. Two real web processes: tests/e2e/test_rate_limits.py."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import caches
from rest_framework.test import APIClient

from console.settings_ledger import _rate
from operations.api.rates import rate_parse
from operations.api.throttling import THROTTLE_CACHE
from tests.factories import make_agent

pytestmark = pytest.mark.django_db

URL = "/api/v1/intents"


@pytest.fixture
def rates(settings: Any) -> Any:
    """Set the limits (and start from empty windows)."""
    caches[THROTTLE_CACHE].clear()

    def set_rates(agent: str | None, tenant: str | None) -> None:
        settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "RATE_AGENT": agent, "RATE_TENANT": tenant}

    return set_rates


def client_of(name: str, tenant: str = "acme") -> APIClient:
    _, token = make_agent(name, tenant)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def assert_throttled(response: Any) -> None:
    assert response.status_code == 429, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert 1 <= int(response["Retry-After"]) <= 60
    problem = response.json()
    assert (problem["status"], problem["code"]) == (429, "rate-limited")


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
