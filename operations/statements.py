"""Several writes in one round trip: data-modifying CTEs (PostgreSQL, "WITH Queries", 7.8.4).

The hot transactions of the protocol (submit, claim, record; issue 13) each need several
writes: an intent row, an audit event, an attempt, an outcome, an outbox row. Issued one by one
through the ORM, each is its own round trip to the server. Here each write is built by the ORM
(so defaults, ``auto_now_add``, JSON adaptation and expressions stay Django's) and the writes of
one step are sent as a single statement::

    WITH s0 AS (INSERT INTO operations_attempt (...) VALUES (...) RETURNING id),
         s1 AS (INSERT INTO operations_auditevent (...) VALUES (...)),
         s2 AS (UPDATE operations_outboxmessage SET acked_at = ... WHERE ...)
    SELECT (SELECT * FROM s0 LIMIT 1)

Every sub-statement runs exactly once and sees the same snapshot (so none may read what a
sibling writes; the writes of one step touch different rows), and the statement is atomic
like any other. Constraint and trigger checks are the same as for separate statements.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, cast

from django.db import connection, models
from django.db.models.expressions import DatabaseDefault
from django.db.models.sql import InsertQuery, UpdateQuery


@dataclass(frozen=True)
class Statement:
    """One SQL statement with its parameters (``%s`` placeholders, psycopg style)."""

    sql: str
    params: tuple[Any, ...] = ()
    #: It yields one column (``RETURNING``, or a plain ``SELECT``); ``run_together`` returns
    #: its first row's value.
    returns: bool = False


def insert_statement(instance: models.Model, *, returning: str = "", on_conflict: str = "") -> Statement:
    """The ``INSERT`` the ORM would run for ``instance`` (``save(force_insert=True)``), with
    ``ON CONFLICT <on_conflict>`` and ``RETURNING <returning>`` when given. Field defaults and
    ``auto_now_add`` are applied to the instance as ``save`` would; an auto primary key is left
    to the database.

    The SQL is compiled by the ORM once per model and shape (which columns take the database's
    default) and reused (issue 37: compiling it was a tenth of a submit's time); the parameters
    are each field's ``get_db_prep_save`` of its ``pre_save`` value, as the ORM's compiler makes
    them. A value that is any other expression is compiled by the ORM every time."""
    model = type(instance)
    fields = _insert_fields(model)
    values = [field.pre_save(instance, True) for field in fields]
    defaults = tuple(isinstance(value, DatabaseDefault) for value in values)
    cacheable = all(
        default or not hasattr(value, "resolve_expression")
        for value, default in zip(values, defaults, strict=True)
    )
    key = (model, defaults)
    sql = _INSERT_SQL.get(key) if cacheable else None
    if sql is None:
        sql, params = _orm_insert(instance, fields)
        if cacheable:
            _INSERT_SQL[key] = sql
    else:
        params = tuple(
            field.get_db_prep_save(value, connection=connection)
            for field, value, default in zip(fields, values, defaults, strict=True)
            if not default
        )
    if on_conflict:
        sql = f"{sql} ON CONFLICT {on_conflict}"
    return Statement(f"{sql} RETURNING {returning}" if returning else sql, tuple(params), bool(returning))


#: ``insert_statement``'s compiled SQL by (model, which fields take the database's default).
_INSERT_SQL: dict[tuple[type[models.Model], tuple[bool, ...]], str] = {}


@cache
def _insert_fields(model: type[models.Model]) -> list[models.Field[Any, Any]]:
    return [
        f
        for f in model._meta.local_concrete_fields
        if not f.generated and not (f.primary_key and isinstance(f, models.AutoField))
    ]


def _orm_insert(instance: models.Model, fields: list[models.Field[Any, Any]]) -> tuple[str, tuple[Any, ...]]:
    """The ORM's own compilation of the ``INSERT`` of ``instance`` (it calls ``pre_save`` again)."""
    query = InsertQuery(type(instance))
    query.insert_values(fields, [instance])
    ((sql, params),) = query.get_compiler(connection=connection).as_sql()
    return sql, tuple(params)


def update_statement(
    queryset: models.QuerySet[Any], values: dict[str, Any], *, returning: str = ""
) -> Statement:
    """The ``UPDATE`` that ``queryset.update(**values)`` would run, with ``RETURNING`` when
    given (columns of the queryset's table, unqualified or qualified by its name)."""
    query = cast(UpdateQuery, queryset.query.chain(UpdateQuery))
    query.add_update_values(values)
    compiler = query.get_compiler(queryset.db)
    compiler.pre_sql_setup()
    sql, params = compiler.as_sql()
    return Statement(f"{sql} RETURNING {returning}" if returning else sql, tuple(params), bool(returning))


def run_together(*statements: Statement) -> list[Any]:
    """Run ``statements`` as one statement (one round trip). Returns, for each statement with
    ``returns``, in order, the first column of its first ``RETURNING`` row (None when it
    returned no row).

    Call inside the caller's transaction when the writes must commit with earlier ones.
    """
    if not statements:
        return []
    parts = [f"s{i} AS ({statement.sql})" for i, statement in enumerate(statements)]
    selected = [
        f"(SELECT * FROM s{i} LIMIT 1)" for i, statement in enumerate(statements) if statement.returns
    ]
    sql = f"WITH {', '.join(parts)} SELECT {', '.join(selected) or 'NULL'}"
    params = tuple(p for statement in statements for p in statement.params)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return list(row) if selected else []
