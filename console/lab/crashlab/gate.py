"""The acceptance gate's checks (``Gate``): the seven checks of shared/seeds/003 and the restore
drill (issue 22), each on one cluster of real worker processes and the sandbox provider, each
giving a ``Check``; ``acceptance.run_acceptance`` runs them in order.

The gate starts workers without beat and runs the reconciler's sweeps itself at the moments a
check needs them, so each scenario is deterministic; the sweeps are the product's own code.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
from django.conf import settings
from django.db.models.functions import Now

from console.lab.cluster import LocalCluster, require_real_broker, wait_until
from console.lab.crashlab.config import LEASE_SECONDS, PROVIDER_TIMEOUT, arguments_for
from console.lab.crashlab.network_watch import NetworkWatch
from console.lab.models import LabOperation
from operations.models import TERMINAL_STATUSES, Attempt, Intent, OutboxMessage
from operations.services import intent_submit
from operations.workers.outbox import outbox_relay

TENANT = "acceptance"
PRINCIPAL = "agent:acceptance-gate"


@dataclass
class Check:
    """One named check of the gate."""

    name: str
    passed: bool
    detail: str
    metrics: dict[str, Any] = field(default_factory=dict)


class Gate:
    """Runs the gate's checks on one cluster."""

    def __init__(self, watch: NetworkWatch) -> None:
        self.watch = watch
        self.cluster = LocalCluster(lease_seconds=3, provider_timeout_seconds=PROVIDER_TIMEOUT)
        self.provider: httpx.Client | None = None
        self.intent_ids: list[Any] = []

    def __enter__(self) -> Gate:
        require_real_broker("the acceptance gate")
        url = self.cluster.start_sandbox()
        settings.SANDBOX_PROVIDER_URL = url
        self.provider = httpx.Client(base_url=url, timeout=10)
        self.cluster.use_queue_here()
        self.worker_a = self.cluster.start_worker("gate-a")
        self.worker_b = self.cluster.start_worker("gate-b")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.provider is not None:
            self.provider.close()
        self.cluster.stop()

    # --- helpers ------------------------------------------------------------------------------

    def _sandbox(self) -> httpx.Client:
        assert self.provider is not None
        return self.provider

    def _fault(self, product: str, mode: str, reference: str, delay: float | None = None) -> None:
        body: dict[str, Any] = {"product": product, "mode": mode, "match": {"reference": reference}}
        if delay is not None:
            body["delay_seconds"] = delay
        self._sandbox().post("/_sandbox/faults", json=body).raise_for_status()

    def _effects(self, product: str, reference: str) -> list[dict[str, Any]]:
        response = self._sandbox().get("/ledger", params={"product": product, "reference": reference})
        response.raise_for_status()
        effects: list[dict[str, Any]] = response.json()["effects"]
        return effects

    def _submit(self, provider: str, reference: str) -> Intent:
        action = {"payments": "payments.charge", "reservations": "reservations.create"}[provider]
        intent = intent_submit(
            tenant=TENANT,
            principal=PRINCIPAL,
            client_key=reference,
            action=action,
            arguments=arguments_for(provider, reference, 1),
            reference=reference,
        ).intent
        self.intent_ids.append(intent.id)
        return intent

    def _status(self, intent: Intent) -> str:
        return Intent.objects.get(id=intent.id).status

    def _wait_status(self, intent: Intent, statuses: set[str], timeout: float = 30) -> None:
        wait_until(lambda: self._status(intent) in statuses, timeout, f"{intent.id} to reach {statuses}", 0.1)

    def _pid_of(self, intent: Intent) -> int:
        wait_until(
            lambda: Intent.objects.filter(id=intent.id, status="RUNNING").exclude(lease_owner="").exists(),
            30,
            "the worker to claim",
            0.02,
        )
        owner = Intent.objects.get(id=intent.id).lease_owner
        return int(owner.rsplit(":", 1)[1])

    def _counter(self, name: str) -> float:
        from operations.metrics import render_metrics

        body, _ = render_metrics()
        total = 0.0
        for line in body.decode().splitlines():
            if line.startswith(name) and not line.startswith("#"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    # --- the checks -------------------------------------------------------------------------------

    def danger_window(self) -> Check:
        """A naive executor that records completion after the call, killed right after the
        provider applied the effect, repeats it on redelivery: 2 effects for 1 operation."""
        from console.celery import app

        reference = f"gate-naive-{uuid.uuid4().hex[:8]}"
        self._fault("payments", "hold_after_effect", reference, delay=30)
        op = LabOperation.objects.create(
            run_key="acceptance", strategy="record-after", reference=reference, amount=101
        )
        app.send_task("crashlab.naive_execute", args=[op.id, "record-after", PROVIDER_TIMEOUT])
        wait_until(lambda: bool(self._effects("payments", reference)), 30, "the naive effect", 0.02)
        pid = LabOperation.objects.get(id=op.id).pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: LabOperation.objects.get(id=op.id).finished, 60, "the redelivery", 0.1)
        effects = len(self._effects("payments", reference))
        return Check("danger window reproduced by a naive path", effects == 2,
                     f"{effects} effects for 1 operation after SIGKILL between effect and record",
                     {"naive_effects": effects})  # fmt: skip

    def two_deliveries(self) -> Check:
        """The same execute message delivered twice (plus the outbox's own): one effect."""
        from console.celery import app

        reference = f"gate-dup-{uuid.uuid4().hex[:8]}"
        intent = self._submit("payments", reference)
        for _ in range(2):
            app.send_task("operations.execute_intent", kwargs={"intent_id": str(intent.id)})
        self._wait_status(intent, {"SUCCEEDED"})
        time.sleep(0.5)  # let the extra deliveries arrive and be absorbed
        effects = len(self._effects("payments", reference))
        attempts = Attempt.objects.filter(intent=intent).count()
        return Check("two deliveries, one effect", effects == 1 and attempts == 1,
                     f"3 deliveries -> {attempts} attempt, {effects} effect", {"safe_effects": effects})  # fmt: skip

    def stale_worker(self) -> Check:
        """A worker frozen mid-call (SIGSTOP) loses its lease; a newer fence completes the
        intent; the thawed worker's write is refused and the provider refuses its old fence."""
        from reconciliation.services import take_over_expired_leases

        reference = f"gate-stale-{uuid.uuid4().hex[:8]}"
        self._fault("payments", "hold_before_effect", reference, delay=6)
        stale_before = self._counter("effect_ledger_stale_fences_rejected_total")
        intent = self._submit("payments", reference)
        pid = self._pid_of(intent)
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_until(
                lambda: Intent.objects.filter(id=intent.id, lease_expires_at__lt=Now()).exists(),
                30,
                "lease expiry",
            )
            take_over_expired_leases()
            self._wait_status(intent, {"SUCCEEDED"})
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_until(
            lambda: self._counter("effect_ledger_stale_fences_rejected_total") > stale_before,
            30,
            "the stale write",
        )
        current = Intent.objects.get(id=intent.id)
        replay = self._sandbox().post(
            "/v1/charges",
            json=arguments_for("payments", reference, 1),
            headers={"Idempotency-Key": current.idempotency_key, "X-Fencing-Token": "1"},
        )
        # The provider applies nothing for the old fence. The engine reads that 409 as "a newer
        # attempt exists" (UNKNOWN, issue 22), and the thawed worker's write of it is still
        # refused by the ledger: the newer fence already won.
        provider_refused = replay.status_code == 409 and "stale_fence" in replay.text
        effects = len(self._effects("payments", reference))
        passed = current.status == "SUCCEEDED" and current.fence >= 2 and effects == 1 and provider_refused
        return Check("stale worker fenced", passed,
                     f"fence {current.fence} won; stale write refused by the ledger; provider answered "
                     f"{replay.status_code} to fence 1; {effects} effect")  # fmt: skip

    def outbox_redispatch(self) -> Check:
        """One outbox message published three times (the dispatcher 'crashed' twice before
        marking it sent): byte-identical bodies, one downstream effect."""
        reference = f"gate-outbox-{uuid.uuid4().hex[:8]}"
        intent = self._submit("payments", reference)
        self._wait_status(intent, {"SUCCEEDED"})
        message = OutboxMessage.objects.get(intent=intent)
        bodies = {message.body}
        for _ in range(2):
            OutboxMessage.objects.filter(id=message.id).update(sent_at=None)
            outbox_relay(message_ids=[message.id])
            bodies.add(OutboxMessage.objects.get(id=message.id).body)
        time.sleep(0.5)
        message.refresh_from_db()
        effects = len(self._effects("payments", reference))
        passed = effects == 1 and len(bodies) == 1 and message.publish_count == 3
        return Check("outbox re-dispatched twice, one downstream effect", passed,
                     f"published {message.publish_count} times with one body; {effects} effect",
                     {"downstream_effects": effects})  # fmt: skip

    def compensation(self) -> Check:
        """A reservation provider without keys: a blind retry (an operator accepting the
        duplicate risk) books twice; reconciliation cancels the extra; one remains."""
        from django.contrib.auth import get_user_model

        from reconciliation.duplicates import run_duplicate_checks
        from reconciliation.resolution import resolve_absent

        reference = f"gate-resv-{uuid.uuid4().hex[:8]}"
        self._fault("reservations", "crash_after_effect", reference)
        intent = self._submit("reservations", reference)
        self._wait_status(intent, {"UNKNOWN"})
        operator, _ = get_user_model().objects.get_or_create(
            username="acceptance-operator", defaults={"is_superuser": True}
        )
        resolve_absent(
            intent_id=intent.id,
            user=operator,
            reason="acceptance gate: blind retry",
            accept_duplicate_risk=True,
        )
        self._wait_status(intent, {"SUCCEEDED"})
        run_duplicate_checks()
        compensations = list(Intent.objects.filter(compensates=intent))
        self.intent_ids.extend(c.id for c in compensations)
        for compensation in compensations:
            self._wait_status(compensation, {"SUCCEEDED", "FAILED"})
        effects = self._effects("reservations", reference)
        active = [e for e in effects if e.get("status") != "cancelled"]
        passed = len(effects) == 2 and len(active) == 1 and len(compensations) == 1
        return Check("compensation leaves one reservation", passed,
                     f"{len(effects)} reservations booked, {len(compensations)} compensation, {len(active)} active")  # fmt: skip

    def restore(self) -> Check:
        """The restore drill at its smallest (3 intents per kind and batch): the ledger's database
        restored from a mid-run dump, the lost intents re-submitted; at the provider, no
        duplicate and nothing lost. It runs in a scratch database with workers of its own."""
        from console.lab.crashlab.duplicate_drill import CONSISTENCY_WINDOW_SECONDS
        from console.lab.crashlab.restore_drill import RestoreDrill
        from console.lab.crashlab.verdict import judge_restore_row

        drill = RestoreDrill(
            sandbox_url=str(settings.SANDBOX_PROVIDER_URL),
            intents=3,
            provider_timeout=PROVIDER_TIMEOUT,
            lease_seconds=LEASE_SECONDS,
            consistency_window=CONSISTENCY_WINDOW_SECONDS,
        )
        try:
            row = drill.run()
        finally:
            self.cluster.use_queue_here()
        problems = judge_restore_row(row)
        detail = (
            f"{row.ops} references, {row.interrupted} lost by the restore and re-submitted; at the provider "
            f"{row.effects} effects, {row.duplicates} duplicate(s), {row.missing} lost, "
            f"{row.failed_with_effect} FAILED with an effect, {row.operator} with an operator"
        )
        return Check("restore drill: no duplicate, nothing lost", not problems,
                     detail + ("" if not problems else "; " + "; ".join(problems)),
                     {"restore_duplicates": row.duplicates, "restore_lost": row.missing,
                      "restore_lost_by_restore": row.interrupted})  # fmt: skip

    def terminal(self) -> Check:
        """Every intent the gate created ended (no RUNNING, READY or UNKNOWN left)."""
        open_states = Intent.objects.filter(id__in=self.intent_ids).exclude(
            status__in=[*TERMINAL_STATUSES, "SUCCEEDED"]
        )
        stuck = list(open_states.values_list("status", flat=True))
        return Check(
            "safe intents terminal", not stuck, f"{len(self.intent_ids)} intents, {len(stuck)} not terminal"
        )

    def network(self) -> Check:
        """Nothing left loopback; no credential file was read."""
        self.watch.sample([os.getpid(), *self.cluster.pids()])
        calls = len(self.watch.non_loopback)
        reads = len(self.watch.credential_reads)
        return Check("no traffic outside loopback and no credentials read", calls == 0 and reads == 0,
                     f"{calls} non-loopback connection(s), {reads} credential read(s)",
                     {"non_loopback_network_calls": calls, "credential_reads": reads})  # fmt: skip
