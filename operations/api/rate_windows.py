"""The API's rate-limit windows: a sliding-window counter per limit, checked and counted in one
round trip to the store every web process shares (issue 37: the throttle off the database's hot
path).

The counter (the "sliding window counter" of Cloudflare's rate limiting, 2017): each key keeps
the requests served in the current fixed window of ``period`` seconds and in the one before; a
request at ``elapsed`` seconds into the window is served when
``previous * (1 - elapsed / period) + hits + 1 <= requests``. It never lets twice the limit
through across a window boundary, as a fixed window does, and costs one row (or hash) per key
instead of DRF's list of every request's time. A refused request is not counted, so an agent
that keeps retrying is served again as soon as its earlier requests age out.

Every limit of a request is checked before any is counted: a request is counted under all of
its limits or under none, so a request its agent's limit refused is not counted against its
tenant's, nor one its tenant's limit refused against its agent's.

Two stores, one rule:

- ``postgres_check``: one call of the database function ``effect_ledger_rate_check``
  (migration 0037, where the rule is spelt out) on the UNLOGGED table ``operations_ratewindow``:
  row locks make concurrent requests count exactly, and no write-ahead log means no disk flush
  per request. The call also stands in for the request's connection health check
  (``first_statement``).
- ``redis_check``: one ``EVALSHA`` of the Lua script ``_LUA`` (atomic on the server), when
  ``EFFECT_LEDGER_CACHE_URL`` names a Redis; keys are namespaced by the deployment's database.

Times are Unix seconds from the web process's clock. A key whose stored window is later than a
request's clock says (the request read its clock just before the window's edge, or its
process's clock is behind) is counted in the stored window, never reset backwards.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limit:
    """At most ``requests`` requests per ``period`` seconds for ``key`` (``scope:ident:period``)."""

    key: str
    requests: int
    period: int


@dataclass(frozen=True)
class Verdict:
    """The check's answer: ``refused`` is the first limit that refused the request (None: served
    and counted under every limit), ``retry_after`` the seconds until that limit would serve it."""

    refused: Limit | None = None
    retry_after: float = 0.0


def window_of(limit: Limit, now: float) -> tuple[int, float]:
    """The start (Unix seconds) of ``limit``'s current window at ``now``, and the weight of the
    window before it (1 at the start, 0 at the end)."""
    start = int(now // limit.period) * limit.period
    return start, 1.0 - (now - start) / limit.period


def retry_after(limit: Limit, *, now: float, hits: int, previous: int) -> float:
    """Seconds from ``now`` until a request would be served under ``limit``, when the current
    window holds ``hits`` served requests and the one before ``previous`` (no others arriving)."""
    start, _ = window_of(limit, now)
    period, room = limit.period, limit.requests - 1
    if hits > room:
        # not in this window: in the next one, once these hits, now the previous window's, weigh less
        later = period * max(0.0, 1.0 - room / hits)
        return (start + period - now) + later
    if previous == 0:
        return 0.0
    at = period * (1.0 - (room - hits) / previous)  # seconds into this window
    return max(0.0, start + at - now)


def _verdict(limits: Sequence[Limit], refused: int, hits: int, previous: int, now: float) -> Verdict:
    """The verdict of a store's answer: ``refused`` is the 1-based position of the refusing limit
    (0: served), ``hits`` and ``previous`` its counts then."""
    if not refused:
        return Verdict()
    limit = limits[refused - 1]
    return Verdict(limit, retry_after(limit, now=now, hits=int(hits), previous=int(previous)))


#: The one statement of ``postgres_check``: the database function of migration 0037.
POSTGRES_STATEMENT = (
    "SELECT refused, hits, previous FROM effect_ledger_rate_check("
    "%s::text[], %s::bigint[], %s::integer[], %s::double precision[], %s::integer[])"
)


def postgres_check(limits: Sequence[Limit], *, now: float) -> Verdict:
    """Check and count ``limits`` (in order) in PostgreSQL: one call of the function
    ``effect_ledger_rate_check`` (migration 0037, where the rule is spelt out), autocommit.

    Raises:
        django.db.DatabaseError: the database refused or is unreachable.
    """
    if not limits:
        return Verdict()
    windows = [window_of(limit, now) for limit in limits]
    params = [
        [limit.key for limit in limits],
        [start for start, _ in windows],
        [limit.period for limit in limits],
        [weight for _, weight in windows],
        [limit.requests for limit in limits],
    ]
    refused, hits, previous = first_statement(POSTGRES_STATEMENT, params)
    return _verdict(limits, refused, hits, previous, now)


def first_statement(sql: str, params: Sequence[Any]) -> tuple[Any, ...]:
    """Run ``sql`` (one row back) as a request's first statement, standing in for Django's
    connection health check (``CONN_HEALTH_CHECKS``, a ``SELECT 1`` before the request's first
    query on a reused connection): when that check is due, it is marked done and ``sql`` runs
    instead; if the connection turns out dead (``OperationalError``/``InterfaceError``), it is
    closed and ``sql`` runs once more on a new one, as the health check would have arranged. So
    the limiter costs the request no statement and no commit beyond the check it replaces."""
    # The attributes Django's BaseDatabaseWrapper keeps for the check (not in its type stubs).
    wrapper: Any = connection
    due = (
        wrapper.connection is not None
        and wrapper.health_check_enabled
        and not wrapper.health_check_done
        and not wrapper.in_atomic_block
    )
    if due:
        wrapper.health_check_done = True
        try:
            return _fetch_one(sql, params)
        except (OperationalError, InterfaceError):
            connection.close()
    return _fetch_one(sql, params)


def _fetch_one(sql: str, params: Sequence[Any]) -> tuple[Any, ...]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row: tuple[Any, ...] = cursor.fetchone()
    return row


# KEYS: the limits' keys, in order. ARGV: now, then requests and period per key. The same rule
# as the database function of migration 0037: every limit checked first (rolled to the current
# window; a key already in a later window keeps it, the previous one at full weight), nothing
# counted if one refuses; returns {refused (1-based, 0: served), its hits, its previous}.
_LUA = """
local now = tonumber(ARGV[1])
local starts, hits, previous = {}, {}, {}
for i, key in ipairs(KEYS) do
  local requests, period = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local start = math.floor(now / period) * period
  local weight = 1 - (now - start) / period
  local row = redis.call('HMGET', key, 'start', 'hits', 'previous')
  local was = tonumber(row[1])
  if was and was >= start then
    if was > start then weight = 1 end
    starts[i], hits[i], previous[i] = was, tonumber(row[2]), tonumber(row[3])
  elseif was == start - period then
    starts[i], hits[i], previous[i] = start, 0, tonumber(row[2])
  else
    starts[i], hits[i], previous[i] = start, 0, 0
  end
  if previous[i] * weight + hits[i] + 1 > requests then
    return {i, hits[i], previous[i]}
  end
