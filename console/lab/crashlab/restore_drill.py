"""The restore drill (issue 22): the ledger's database goes back in time, the provider does not.

Per provider kind of the lab (payments: keyed, fenced, authoritative lookup; email: no keys,
lookup by Message-ID that lags; reservations: no keys, listed by reference), real workers run:

1. a first batch of intents: about a third done, then an audit checkpoint (as the beat makes
   one every period; a database restored to before its first checkpoint cannot be told from a
   new one, ``operations.restore.check``); one per kind whose effect the provider applies and
   then holds the answer (``hold_after_effect``: RUNNING at the dump, its effect applied); the
   rest submitted while those hold every pool process (READY at the dump, sent after it);
2. ``pg_dump -Fc`` of the ledger's database alone (the sandbox provider keeps its data in a
   database of its own, so the dump and the restore never touch it), while they are in flight;
3. a second batch after the dump: the restore will lose these intents, not their effects (its
   emails last, so their look-up still lags when the workers start again);
4. everything runs to its end; ``manage.py audit_checkpoint`` writes a second checkpoint to the
   outward file, so the file is ahead of the dump;
5. the workers and beat stop; the database is dropped, created and restored from the dump (as
   onto a new server after a failover), every other session ended first;
6. the workers and beat start again: their start-up check finds the database behind the
   checkpoint file and pauses execution; recovery runs (automatically by default; with
   ``automatic_recovery=False`` the workers run with ``EFFECT_LEDGER_RECOVER_AUTOMATICALLY=0``,
   stay paused, and the drill runs ``manage.py recover --since <dump time>``);
7. the agent re-submits every intent the restore lost, exactly as before (same
   ``Idempotency-Key``, same body, same token);
8. everything settles, and the drill counts effects in the provider's own ledger.

The bar is the kill drills': exactly one effect per reference (no duplicate), nothing lost
(every reference has its effect, or its intent is UNKNOWN or HELD in front of an operator:
counted apart), and no intent FAILED whose reference has an effect at the provider.

It runs in a scratch ledger database of its own (``<database>_restore``, migrated, dropped at
the end) with its own checkpoint file and signing key, so restoring it never rolls back the
database the lab was pointed at. Effects are counted from the provider, never the ledger
(``restore_count``); the agent is ``restore_agent``, the dump and restore ``restore_dump``.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from django.core.management import call_command
from django.db import connection

from console.lab.bench.database import drop_database, recreate_database, use_database
from console.lab.cluster import BASE_DIR, HarnessError, LocalCluster, Process, wait_until
from console.lab.crashlab.restore_agent import KINDS, TENANT, RestoreAgent
from console.lab.crashlab.restore_count import (
    OPERATOR_STATES,
    count_kind,
    newest_effect_age,
    provider_effects,
    restore_row,
)
from console.lab.crashlab.restore_dump import dump_database, restore_database
from console.lab.crashlab.verdict import Row
from operations.models import TERMINAL_STATUSES, ExecutionControl, Intent, RecoveryRun

logger = logging.getLogger("crashlab")

#: Seconds the provider holds a held intent's answer after applying its effect: the dump is
#: taken meanwhile, so the dump shows it RUNNING with its effect applied.
HOLD_SECONDS = 2.5
#: The email lookup lag during the drill (seconds), inside the lab's consistency window: the
#: second batch's emails are still invisible to a look-up when the workers start again after the
#: restore (``newest_email_age_seconds`` in the row), so the restore guard must wait it out
#: before trusting an empty answer.
EMAIL_LAG_SECONDS = 13.0
#: Restore-point margin given to ``recover`` (seconds): the dump's snapshot is taken a moment
#: after the time the drill reads.
MARGIN_SECONDS = 5.0
#: Bounds of the drill's waits (seconds).
SETTLE_TIMEOUT = 90.0
RECOVERY_WAIT = 30.0


class RestoreDrill:
    """One run of the restore drill against a running sandbox provider.

    Args:
        sandbox_url: the lab's sandbox provider (its data lives outside the ledger's database).
        intents: intents per provider kind in each of the two batches (at least 3: done, held,
            just submitted).
        provider_timeout: the workers' provider deadline, seconds.
        lease_seconds: the workers' lease, seconds.
        consistency_window: the adapters' consistency windows during the drill, seconds.
        automatic_recovery: the workers recover by themselves (the default); else the drill
            runs ``manage.py recover`` once it sees execution paused.

    The drill's cluster is one worker with one pool process per kind: the held intents occupy
    every one of them at the dump, so the intents submitted then are READY in it.
    """

    #: The prefix of the drill's temporary folder (checkpoint file, signing key, dump).
    TMP_PREFIX = "effect-ledger-restore-drill-"

    def __init__(
        self,
        *,
        sandbox_url: str,
        intents: int,
        provider_timeout: float,
        lease_seconds: int,
        consistency_window: float,
        automatic_recovery: bool = True,
    ) -> None:
        self.sandbox_url = sandbox_url
        self.intents = max(3, intents)
        self.provider_timeout = provider_timeout
        self.lease_seconds = lease_seconds
        self.consistency_window = consistency_window
        self.automatic_recovery = automatic_recovery
        self.agent = RestoreAgent(intents=self.intents)
        self.tmp = Path(tempfile.mkdtemp(prefix=self.TMP_PREFIX))
        self.cluster: LocalCluster | None = None
        self.processes: list[Process] = []
        self.notes: list[str] = []
        self.recovery: dict[str, Any] = {}

    # --- the run -----------------------------------------------------------------------------------

    def run(self) -> Row:
        """Run the drill in a scratch database and return its row (judged by ``verdict``).

        Raises:
            HarnessError: the drill could not set itself up (a submission refused, a tool
                missing, a dump or restore that failed).
        """
        started = time.monotonic()
        home = str(connection.settings_dict["NAME"])
        scratch = f"{home}_restore"
        provider = httpx.Client(base_url=self.sandbox_url, timeout=10)
        recreate_database(scratch, admin_db=home)
        use_database(scratch)
        try:
            call_command("migrate", verbosity=0)
            from operations.api.authentication import agent_create

            _, self.agent.token = agent_create(name="restore-agent", tenant=TENANT)
            provider.post("/_sandbox/config", json={"email_lookup_lag_seconds": EMAIL_LAG_SECONDS})
            self._start_cluster()
            dump, dump_time, at_dump_ids = self._first_batch_and_dump(provider)
            self._second_batch()
            self._stop_processes()
            restore_database(scratch, dump, admin_db=home)
            at_dump, lost = self._restart_and_resubmit(provider, dump_time)
            return self._row(provider, at_dump, lost, at_dump_ids, started)
        finally:
            provider.post("/_sandbox/config", json={"email_lookup_lag_seconds": 0})
            provider.close()
            self._stop_processes()
            if self.cluster is not None:
                self.cluster.stop()
            use_database(home)
            drop_database(scratch, admin_db=home)
            shutil.rmtree(self.tmp, ignore_errors=True)

    # --- steps shared with the failover drill ------------------------------------------------------

    def _second_batch(self) -> None:
        """Submit the second batch (the database will lose it), let everything end, and sign a
        checkpoint: the outward file is then ahead of what the database keeps. Its emails go last,
        once the rest ended, so at the restart their look-up still lags: the restore guard waits."""
        self.agent.submit_all({kind: self.agent.second[kind] for kind in KINDS if kind != "email"})
        emails = set(self.agent.second["email"])
        rest = [ref for ref in self.agent.every_reference() if ref not in emails]
        self._wait_settled(rest, "every intent to end")
        self.agent.submit_all({"email": self.agent.second["email"]})
        self._wait_settled(self.agent.every_reference(), "the last emails to end")
        self._checkpoint()

    def _restart_and_resubmit(self, provider: httpx.Client, since: str) -> tuple[dict[str, str], list[str]]:
        """Once the database went back: start the workers and beat on it, let recovery run (see
        ``_recover``), re-submit what the database lost, and wait until everything settled.

        Args:
            since: the restore point (ISO 8601 with its offset), for ``manage.py recover --since``.

        Returns:
            the state of each reference's intent in the database that went back, and the
            references it lost (re-submitted).
        """
        at_point = self.agent.states_by_reference()
        before = {run["id"] for run in self._recovery_runs()}
        self._start_processes()
        self.recovery["newest_email_age_seconds"] = newest_effect_age(provider, "email", self.agent.prefix)
        self._recover(since, before=before)
        lost = [ref for ref in self.agent.every_reference() if ref not in at_point]
        self.notes.extend(self.agent.resubmit(lost))
        self._wait_settled(self.agent.every_reference(), "every intent to settle", strict=False)
        self._wait_landed(provider)
        return at_point, lost

    def _row(self, provider: httpx.Client, at_point: dict[str, str], lost: list[str],
             groups: dict[str, list[str]], started: float, **kwargs: Any) -> Row:  # fmt: skip
        """Count every kind at the provider; the drill's row (``restore_row``, to which
        ``kwargs`` such as ``strategy`` pass; a ``detail`` given there is merged)."""
        counts = {kind: count_kind(provider, self.agent, kind, at_point, lost) for kind in KINDS}
        detail = {"recovery": self.recovery, "notes": self.notes[:20], "email_lookup_lag_seconds": EMAIL_LAG_SECONDS,
                  "consistency_window_seconds": self.consistency_window, **kwargs.pop("detail", {})}  # fmt: skip
        return restore_row(counts, groups, time.monotonic() - started, detail=detail, **kwargs)

    # --- processes -----------------------------------------------------------------------------------

    def _start_cluster(self) -> None:
        """Workers and beat on the scratch database, with the drill's own checkpoint file and key."""
        self.cluster = LocalCluster(
            sandbox_url=self.sandbox_url,
            lease_seconds=self.lease_seconds,
            provider_timeout_seconds=self.provider_timeout,
            relay_period=0.5,
            reconcile_period=0.5,
        )
        self.cluster.env.update(
            {
                "EFFECT_LEDGER_AUDIT_CHECKPOINT_FILE": str(self.tmp / "audit-checkpoints.jsonl"),
                "EFFECT_LEDGER_AUDIT_SIGNING_KEY_FILE": str(self.tmp / "audit-signing-key.pem"),
                "EFFECT_LEDGER_AUDIT_SIGNING_KEY_CREATE": "1",
                "SANDBOX_EMAIL_CONSISTENCY_WINDOW_SECONDS": str(self.consistency_window),
                "SANDBOX_RESERVATIONS_CONSISTENCY_WINDOW_SECONDS": str(self.consistency_window),
                "EFFECT_LEDGER_RECOVER_AUTOMATICALLY": "1" if self.automatic_recovery else "0",
            }
        )
        self.cluster.use_queue_here()
        self._start_processes()

    def _start_processes(self) -> None:
        assert self.cluster is not None
        self.processes = [
            self.cluster.start_worker("restore", concurrency=len(KINDS)),
            self.cluster.start_beat(),
        ]

    def _stop_processes(self) -> None:
        for process in self.processes:
            process.kill_group()
        self.processes = []

    def _manage(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``manage.py ARGS`` with the drill's environment (scratch database, checkpoint file)."""
        assert self.cluster is not None
        return subprocess.run(  # noqa: S603 - our own manage.py, fixed arguments
            [sys.executable, str(BASE_DIR / "manage.py"), *args],
            cwd=BASE_DIR,
            env=self.cluster.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    # --- before the restore ----------------------------------------------------------------------

    def _first_batch_and_dump(self, provider: httpx.Client) -> tuple[Path, str, dict[str, list[str]]]:
        """Submit the first batch in three thirds and dump while the last two are in flight.

        Returns:
            the dump file, the database time read just before the dump (ISO 8601), and which
            references were done / held / just submitted at the dump.
        """
        groups = self._first_batch(provider)
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            dump_time = cursor.fetchone()[0].isoformat()
        dump = self.tmp / "ledger.dump"
        dump_database(str(connection.settings_dict["NAME"]), dump)
        return dump, dump_time, groups

    def _first_batch(self, provider: httpx.Client) -> dict[str, list[str]]:
        """Submit the first batch in three thirds: the first ends (then a checkpoint), one
        intent per kind is held by the provider after its effect (every pool process busy), the
        rest is submitted meanwhile (READY). Return the references done / held / just submitted.
        """
        third = max(1, self.intents // 3)
        groups: dict[str, list[str]] = {"done": [], "held": [], "late": []}
        for kind in KINDS:
            refs = self.agent.first[kind]
            groups["done"] += refs[:third]
            groups["held"] += refs[third : third + 1]  # one per kind: one per pool process
            groups["late"] += refs[third + 1 :]
        for ref in groups["held"]:
            kind = self.agent.kind_of(ref)
            provider.post(
                "/_sandbox/faults",
                json={"product": kind, "mode": "hold_after_effect", "delay_seconds": HOLD_SECONDS,
                      "match": {"reference": ref}},
            ).raise_for_status()  # fmt: skip
        self.agent.submit_all({k: [r for r in self.agent.first[k] if r in groups["done"]] for k in KINDS})
        self._wait_settled(groups["done"], "the first third to end")
        self._checkpoint()  # as the beat makes one every period: the dump will hold it
        self.agent.submit_all({k: [r for r in self.agent.first[k] if r in groups["held"]] for k in KINDS})
        wait_until(
            lambda: all(
                provider_effects(provider, self.agent.kind_of(r), self.agent.prefix, r)
                for r in groups["held"]
            ),
            30,
            "the held intents' effects at the provider",
            interval=0.05,
        )
        self.agent.submit_all({k: [r for r in self.agent.first[k] if r in groups["late"]] for k in KINDS})
        return groups

    def _checkpoint(self) -> None:
        """Sign an audit checkpoint now (``manage.py audit_checkpoint``), stored in the database
        and appended to the drill's outward checkpoint file."""
        completed = self._manage("audit_checkpoint")
        if completed.returncode:
            raise HarnessError(f"audit_checkpoint failed: {(completed.stdout + completed.stderr)[-1000:]}")

    # --- the restore and the recovery ----------------------------------------------------------------

    def _recovery_runs(self) -> list[dict[str, Any]]:
        """Every recovery recorded in the restored database, oldest first."""
        fields = ("id", "trigger", "actor", "finished_at", "error", "counts")
        return [dict(run) for run in RecoveryRun.objects.order_by("id").values(*fields)]

    def _paused(self) -> bool:
        """Whether execution is paused in the restored database."""
        return ExecutionControl.objects.filter(id=1, paused_at__isnull=False).exists()

    def _recover(self, dump_time: str, *, before: set[int]) -> None:
        """Wait for the automatic recovery, or (``automatic_recovery=False``) for the start-up
        check's pause, then run ``manage.py recover --since <dump time>`` as an operator would.

        Args:
            dump_time: the database time read just before the dump (ISO 8601).
            before: ids of the recovery runs the restored database held before the restart.
        """

        def recovered() -> bool:
            return any(r["finished_at"] for r in self._recovery_runs() if r["id"] not in before)

        if self.automatic_recovery:
            self.recovery["by"] = "automatic"
            try:
                wait_until(recovered, RECOVERY_WAIT, "the automatic recovery", interval=0.5)
            except HarnessError as exc:
                self.notes.append(str(exc))
        else:
            self.recovery["by"] = "manage.py recover"
            try:
                wait_until(self._paused, RECOVERY_WAIT, "the start-up check's pause", interval=0.5)
                self.recovery["paused_before"] = True
            except HarnessError as exc:
                self.notes.append(str(exc))
                self.recovery["paused_before"] = False
            completed = self._manage("recover", "--since", dump_time, "--margin", str(MARGIN_SECONDS))
            self.recovery["exit"] = completed.returncode
            self.recovery["output"] = (completed.stdout + completed.stderr)[-1500:]
        runs = [r for r in self._recovery_runs() if r["id"] not in before]
        self.recovery["runs"] = [
            {**r, "finished_at": r["finished_at"].isoformat() if r["finished_at"] else None} for r in runs
        ]
        self.recovery["paused_after"] = self._paused()
        self.recovery["ok"] = (
            any(r["finished_at"] and not r["error"] for r in runs)
            and not self.recovery["paused_after"]
            and self.recovery.get("exit", 0) == 0
            and self.recovery.get("paused_before", True)
        )

    # --- waiting -----------------------------------------------------------------------------------

    def _wait_settled(self, refs: list[str], what: str, *, strict: bool = True) -> None:
        """Wait until every ``refs`` intent is SUCCEEDED or terminal (``strict``), or, after
        the restore, also settled in front of an operator once the consistency window passed."""
        done = {*TERMINAL_STATUSES, Intent.Status.SUCCEEDED}
        started = time.monotonic()

        def settled() -> bool:
            states = self.agent.states_by_reference()
            if any(ref not in states for ref in refs):
                return False
            waiting = {ref for ref in refs if states[ref] not in done}
            if not waiting:
                return True
            patient = strict or time.monotonic() - started < self.consistency_window + 10
            return not patient and all(states[ref] in OPERATOR_STATES for ref in waiting)

        try:
            wait_until(settled, SETTLE_TIMEOUT, what, interval=0.25)
        except HarnessError as exc:
            if strict:
                raise
            self.notes.append(str(exc))

    def _wait_landed(self, provider: httpx.Client) -> None:
        """Wait (bounded) until every request the provider applied or refused has been answered:
        its held answers are over, so nothing lands after the count."""
        time.sleep(HOLD_SECONDS + 0.5)
