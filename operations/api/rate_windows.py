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

Limits are checked in the order given and the first refusal ends the check: a request its
agent's limit refused is not counted against its tenant's.

Two stores, one algorithm:

- ``postgres_check``: one statement, ``INSERT ... ON CONFLICT (key) DO UPDATE`` per limit
  chained in data-modifying CTEs, on the UNLOGGED table ``operations_ratewindow`` (row locks
  make concurrent requests count exactly; no write-ahead log, so no disk flush per request). It
  also serves as the request's connection health check (``first_statement``).
- ``redis_check``: one ``EVALSHA`` of a Lua script (atomic on the server), when
  ``EFFECT_LEDGER_CACHE_URL`` names a Redis.

Times are Unix seconds from the web process's clock: processes on machines whose clocks differ
by ``d`` seconds disagree about the window's edge by ``d`` (NTP keeps that to milliseconds).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

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


def _verdict(limits: Sequence[Limit], rows: Sequence[tuple[Any, Any, Any]], now: float) -> Verdict:
    for limit, (allowed, hits, previous) in zip(limits, rows, strict=True):
        if allowed is False:
            return Verdict(limit, retry_after(limit, now=now, hits=int(hits), previous=int(previous)))
    return Verdict()


_UPSERT = """
l{n} AS (
  INSERT INTO operations_ratewindow AS w (key, window_start, hits, previous, allowed)
  SELECT %(key{n})s, %(start{n})s, 1, 0, true {guard}
  ON CONFLICT (key) DO UPDATE SET
    window_start = EXCLUDED.window_start,
    previous = {previous},
    hits = {hits} + ({ok})::int,
    allowed = {ok}
  RETURNING allowed, hits, previous
)"""
_HITS = "(CASE WHEN w.window_start = %(start{n})s THEN w.hits ELSE 0 END)"
_PREVIOUS = (
    "(CASE WHEN w.window_start = %(start{n})s THEN w.previous"
    " WHEN w.window_start = %(start{n})s - %(period{n})s THEN w.hits ELSE 0 END)"
)
_OK = "({previous} * %(weight{n})s + {hits} + 1 <= %(requests{n})s)"


@cache
def postgres_statement(count: int) -> str:
    """The one statement that checks and counts ``count`` limits in order (built once per count):
    limit n's row is written only when limit n-1 served the request. Returns, per limit,
    ``allowed, hits, previous`` (NULLs for a limit not reached)."""
    parts = []
    for n in range(count):
        hits, previous = _HITS.format(n=n), _PREVIOUS.format(n=n)
        guard = f"WHERE (SELECT allowed FROM l{n - 1})" if n else ""
        ok = _OK.format(previous=previous, hits=hits, n=n)
        parts.append(_UPSERT.format(n=n, guard=guard, previous=previous, hits=hits, ok=ok))
    columns = ", ".join(
        f"(SELECT {column} FROM l{n})" for n in range(count) for column in ("allowed", "hits", "previous")
    )
    return "WITH" + ",".join(parts) + f"\nSELECT {columns}"


def postgres_check(limits: Sequence[Limit], *, now: float) -> Verdict:
    """Check and count ``limits`` (in order) in PostgreSQL, one statement, autocommit.

    Raises:
        django.db.DatabaseError: the database refused or is unreachable.
    """
    if not limits:
        return Verdict()
    params: dict[str, Any] = {}
    for n, limit in enumerate(limits):
        start, weight = window_of(limit, now)
        params.update({f"key{n}": limit.key, f"start{n}": start, f"period{n}": limit.period,
                       f"weight{n}": weight, f"requests{n}": limit.requests})  # fmt: skip
    row = first_statement(postgres_statement(len(limits)), params)
    rows = [(row[3 * n], row[3 * n + 1], row[3 * n + 2]) for n in range(len(limits))]
    return _verdict(limits, rows, now)


def first_statement(sql: str, params: dict[str, Any]) -> tuple[Any, ...]:
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


def _fetch_one(sql: str, params: dict[str, Any]) -> tuple[Any, ...]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row: tuple[Any, ...] = cursor.fetchone()
    return row


#: The Redis keys' prefix (each expires two periods after its last request).
REDIS_PREFIX = "effect-ledger:rate:"

# KEYS: the limits' keys, in order. ARGV: now, then requests and period per key. Returns one
# {allowed, hits, previous} triple per key reached; the first refusal ends the loop uncounted.
_LUA = """
local now = tonumber(ARGV[1])
local out = {}
for i, key in ipairs(KEYS) do
  local requests = tonumber(ARGV[2 * i])
  local period = tonumber(ARGV[2 * i + 1])
  local start = math.floor(now / period) * period
  local row = redis.call('HMGET', key, 'start', 'hits', 'previous')
  local was, hits, previous = tonumber(row[1]), tonumber(row[2]) or 0, tonumber(row[3]) or 0
  if was == start then
  elseif was == start - period then previous, hits = hits, 0
  else previous, hits = 0, 0 end
  local ok = previous * (1 - (now - start) / period) + hits + 1 <= requests
  if ok then hits = hits + 1 end
  redis.call('HSET', key, 'start', start, 'hits', hits, 'previous', previous)
  redis.call('EXPIRE', key, 2 * period)
  out[i] = {ok and 1 or 0, hits, previous}
  if not ok then break end
end
return out
"""


@cache
def _redis_script(url: str) -> Any:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    return client.register_script(_LUA)


def redis_check(limits: Sequence[Limit], *, now: float) -> Verdict:
    """Check and count ``limits`` (in order) in Redis, one ``EVALSHA`` (``EVAL`` the first time).

    Raises:
        redis.RedisError: Redis refused or is unreachable.
    """
    if not limits:
        return Verdict()
    args: list[Any] = [repr(now)]
    for limit in limits:
        args += [limit.requests, limit.period]
    keys = [REDIS_PREFIX + limit.key for limit in limits]
    answer = _redis_script(settings.EFFECT_LEDGER_CACHE_URL)(keys=keys, args=args)
    rows: list[tuple[bool | None, int, int]] = [(bool(ok), hits, previous) for ok, hits, previous in answer]
    rows += [(None, 0, 0)] * (len(limits) - len(rows))
    return _verdict(limits, rows, now)


def windows_check(limits: Sequence[Limit], *, now: float) -> Verdict:
    """Check and count ``limits`` in the configured store: Redis when ``EFFECT_LEDGER_CACHE_URL``
    is set, else PostgreSQL. If Redis cannot be reached the request is served (logged as a
    warning): a limiter that is down must not stop every agent."""
    if not settings.EFFECT_LEDGER_CACHE_URL:
        return postgres_check(limits, now=now)
    import redis

    try:
        return redis_check(limits, now=now)
    except redis.RedisError as error:
        logger.warning("rate limits not checked: Redis at EFFECT_LEDGER_CACHE_URL failed: %s", error)
        return Verdict()
