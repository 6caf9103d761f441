"""Drive the crash-lab matrix against real worker processes and the sandbox provider.

For each (strategy, boundary) cell, ``ops`` distinct operations run; the first attempt of
every tenth is interrupted at the boundary:

* ``before-effect``: the provider receives the request and holds it without applying; the
  worker process waiting for the answer is SIGKILLed.
* ``after-effect``: the provider applies the effect, then holds the answer; the worker is
  SIGKILLed.
* ``timeout``: the provider applies the effect after the client's deadline; nobody is killed.

Recovery then runs as in production (broker redelivery for the controls; lease takeover,
reconciliation and same-key retries for the ledger). Effects are counted from the provider's
ledger, never from Effect Ledger's own tables. What runs (the matrix, the timings, the faults)
is in ``config``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import uuid
from collections import Counter
from typing import Any

import httpx
from django.conf import settings
from django.test import Client

from console.lab.cluster import HarnessError, LocalCluster, require_real_broker, wait_until
from console.lab.crashlab.config import (
    ACTIONS,
    FAULTS,
    HOLD_SECONDS,
    LEASE_SECONDS,
    PROVIDER_TIMEOUT,
    VARIANTS,
    WINDOW_SETTINGS,
    LabConfig,
    arguments_for,
)
from console.lab.crashlab.duplicate_drill import CONSISTENCY_WINDOW_SECONDS
from console.lab.crashlab.verdict import LEDGER, Row
from console.lab.models import LabOperation
from operations.models import TERMINAL_STATUSES, Agent, Intent

logger = logging.getLogger("crashlab")


class CrashLab:
    """One crash-lab run: start a cluster, run every cell, stop the cluster."""

    def __init__(self, config: LabConfig) -> None:
        self.config = config
        self.cluster = LocalCluster(
            lease_seconds=LEASE_SECONDS,
            provider_timeout_seconds=PROVIDER_TIMEOUT,
            relay_period=0.5,
            reconcile_period=0.5,
        )
        # Short consistency windows for the duplicate drill, read by the workers at start.
        self._windows = WINDOW_SETTINGS if config.drill else ()
        for name in self._windows:
            self.cluster.env[name] = str(CONSISTENCY_WINDOW_SECONDS)
        self._saved_windows = {name: getattr(settings, name, None) for name in self._windows}
        self.sandbox: httpx.Client | None = None
        self.api = Client()
        self.token = ""

    # --- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> CrashLab:
        require_real_broker("the crash lab")
        url = self.cluster.start_sandbox()
        settings.SANDBOX_PROVIDER_URL = url
        for name in self._windows:  # this process agrees with its workers
            setattr(settings, name, CONSISTENCY_WINDOW_SECONDS)
        self.sandbox = httpx.Client(base_url=url, timeout=10)
        self.cluster.use_queue_here()
        config = self.config
        if (config.boundaries and config.strategies) or config.variants or config.drill:
            # The restore and failover drills alone start workers of their own, on their own database.
            for n in range(config.workers):
                self.cluster.start_worker(f"lab{n}", concurrency=config.concurrency)
            self.cluster.start_beat()
        from operations.api.authentication import agent_create

        Agent.objects.filter(tenant="crashlab", name__startswith="lab-").update(is_active=False)
        _, self.token = agent_create(name=f"lab-{uuid.uuid4().hex[:8]}", tenant="crashlab")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
        self.cluster.stop()
        for name, value in self._saved_windows.items():
            setattr(settings, name, value)

    # --- provider ground truth ------------------------------------------------------------------

    def _provider(self) -> httpx.Client:
        assert self.sandbox is not None
        return self.sandbox

    def sandbox_client(self) -> httpx.Client:
        """The HTTP client of the lab's sandbox provider (loopback)."""
        return self._provider()

    def provider_effects(self, product: str, prefix: str) -> list[dict[str, Any]]:
        """Every effect in the provider's ledger for ``product`` whose reference starts with
        ``prefix`` (cancelled and withdrawn ones included), oldest first."""
        return self._effects(product, prefix)

    def provider_requests(self, product: str, prefix: str) -> list[dict[str, Any]]:
        """Every request the provider received for ``product`` whose body reference starts
        with ``prefix``."""
        return [r for r in self._requests(product) if str(r.get("reference") or "").startswith(prefix)]

    def submit_intents(self, provider: str, refs: list[str]) -> list[Any]:
        """Submit one intent of ``ACTIONS[provider]`` per reference through the HTTP API (the
        reference doubles as the client key); return their ids in order.

        Raises:
            HarnessError: the API refused a submission.
        """
        return self._submit_intents(provider, refs)

    def _effects(self, product: str, prefix: str) -> list[dict[str, Any]]:
        response = self._provider().get("/ledger", params={"product": product})
        response.raise_for_status()
        return [e for e in response.json()["effects"] if str(e.get("reference") or "").startswith(prefix)]

    def _requests(self, product: str, since: int = 0) -> list[dict[str, Any]]:
        response = self._provider().get("/_sandbox/requests", params={"product": product, "since": since})
        response.raise_for_status()
        requests: list[dict[str, Any]] = response.json()["requests"]
        return requests

    # --- cells -----------------------------------------------------------------------------------

    def run(self) -> list[Row]:
        """Every configured cell, in order; each row judged later by ``verdict.judge``."""
        rows = []
        for boundary in self.config.boundaries:
            for strategy in self.config.strategies:
                rows.append(self.cell(strategy, boundary, "payments"))
        if self.config.variants:
            for provider, boundary in VARIANTS:
                if boundary in self.config.boundaries:
                    rows.append(self.cell(LEDGER, boundary, provider))
        if self.config.drill:
            rows.append(self.duplicate_drill())
        if self.config.restore:
            rows.append(self.restore_drill())
        if self.config.failover:
            rows.append(self.failover_drill())
        return rows

    def failover_drill(self) -> Row:
        """Run the failover drill (``failover_drill``) against this lab's sandbox provider, on a
        private primary and streaming replica with workers of its own: one row."""
        from console.lab.crashlab.failover_drill import FailoverDrill

        return self._time_travel_drill(FailoverDrill, self.config.intents_per_failover_batch)

    def restore_drill(self) -> Row:
        """Run the restore drill (``restore_drill``) against this lab's sandbox provider, in a
        scratch ledger database with workers of its own: one row."""
        from console.lab.crashlab.restore_drill import RestoreDrill

        return self._time_travel_drill(RestoreDrill, self.config.intents_per_restore_batch)

    def _time_travel_drill(self, drill_class: Any, intents: int) -> Row:
        """Run a drill whose database goes back in time (``RestoreDrill`` or its subclass
        ``FailoverDrill``) with ``intents`` per kind and batch, then publish here again."""
        drill = drill_class(
            sandbox_url=str(settings.SANDBOX_PROVIDER_URL),
            intents=intents,
            provider_timeout=PROVIDER_TIMEOUT,
            lease_seconds=LEASE_SECONDS,
            consistency_window=CONSISTENCY_WINDOW_SECONDS,
            automatic_recovery=not self.config.restore_by_command,
        )
        try:
            row: Row = drill.run()
            return row
        finally:
            self.cluster.use_queue_here()  # the drill's cluster published on its own queue

    def duplicate_drill(self) -> Row:
        """Run the duplicate drill (``duplicate_drill``) on this lab's cluster: one row."""
        from console.lab.crashlab.duplicate_drill import DuplicateDrill

        drill = DuplicateDrill(
            self, intents=self.config.intents_per_drill_provider, provider_timeout=PROVIDER_TIMEOUT
        )
        return drill.run()

    def cell(self, strategy: str, boundary: str, provider: str) -> Row:
        """Run one cell and count its effects at the provider."""
        started = time.monotonic()
        self._provider().post("/_sandbox/reset").raise_for_status()
        prefix = f"lab-{uuid.uuid4().hex[:8]}-"
        refs = [f"{prefix}{n:04d}" for n in range(self.config.ops)]
        victims = refs[::10] if boundary != "none" else []
        for ref in victims:
            fault: dict[str, Any] = {
                "product": provider,
                "mode": FAULTS[boundary],
                "match": {"reference": ref},
            }
            fault["delay_seconds"] = PROVIDER_TIMEOUT + 0.7 if boundary == "timeout" else HOLD_SECONDS
            self._provider().post("/_sandbox/faults", json=fault).raise_for_status()
        # Submission runs beside the killer: a victim may reach the provider while later
        # operations are still being submitted, and must be caught while its worker waits.
        ids: list[Any] = []
        submitter = threading.Thread(  # a daemon: SIGTERM's exit does not wait for it
            target=self._start_operations, args=(strategy, provider, prefix, refs, ids), daemon=True
        )
        submitter.start()
        kills = 0
        if boundary in {"before-effect", "after-effect"}:
            kills = self._kill_victims(strategy, provider, boundary, victims)
        submitter.join()
        if len(ids) != len(refs):
            raise HarnessError(f"only {len(ids)} of {len(refs)} operations were submitted")
        self._wait_done(strategy, ids)
        if boundary == "timeout":
            time.sleep(1.5)  # the last late effects land 0.7 s after their client gave up
        return self._count(strategy, boundary, provider, prefix, refs, ids, kills, time.monotonic() - started)

    def _start_operations(
        self, strategy: str, provider: str, prefix: str, refs: list[str], ids: list[Any]
    ) -> None:
        try:
            if strategy == LEDGER:
                ids.extend(self._submit_intents(provider, refs))
            else:
                ids.extend(self._enqueue_naive(strategy, prefix, refs))
        finally:
            from django.db import connection

            connection.close()  # this thread's own connection

    def _submit_intents(self, provider: str, refs: list[str]) -> list[Any]:
        ids = []
        for n, ref in enumerate(refs):
            response = self.api.post(
                "/api/v1/intents",
                data={
                    "action": ACTIONS[provider],
                    "arguments": arguments_for(provider, ref, n),
                    "reference": ref,
                },
                content_type="application/json",
                HTTP_AUTHORIZATION=f"Bearer {self.token}",
                HTTP_IDEMPOTENCY_KEY=ref,
            )
            if response.status_code != 201:
                raise HarnessError(f"submission refused: {response.status_code} {response.content[:300]!r}")
            ids.append(response.json()["intent_id"])
        return ids

    def _enqueue_naive(self, strategy: str, prefix: str, refs: list[str]) -> list[Any]:
        from console.celery import app

        ops = LabOperation.objects.bulk_create(
            LabOperation(run_key=prefix, strategy=strategy, reference=ref, amount=100 + n)
            for n, ref in enumerate(refs)
        )
        for op in ops:
            app.send_task("crashlab.naive_execute", args=[op.id, strategy, PROVIDER_TIMEOUT])
        return [op.id for op in ops]

    def _victim_pid(self, strategy: str, ref: str) -> int | None:
        """The pid of the process waiting on the victim's first attempt; 0 when that attempt
        is already over (the kill came too late); None when it is not known yet."""
        if strategy == LEDGER:
            intent = Intent.objects.filter(reference=ref, tenant="crashlab").first()
            if intent is None:
                return None
            if intent.status != Intent.Status.RUNNING or intent.attempt_count != 1:
                return 0
            return int(intent.lease_owner.rsplit(":", 1)[1])
        op = LabOperation.objects.filter(reference=ref).values("pid", "attempts").first()
        if op is None:
            return None
        if op["attempts"] > 1 or (op["pid"] is None and op["attempts"]):
            return 0
        pid: int | None = op["pid"]
        return pid

    def _kill_victims(self, strategy: str, provider: str, boundary: str, victims: list[str]) -> int:
        pending = set(victims)
        killed = 0
        deadline = time.monotonic() + 60
        while pending and time.monotonic() < deadline:
            arrived = {r["reference"] for r in self._requests(provider)} & pending
            for ref in sorted(arrived):
                if boundary == "after-effect" and not self._effects(provider, ref):
                    continue  # received, not applied yet
                pid = self._victim_pid(strategy, ref)
                if pid is None:
                    continue
                if pid == 0:
                    logger.warning("victim's attempt ended before the kill", extra={"reference": ref})
                    pending.discard(ref)
                    continue
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    logger.warning("victim process already gone", extra={"reference": ref})
                pending.discard(ref)
            time.sleep(0.05)
        return killed

    def _wait_done(self, strategy: str, ids: list[Any]) -> None:
        if strategy == LEDGER:
            wait_until(
                lambda: (
                    not Intent.objects.filter(id__in=ids)
                    .exclude(status__in=TERMINAL_STATUSES)
                    .exclude(status=Intent.Status.SUCCEEDED)
                    .exists()
                ),
                120,
                "every intent to end",
                interval=0.2,
            )
        else:
            wait_until(
                lambda: not LabOperation.objects.filter(id__in=ids, finished=False).exists(),
                120,
                "every naive operation to finish",
                interval=0.2,
            )

    def _count(
        self, strategy: str, boundary: str, provider: str, prefix: str, refs: list[str], ids: list[Any],
        kills: int, seconds: float,
    ) -> Row:  # fmt: skip
        effects = self._effects(provider, prefix)
        per_ref = Counter(e["reference"] for e in effects)
        missing = sum(1 for ref in refs if per_ref[ref] == 0)
        active = sum(1 for e in effects if e.get("status") not in {"cancelled", "withdrawn"})
        requests = sum(
            1 for r in self._requests(provider) if str(r.get("reference") or "").startswith(prefix)
        )
        not_terminal = compensations = 0
        if strategy == LEDGER:
            not_terminal = (
                Intent.objects.filter(id__in=ids)
                .exclude(status__in=[*TERMINAL_STATUSES, "SUCCEEDED"])
                .count()
            )
            compensations = Intent.objects.filter(compensates_id__in=ids).count()
        return Row(
            strategy=strategy,
            boundary=boundary,
            provider=provider,
            ops=len(refs),
            interrupted=len(refs[::10]) if boundary != "none" else 0,
            effects=len(effects),
            missing=missing,
            duplicates=len(effects) - (len(refs) - missing),
            active=active,
            requests=requests,
            kills=kills,
            not_terminal=not_terminal,
            compensations=compensations,
            seconds=round(seconds, 2),
        )
