"""Named leases (operations.services.leases), the replacement of session advisory locks that a
pooler in transaction mode leaves on a pooled connection (issue 35), the listener's connection
and the pool-mode setting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from operations.api import listener
from operations.models import Lease
from operations.selectors.leases import lease_held
from operations.services.leases import lease_acquire, lease_release, lease_renew, lease_try_acquire

pytestmark = pytest.mark.django_db

BASE_DIR = Path(__file__).resolve().parents[2]


def test_i35_a_lease_has_one_holder_until_released() -> None:
    # given
    first = lease_try_acquire(name="job", ttl_seconds=30)
    # when
    second = lease_try_acquire(name="job", ttl_seconds=30)
    # then
    assert first is not None and second is None and lease_held(name="job")
    assert lease_renew(first, ttl_seconds=30)
    assert lease_release(first)
    assert not lease_held(name="job")
    assert lease_try_acquire(name="job", ttl_seconds=30) is not None


def test_i35_a_dead_holders_lease_is_taken_over_once_it_expired() -> None:
    # given: a holder that died, its lease expired a second ago
    dead = lease_try_acquire(name="pass", ttl_seconds=30)
    assert dead is not None
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE operations_lease SET expires_at = now() - interval '1 second' WHERE name = 'pass'"
        )
    # when
    taker = lease_try_acquire(name="pass", ttl_seconds=30)
    # then: the new claim holds it; the dead one can neither renew nor release it
    assert taker is not None and taker.holder != dead.holder
    assert not lease_renew(dead, ttl_seconds=30)
    assert not lease_release(dead)
    assert Lease.objects.get(name="pass").holder == taker.holder


def test_i35_waiting_for_a_lease_is_bounded() -> None:
    # given
    held = lease_try_acquire(name="sign-in|x|127.0.0.1", ttl_seconds=30)
    assert held is not None
    # when / then: the wait gives up after its bound instead of hanging
    assert lease_acquire(name="sign-in|x|127.0.0.1", ttl_seconds=30, wait_seconds=0.2) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "", "ttl_seconds": 1}, "1 to 600 characters"),
        ({"name": "x" * 601, "ttl_seconds": 1}, "1 to 600 characters"),
        ({"name": "x", "ttl_seconds": 0}, "more than 0"),
        ({"name": "x", "ttl_seconds": float("nan")}, "more than 0"),
        ({"name": "x", "ttl_seconds": 8 * 86400}, "less than 7 days"),
    ],
)
def test_i35_bad_lease_input_is_refused_clearly(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        lease_try_acquire(**kwargs)
    assert not Lease.objects.exists()


def test_i35_the_listener_connects_to_the_listen_url_and_never_prepares(settings: Any) -> None:
    # given: the ledger behind a pooler, and a direct URL for the listener
    settings.DATABASE_POOL_MODE = "transaction"
    settings.DATABASE_LISTEN_URL = "postgres://listener:s3cret@db.internal:5433/ledger?sslmode=require"
    # when
    params = listener.listener_connection_params()
    # then
    assert (params["host"], params["port"], params["dbname"], params["user"]) == (
        "db.internal",
        5433,
        "ledger",
        "listener",
    )
    assert params["password"] == "s3cret" and params["sslmode"] == "require"
    assert "prepare_threshold" in params and params["prepare_threshold"] is None
    assert listener.listener_fallback_reason() is None


def test_i35_without_a_listen_url_the_direct_listener_still_never_prepares(settings: Any) -> None:
    settings.DATABASE_POOL_MODE = "direct"
    settings.DATABASE_LISTEN_URL = ""
    params = listener.listener_connection_params()
    assert params["dbname"] == connection.settings_dict["NAME"]
    assert "prepare_threshold" in params and params["prepare_threshold"] is None


def test_i35_transaction_pool_mode_without_a_listen_url_is_the_polling_fallback(settings: Any) -> None:
    settings.DATABASE_POOL_MODE = "transaction"
    settings.DATABASE_LISTEN_URL = ""
    reason = listener.listener_fallback_reason()
    assert reason is not None and "DATABASE_LISTEN_URL" in reason and "once a second" in reason


def _settings_in_a_child(**environ: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'console.settings'; django.setup(); "
        "from django.conf import settings as s; "
        "print(s.DATABASE_POOL_MODE, s.DATABASES['default']['DISABLE_SERVER_SIDE_CURSORS'])"
    )
    return subprocess.run(  # noqa: S603 - this interpreter, fixed code
        [sys.executable, "-c", code],
        cwd=BASE_DIR,
        env={**os.environ, **environ},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_i35_transaction_pool_mode_turns_server_side_cursors_off() -> None:
    assert _settings_in_a_child(DATABASE_POOL_MODE="transaction").stdout.split() == ["transaction", "True"]
    assert _settings_in_a_child(DATABASE_POOL_MODE="").stdout.split() == ["direct", "False"]


def test_i35_an_unknown_pool_mode_refuses_to_start() -> None:
    child = _settings_in_a_child(DATABASE_POOL_MODE="statement")
    assert child.returncode != 0
    assert "DATABASE_POOL_MODE must be direct or transaction, got 'statement'" in child.stderr


@pytest.mark.parametrize(
    "value", ["not a url at all", "postgres://postgres@127.0.0.1:5432/", "mysql://user@host/db"]
)
def test_i35_a_malformed_listen_url_refuses_to_start_naming_the_variable(value: str) -> None:
    child = _settings_in_a_child(DATABASE_LISTEN_URL=value)
    assert child.returncode != 0
    assert "DATABASE_LISTEN_URL must be a postgres:// URL with a database name" in child.stderr
    assert value not in child.stderr or not value.startswith("postgres")  # never echoes a credential


def test_i35_a_well_formed_listen_url_is_accepted() -> None:
    child = _settings_in_a_child(DATABASE_LISTEN_URL="postgres://postgres@127.0.0.1:5432/effect_ledger")
    assert child.returncode == 0, child.stderr
