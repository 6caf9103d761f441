"""The failover drill (issue 35): a streaming replica that lags is promoted, as operators meet it.

The restore drill (``restore_drill``) takes the ledger's database back in time with a dump;
this one does it the way production does, on real PostgreSQL streaming replication:

1. a private primary and a hot-standby replica streaming from it (``replica_pair``: ``initdb``,
   ``pg_basebackup -R``, free loopback ports; never the shared cluster); the ledger's database
   is created and migrated on the primary, while the sandbox provider keeps its data where the
   lab started it (the shared server), so provider state survives the failover as a real
   provider's would;
2. real workers and beat run the restore drill's first batch against the primary: a third done
   (then an audit checkpoint), one intent per kind RUNNING with its effect applied at the
   provider and its answer held (``hold_after_effect``), the rest READY behind them;
3. the replica catches up, then is cut off its primary (``StreamingPair.cut``): from here on it
   lags; the load continues (the second batch, everything ends, a second checkpoint is written
   to the outward file);
4. the primary stops hard (``pg_ctl stop -m immediate``), the replica is promoted, and the
   workers, beat and the drill itself are pointed at it: the promoted database lacks the last
   commits (recorded in ``detail["lag"]``: WAL positions and intent counts of both);
5. the workers' start-up check finds the checkpoint file ahead of the database and recovery
   runs (by itself, or ``manage.py recover --since <the replica's last replayed commit>`` with
   ``automatic_recovery=False``); the agent re-submits what the promotion lost (same
   ``Idempotency-Key``, same body); everything settles and effects are counted at the provider.

The bar is the restore drill's (``verdict.judge_failover_row``), plus proof that the lag was
real. The servers, workers and beat are stopped and the folders deleted on every exit path
(SIGTERM included: ``manage.py crashlab`` turns it into ``SystemExit``,
``termination.terminate_as_exit``).
"""

from __future__ import annotations

import contextlib
import shutil
import time
from typing import Any

import httpx
import psycopg
from django.core.management import call_command
from django.db import connection, connections

from console.lab.cluster import database_url
from console.lab.crashlab.replica_pair import SUPERUSER, StreamingPair, lsn_bytes
from console.lab.crashlab.restore_agent import TENANT
from console.lab.crashlab.restore_drill import EMAIL_LAG_SECONDS, RestoreDrill
from console.lab.crashlab.verdict import FAILOVER, Row

#: The ledger's database on the private primary.
DATABASE = "effect_ledger"
#: The connection settings the drill moves between servers (restored at the end).
MOVED_SETTINGS = ("HOST", "PORT", "NAME", "USER", "PASSWORD")


class FailoverDrill(RestoreDrill):
    """One run of the failover drill against a running sandbox provider; the arguments are the
    restore drill's (``RestoreDrill``)."""

    TMP_PREFIX = "effect-ledger-failover-drill-"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lag: dict[str, Any] = {}
        self.timings: dict[str, float] = {}
        self._started = time.monotonic()

    def _mark(self, phase: str) -> None:
        """Record the seconds since the start at which ``phase`` ended (``detail["timings"]``)."""
        self.timings[phase] = round(time.monotonic() - self._started, 1)

    def run(self) -> Row:
        """Run the drill on a private primary and replica and return its row (judged by
        ``verdict.judge_failover_row``).

        Raises:
            HarnessError: the drill could not set itself up (server binaries missing, a server
                tool or a submission that failed).
        """
        started = self._started = time.monotonic()
        saved = {name: connection.settings_dict.get(name) for name in MOVED_SETTINGS}
        provider = httpx.Client(base_url=self.sandbox_url, timeout=10)
        servers: StreamingPair | None = None
        try:
            servers = StreamingPair()
            servers.start()
            self._mark("servers_started")
            with psycopg.connect(servers.primary.dsn(), autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{DATABASE}"')
            _point_ledger_at(servers.primary.port)
            call_command("migrate", verbosity=0)
            self._mark("migrated")
            from operations.api.authentication import agent_create

            _, self.agent.token = agent_create(name="failover-agent", tenant=TENANT)
            provider.post("/_sandbox/config", json={"email_lookup_lag_seconds": EMAIL_LAG_SECONDS})
            self._start_cluster()
            at_cut_ids = self._first_batch(provider)
            servers.wait_replayed()
            self.lag.update(servers.cut())
            self._mark("replica_cut")
            self._second_batch()  # the load goes on; the replica no longer follows
            self.lag["primary_intents"] = len(self.agent.states_by_reference())
            connections.close_all()
            self.lag["primary_lsn"] = servers.crash_primary()
            self._stop_processes()
            servers.promote()
            self._mark("replica_promoted")
            _point_ledger_at(servers.replica.port)
            assert self.cluster is not None
            self.cluster.env["DATABASE_URL"] = database_url()
            self.lag["promoted_intents"] = len(self.agent.states_by_reference())
            self.lag["wal_bytes_behind"] = lsn_bytes(self.lag["primary_lsn"]) - lsn_bytes(
                self.lag["replica_lsn"]
            )
            at_cut, lost = self._restart_and_resubmit(provider, self.lag["last_replayed_commit"])
            self._mark("settled")
            return self._row(
                provider, at_cut, lost, at_cut_ids, started,
                strategy=FAILOVER, boundary="failover", detail={"lag": self.lag, "timings": self.timings},
            )  # fmt: skip
        finally:
            with contextlib.suppress(httpx.HTTPError):
                provider.post("/_sandbox/config", json={"email_lookup_lag_seconds": 0})
            provider.close()
            self._stop_processes()
            if self.cluster is not None:
                self.cluster.stop()
            connections.close_all()
            connection.settings_dict.update(saved)
            if servers is not None:
                servers.destroy()
            shutil.rmtree(self.tmp, ignore_errors=True)


def _point_ledger_at(port: int) -> None:
    """Point Django's default connection (and, through ``cluster.database_url``, every process
    started afterwards) at the drill's ledger database on the loopback server at ``port``."""
    connections.close_all()
    connection.settings_dict.update(
        {"HOST": "127.0.0.1", "PORT": port, "NAME": DATABASE, "USER": SUPERUSER, "PASSWORD": ""}
    )
