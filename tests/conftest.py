"""Shared fixtures. The database is real PostgreSQL: ``DATABASE_URL`` when set, else the
embedded server under ``./.data/pg`` (see console/settings.py)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

# Counters of this test session (and the worker processes it starts) go to their own folder,
# never into a running quickstart's.
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="el-metrics-"))
# The tests run against the sandbox provider: its actions are served here and in every process
# the tests start (console/settings_ledger.py EFFECT_LEDGER_SANDBOX; off in production, issue 33 item 6).
os.environ.setdefault("EFFECT_LEDGER_SANDBOX", "1")

import pytest
from django.conf import settings as django_settings
from django.db.backends.postgresql.operations import DatabaseOperations
from rest_framework.test import APIClient

from tests.factories import UserFactory, make_agent

# pytest-django may have read the settings before this file: turn the sandbox on there too.
django_settings.EFFECT_LEDGER_SANDBOX = True


@pytest.fixture(autouse=True, scope="session")
def _flush_past_the_audit_triggers() -> Any:
    """Let the test flush empty the append-only audit table.

    ``transaction=True`` tests end with Django's flush, one ``TRUNCATE`` of every table, which
    the audit table's ``BEFORE TRUNCATE`` trigger refuses (migration 0011). The flush runs in
    one transaction; ``SET LOCAL session_replication_role = replica`` (superuser only, as the
    test database's role is) turns ordinary triggers off for that transaction alone. The
    product's trigger keeps no escape hatch of its own, and the tests that TRUNCATE on purpose
    see it fire.
    """
    original = DatabaseOperations.execute_sql_flush

    def execute_sql_flush(self: DatabaseOperations, sql_list: list[str]) -> None:
        original(self, ["SET LOCAL session_replication_role = replica", *sql_list])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DatabaseOperations, "execute_sql_flush", execute_sql_flush)
        yield


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Any:
    """pytest-django's test database, and at its end the test run's sandbox database
    (``<test database>_sandbox``, created by whatever started a sandbox provider) dropped with it."""
    from django.db import connection

    from console.lab.sandbox_provider.database import default_dsn, drop_database, dsn_from_settings_dict

    yield
    with django_db_blocker.unblock():
        drop_database(
            default_dsn(connection.settings_dict), admin_dsn=dsn_from_settings_dict(connection.settings_dict)
        )


@pytest.fixture(autouse=True)
def _no_tokens_verified_before() -> None:
    # Each test starts with an empty token cache (operations.api.authentication).
    from operations.api.authentication import forget_verified_tokens

    forget_verified_tokens()


@pytest.fixture(autouse=True)
def _own_checkpoint_file(settings: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each test its own audit checkpoint file: the file is compared with the database
    (``operations.restore.check``), so one shared by every test database would be another
    ledger's file, or worse, look like a restore."""
    path = tmp_path_factory.mktemp("checkpoints") / "audit-checkpoints.jsonl"
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "AUDIT_CHECKPOINT_FILE": str(path)}


#: Where tests that start no sandbox provider send its calls: a closed port. The default
#: (127.0.0.1:8765) is where a quick start's sandbox listens; a test must not talk to it.
NO_SANDBOX_URL = "http://127.0.0.1:9"


@pytest.fixture(autouse=True)
def _no_default_sandbox(settings: Any) -> None:
    """Each test's sandbox provider URL is a closed port unless it starts one (the ``sandbox``
    fixture points the setting at it): a quick start running beside the tests (the README's two
    terminals) must not answer their lookups."""
    settings.SANDBOX_PROVIDER_URL = NO_SANDBOX_URL


@pytest.fixture
def agent_token(db: Any) -> str:
    """The bearer token of agent ``agent-1`` in tenant ``acme``."""
    _, token = make_agent()
    return token


@pytest.fixture
def api(agent_token: str) -> APIClient:
    """An API client authenticated as ``agent:agent-1`` of tenant ``acme``."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {agent_token}")
    return client


@pytest.fixture
def approver(db: Any) -> Any:
    """A console user in the approver group."""
    return UserFactory(username="alice", groups=["approver"])


@pytest.fixture
def second_approver(db: Any) -> Any:
    """Another approver, for four-eyes and two-approver rules."""
    return UserFactory(username="bob", groups=["approver"])


from tests.support.fake_provider import fake_provider  # noqa: E402, F401
from tests.support.pgbouncer import pgbouncer  # noqa: E402, F401
from tests.support.processes import sandbox, sandbox_provider  # noqa: E402, F401
from tests.support.stripe_server import localstripe, localstripe_server  # noqa: E402, F401
from tests.support.webhook_receiver import receiver  # noqa: E402, F401
from tests.support.workers import cluster  # noqa: E402, F401


@pytest.fixture(autouse=True)
def _no_status_listener_left() -> Any:
    """Stop the intent status listener after any test that started it (a wait through the API,
    e.g. under ``live_server``): its connection would keep the test database from being dropped."""
    yield
    from operations.api import waiting

    waiting.stop_status_listener()


@pytest.fixture
def status_listener() -> Any:
    """This process's intent status listener (``operations.api.waiting``), started, and stopped after
    the test so that its connection never outlives the test database."""
    from operations.api import waiting

    yield waiting.status_listener()
    waiting.stop_status_listener()