end
for i, key in ipairs(KEYS) do
  redis.call('HSET', key, 'start', starts[i], 'hits', hits[i] + 1, 'previous', previous[i])
  redis.call('EXPIRE', key, 2 * tonumber(ARGV[2 * i + 1]))
end
return {0, 0, 0}
"""


#: Seconds Redis may take to connect and to answer before the limits are left unchecked.
REDIS_TIMEOUT_SECONDS = 0.25
#: After Redis failed, this process does not ask it again for this many seconds: requests are
#: served unchecked meanwhile (one warning per pause), so a hung Redis costs one timeout, not one
#: per request.
REDIS_PAUSE_SECONDS = 10.0
_redis_paused_until = 0.0


@cache
def _redis_script(url: str) -> Any:
    import redis

    client = redis.Redis.from_url(
        url, socket_timeout=REDIS_TIMEOUT_SECONDS, socket_connect_timeout=REDIS_TIMEOUT_SECONDS
    )
    return client.register_script(_LUA)


@cache
def redis_prefix(database: tuple[str, str, str]) -> str:
    """The prefix of this deployment's keys: ``effect-ledger:<digest>:rate:``, the digest naming
    its database (host, port, name), so deployments sharing one Redis never count against each
    other's agents (whose ids restart at 1 in each database)."""
    digest = hashlib.sha256("\x00".join(database).encode()).hexdigest()[:16]
    return f"effect-ledger:{digest}:rate:"


def _this_database() -> tuple[str, str, str]:
    conf = connection.settings_dict
    return (str(conf.get("HOST") or ""), str(conf.get("PORT") or ""), str(conf["NAME"]))


def redis_check(limits: Sequence[Limit], *, now: float) -> Verdict:
    """Check and count ``limits`` (in order) in Redis, one ``EVALSHA`` (``EVAL`` the first time)
    of the script ``_LUA``, atomic on the server.

    Raises:
        redis.RedisError: Redis refused, is unreachable or did not answer in time.
    """
    if not limits:
        return Verdict()
    args: list[Any] = [repr(now)]
    for limit in limits:
        args += [limit.requests, limit.period]
    prefix = redis_prefix(_this_database())
    keys = [prefix + limit.key for limit in limits]
    refused, hits, previous = _redis_script(settings.EFFECT_LEDGER_CACHE_URL)(keys=keys, args=args)
    return _verdict(limits, int(refused), int(hits), int(previous), now)


def windows_check(limits: Sequence[Limit], *, now: float) -> Verdict:
    """Check and count ``limits`` in the configured store: Redis when ``EFFECT_LEDGER_CACHE_URL``
    is set, else PostgreSQL.

    A limiter that fails must not stop every agent, so the request is then served unchecked,
    with a warning: Redis unreachable or slower than ``REDIS_TIMEOUT_SECONDS`` (and then not
    asked again for ``REDIS_PAUSE_SECONDS``); the database refusing the statement itself (a
    read-only standby, a schema not migrated). A database that cannot be reached at all is not
    hidden: ``OperationalError`` propagates, and the request is answered 503 as any would be.
    """
    global _redis_paused_until
    if not settings.EFFECT_LEDGER_CACHE_URL:
        try:
            return postgres_check(limits, now=now)
        except (OperationalError, InterfaceError):
            raise
        except DatabaseError as error:
            logger.warning("rate limits not checked: the database refused their statement: %s", error)
            return Verdict()
    if time.monotonic() < _redis_paused_until:
        return Verdict()
    import redis

    try:
        return redis_check(limits, now=now)
    except (redis.RedisError, OSError) as error:
        _redis_paused_until = time.monotonic() + REDIS_PAUSE_SECONDS
        logger.warning(
            "rate limits not checked for %.0f s: Redis at EFFECT_LEDGER_CACHE_URL failed: %s",
            REDIS_PAUSE_SECONDS,
            error,
        )
        return Verdict()
