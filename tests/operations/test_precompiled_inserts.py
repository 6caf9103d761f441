"""Issue 37: the protocol's INSERTs are compiled by the ORM once per model and shape and reused
(``operations.statements.insert_statement``). Each one the happy path sends, for every provider
kind, must be the statement the ORM compiles for that instance, parameters included."""

from __future__ import annotations

import copy
import datetime
import importlib
import uuid
from typing import Any

import pytest

from operations import statements
from tests.operations.test_round_trips import SANDBOX_ACTIONS, _submit
from tests.support.fake_provider import FakeProvider, fake_provider  # noqa: F401
from tests.support.processes import sandbox, sandbox_provider  # noqa: F401

#: Every module that builds INSERTs with ``insert_statement``.
USERS = [
    "operations.audit.trail",
    "operations.services.ceilings",
    "operations.services.claims",
    "operations.services.execution",
    "operations.services.notifications",
    "operations.services.submission",
    "operations.services.transitions",
]
NOW = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)


def _plain(value: Any) -> Any:
    return getattr(value, "obj", value)  # psycopg's Jsonb wrapper compares by its object


@pytest.fixture
def compared(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every ``insert_statement`` call, checked against the ORM's own compilation of a copy of
    the instance taken before the call; returns the models checked (the clock held still, so
    ``auto_now_add`` gives both the same time)."""
    from django.utils import timezone

    monkeypatch.setattr(timezone, "now", lambda: NOW)
    real, seen = statements.insert_statement, []

    def checked(instance: Any, **options: Any) -> statements.Statement:
        twin = copy.deepcopy(instance)
        made = real(instance, **options)
        sql, params = statements._orm_insert(twin, statements._insert_fields(type(twin)))
        assert made.sql.startswith(sql), (made.sql, sql)
        assert [_plain(p) for p in made.params] == [_plain(p) for p in params], type(instance)
        seen.append(type(instance).__name__)
        return made

    for name in USERS:
        module = importlib.import_module(name)
        if hasattr(module, "insert_statement"):
            monkeypatch.setattr(module, "insert_statement", checked)
    return seen


def _client() -> Any:
    from rest_framework.test import APIClient

    from tests.factories import make_agent

    _, token = make_agent(f"agent-{uuid.uuid4().hex[:8]}")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _run(action: str, arguments: dict[str, Any], *, times: int = 2, client: Any = None) -> None:
    from operations.engine.protocol import execute_intent

    client = client or _client()
    for _ in range(times):  # the first compiles, the second reuses
        assert execute_intent(_submit(client, action, arguments)) == "succeeded"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("action", "arguments"), SANDBOX_ACTIONS)
def test_i37_every_precompiled_insert_of_the_happy_path_is_the_orm_s_own(
    sandbox: Any,  # noqa: F811
    compared: list[str],
    action: str,
    arguments: dict[str, Any],
) -> None:
    _run(action, arguments)
    assert {"Intent", "AuditEvent", "Attempt"} <= set(compared), compared


@pytest.mark.django_db(transaction=True)
def test_i37_the_generic_http_adapter_s_inserts_are_the_orm_s_own(
    fake_provider: FakeProvider,  # noqa: F811
    compared: list[str],
    settings: Any,
) -> None:
    settings.EFFECT_LEDGER_GENERIC_HTTP = {"acme.transfer": {"url": f"{fake_provider.url}/v1/transfers"}}
    _run("acme.transfer", {"amount": 1200, "currency": "EUR", "account": "acc_9"})
    assert {"Intent", "AuditEvent", "Attempt"} <= set(compared), compared


@pytest.mark.django_db(transaction=True)
def test_i37_after_the_first_intent_a_submit_and_its_execution_compile_no_insert(
    sandbox: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.db.models.sql.compiler import SQLInsertCompiler

    # given: one intent through (its INSERTs compiled)
    arguments = {"amount": 1200, "currency": "EUR", "customer": "c"}
    client = _client()
    _run("payments.charge", arguments, times=1, client=client)
    compiled: list[str] = []
    as_sql = SQLInsertCompiler.as_sql

    def counted(self: SQLInsertCompiler, *args: Any, **kwargs: Any) -> Any:
        compiled.append(self.query.model.__name__)
        return as_sql(self, *args, **kwargs)

    monkeypatch.setattr(SQLInsertCompiler, "as_sql", counted)
    # when: the next one is submitted and executed
    _run("payments.charge", arguments, times=1, client=client)
    # then: the ORM compiled no INSERT (before issue 37: every one, every time)
    assert compiled == []
