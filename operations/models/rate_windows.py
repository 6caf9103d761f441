"""The API's rate-limit windows in PostgreSQL (``RateWindow``), when no Redis is configured."""

from __future__ import annotations

from django.db import models


class RateWindow(models.Model):
    """One sliding-window counter (``operations.api.rate_windows``): the requests a key (an
    agent's or a tenant's limit, with its period) was served in the window starting at
    ``window_start`` and in the window before it.

    One row per key, locked and updated in place by the database function
    ``effect_ledger_rate_check`` (migration 0037), one call per request; the table never grows
    past the number of agents and tenants. It is UNLOGGED: a window is worth nothing after a
    crash, so its writes skip the write-ahead log and a request's commit waits for no disk
    flush; after a crash or a failover the windows start empty.
    """

    key = models.CharField(primary_key=True, max_length=120, help_text="scope:ident:period seconds")
    window_start = models.BigIntegerField(help_text="Unix seconds, a multiple of the period")
    hits = models.IntegerField(help_text="requests served in the current window")
    previous = models.IntegerField(help_text="requests served in the window before it")
