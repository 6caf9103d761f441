"""Issue 12, item 1 and case C14: sign-in protection that cannot be side-stepped.

A lock is counted under the name the login form reaches (stripped, NFKC, case-folded), lives in
the database (django-axes), and guards the admin's login form as well as the console's.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.cache import cache
from django.db import connection
from django.test import Client, RequestFactory
from django.urls import reverse

from console.signin import client_ip, lockout_key
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

RIGHT = "correct horse battery"


def _fail(client: Client, url: str, username: str, times: int) -> None:
    for _ in range(times):
        response = client.post(url, {"username": username, "password": "wrong"})
        assert response.status_code in (200, 429)


def _signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


@pytest.fixture
def operator(db: Any) -> Any:
    return UserFactory(username="operator", groups=["operator", "approver"], is_staff=True, is_superuser=True)


@pytest.mark.parametrize(
    "spelling",
    [" operator", "operator ", "ｏｐｅｒａｔｏｒ", "Operator", "OPERATOR"],
    ids=["leading-space", "trailing-space", "fullwidth", "capitalised", "upper-case"],
)
def test_c14_a_lock_holds_under_every_spelling_that_reaches_the_account(
    operator: Any, settings: Any, spelling: str
) -> None:
    # given: operator locked by wrong passwords under its plain name
    client = Client()
    _fail(client, reverse("login"), "operator", settings.AXES_FAILURE_LIMIT)
    # when: the right password under another spelling
    response = client.post(reverse("login"), {"username": spelling, "password": RIGHT})
    # then: refused with the lock, not signed in
    assert response.status_code == 429
    assert b"Too many failed sign-ins" in response.content
    assert not _signed_in(client)


def test_c14_failures_under_different_spellings_add_up_to_one_lock(operator: Any, settings: Any) -> None:
    client = Client()
    spellings = [" operator", "ｏｐｅｒａｔｏｒ", "Operator", "operator ", "OPERATOR"]
    for spelling in spellings[: settings.AXES_FAILURE_LIMIT]:
        client.post(reverse("login"), {"username": spelling, "password": "wrong"})
    response = client.post(reverse("login"), {"username": "operator", "password": RIGHT})
    assert response.status_code == 429 and not _signed_in(client)
    assert set(AccessAttempt.objects.values_list("username", flat=True)) == {"operator"}


def test_c14_the_admin_login_is_locked_too(operator: Any, settings: Any) -> None:
    # given: wrong passwords on the admin's own login form
    client = Client()
    _fail(client, reverse("admin:login"), "operator", settings.AXES_FAILURE_LIMIT)
    # when: the right password there
    response = client.post(reverse("admin:login"), {"username": "operator", "password": RIGHT})
    # then
    assert response.status_code == 429 and not _signed_in(client)
    assert client.get(reverse("admin:index")).status_code == 302


def test_c14_one_lock_for_both_forms(operator: Any, settings: Any) -> None:
    # locked through the console's form, refused on the admin's
    client = Client()
    _fail(client, reverse("login"), " operator", settings.AXES_FAILURE_LIMIT)
    response = client.post(reverse("admin:login"), {"username": "ｏｐｅｒａｔｏｒ", "password": RIGHT})
    assert response.status_code == 429 and not _signed_in(client)


def test_c14_the_lock_survives_a_restart_and_holds_in_another_process(operator: Any, settings: Any) -> None:
    # given: a lock, then everything a process keeps in memory is gone (the cache, a new client)
    _fail(Client(), reverse("login"), "operator", settings.AXES_FAILURE_LIMIT)
    cache.clear()
    # when: another "process" (a fresh client, nothing shared but the database) tries
    response = Client().post(reverse("login"), {"username": "operator", "password": RIGHT})
    # then: the database row holds the lock
    assert response.status_code == 429
    assert AccessAttempt.objects.get(username="operator").failures_since_start >= settings.AXES_FAILURE_LIMIT


def test_c14_the_lock_ends_after_the_cool_off(operator: Any, settings: Any, time_machine: Any) -> None:
    time_machine.move_to("2026-12-01 10:00:00+00:00", tick=False)
    client = Client()
    _fail(client, reverse("login"), "operator", settings.AXES_FAILURE_LIMIT)
    assert client.post(reverse("login"), {"username": "operator", "password": RIGHT}).status_code == 429
    time_machine.move_to("2026-12-01 10:16:00+00:00", tick=False)
    response = client.post(reverse("login"), {"username": "operator", "password": RIGHT})
    assert response.status_code == 302 and _signed_in(client)


def test_c14_one_address_spraying_many_accounts_is_locked(db: Any, settings: Any) -> None:
    # given: twenty users, each tried once with a wrong password from one address
    settings.EFFECT_LEDGER_SIGNIN_ADDRESS_FAILURES = 6
    UserFactory(username="carol", groups=["viewer"])
    client = Client()
    for n in range(settings.EFFECT_LEDGER_SIGNIN_ADDRESS_FAILURES):
        client.post(reverse("login"), {"username": f"someone{n}", "password": "wrong"})
    # when: a real account from the same address
    response = client.post(reverse("login"), {"username": "carol", "password": RIGHT})
    # then: the address is locked; another address is not
    assert response.status_code == 429 and not _signed_in(client)
    other = Client(REMOTE_ADDR="192.0.2.7")
    assert other.post(reverse("login"), {"username": "carol", "password": RIGHT}).status_code == 302


def test_c14_a_lock_on_one_address_leaves_the_account_open_from_another(operator: Any, settings: Any) -> None:
    # the pair is locked, not the account: an attacker cannot lock the operator out everywhere
    _fail(Client(), reverse("login"), "operator", settings.AXES_FAILURE_LIMIT)
    other = Client(REMOTE_ADDR="192.0.2.7")
    assert other.post(reverse("login"), {"username": "operator", "password": RIGHT}).status_code == 302


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (" operator", "operator"),
        ("ｏｐｅｒａｔｏｒ", "operator"),
        ("Ｏperator\t", "operator"),
        ("", ""),
        (None, ""),
    ],
)
def test_c14_lockout_key_is_the_normalised_case_folded_name(raw: Any, key: str) -> None:
    assert lockout_key(raw) == key


def test_c14_a_name_that_folds_longer_than_axes_stores_is_counted_not_a_500(db: Any, settings: Any) -> None:
    # given: a 150-character name (the form's limit) that case-folds to 450 code points
    name = "\u0390" * 150  # GREEK SMALL LETTER IOTA WITH DIALYTIKA AND TONOS: folds to 3 code points
    UserFactory(username=name, groups=["viewer"])
    client = Client()
    # when / then: failures are recorded and lock as for any name
    _fail(client, reverse("login"), name, settings.AXES_FAILURE_LIMIT)
    assert client.post(reverse("login"), {"username": name, "password": RIGHT}).status_code == 429


@pytest.mark.parametrize(
    ("proxies", "forwarded", "expected"),
    [
        (0, "203.0.113.9", "10.0.0.1"),  # no proxy configured: the header is anyone's to write
        (1, "203.0.113.9", "203.0.113.9"),
        (1, "6.6.6.6, 203.0.113.9", "203.0.113.9"),  # the client's own entry is not believed
        (2, "6.6.6.6, 203.0.113.9, 10.0.0.2", "203.0.113.9"),
        (2, "203.0.113.9", "10.0.0.1"),  # did not pass both proxies
        (1, "not-an-address", "10.0.0.1"),
        (1, "", "10.0.0.1"),
        (1, "2001:db8::1", "2001:db8::1"),
        (1, "203.0.113.9:51234", "203.0.113.9"),  # a port some proxies append
        (1, "[2001:db8::1]:443", "2001:db8::1"),
        (1, "::ffff:203.0.113.9", "203.0.113.9"),  # IPv4-mapped: one client, one lock
    ],
)
def test_c14_the_address_behind_trusted_proxies(
    settings: Any, proxies: int, forwarded: str, expected: str
) -> None:
    settings.EFFECT_LEDGER_PROXY_COUNT = proxies
    request = RequestFactory().post("/login/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR=forwarded)
    assert client_ip(request) == expected


def test_c14_behind_a_proxy_one_client_cannot_lock_the_others(db: Any, settings: Any) -> None:
    # given: every request arrives from the proxy's address, the client in X-Forwarded-For
    settings.EFFECT_LEDGER_PROXY_COUNT = 1
    settings.EFFECT_LEDGER_SIGNIN_ADDRESS_FAILURES = 6
    UserFactory(username="carol", groups=["viewer"])
    attacker = Client(REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.66")
    for n in range(settings.EFFECT_LEDGER_SIGNIN_ADDRESS_FAILURES + 2):
        attacker.post(reverse("login"), {"username": f"someone{n}", "password": "wrong"})
    assert attacker.post(reverse("login"), {"username": "carol", "password": RIGHT}).status_code == 429
    # when: another client through the same proxy
    colleague = Client(REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.7")
    # then
    assert colleague.post(reverse("login"), {"username": "carol", "password": RIGHT}).status_code == 302


@pytest.mark.django_db(transaction=True)
def test_c14_concurrent_guesses_cannot_pass_the_lock_together(settings: Any, monkeypatch: Any) -> None:
    # given: every password check is counted
    UserFactory(username="racer", groups=["viewer"])
    checks: list[str] = []
    original = AbstractBaseUser.check_password

    def counted(user: Any, raw_password: str) -> bool:
        checks.append(raw_password)
        return original(user, raw_password)

    monkeypatch.setattr(AbstractBaseUser, "check_password", counted)
    guesses = 12
    barrier = threading.Barrier(guesses)

    def guess(n: int) -> int:
        client = Client()
        barrier.wait()
        try:
            return client.post(reverse("login"), {"username": "racer", "password": f"wrong-{n}"}).status_code
        finally:
            connection.close()

    # when: twelve wrong passwords for one account from one address, all sent at once
    with ThreadPoolExecutor(max_workers=guesses) as pool:
        statuses = sorted(pool.map(guess, range(guesses)))
    # then: only the limit's worth of passwords were tried; every later guess met the lock
    assert len(checks) == settings.AXES_FAILURE_LIMIT, statuses
    assert statuses.count(200) == settings.AXES_FAILURE_LIMIT - 1
    assert statuses.count(429) == guesses - statuses.count(200)
