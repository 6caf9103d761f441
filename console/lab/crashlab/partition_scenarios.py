"""The partition drill's scenarios (issue 35, case C28), on real worker processes in network
namespaces (``partition_drill.PartitionNet``), the real broker, PostgreSQL and sandbox provider.

Two workers, ``a`` and ``b``, each in a namespace of its own with one concurrency slot, consume the
drill's queue; beat (relay and reconciler) and the sandbox run on the host. Whichever worker claims
the drill's charge is the one partitioned.

``db-cut`` (C28): the provider applies the charge, holds its success answer and then sends it
(``hold_answer``); right then the claiming worker's path to PostgreSQL is cut, not its path to
the provider. The worker has the success answer but cannot record it; its lease expires, the
reconciler takes over (same key, next fence) and the other worker sends again, or a look-up finds
the charge. The cut is healed while the takeover's attempt is at the provider: the first worker's
late write of the success answer (the dangerous one: it would set the intent's outcome) reaches the
database and must be refused by the fence and recorded (audit event ``stale_write_refused``,
attempt ``fenced_out``, the answer kept). Expected: one charge at the provider, the intent
SUCCEEDED by the second attempt's answer or by a look-up, one fenced late write of a success.

``broker-cut``: the provider is slow to answer (``delay_after_effect``); while the claiming worker
waits for it, its path to the broker is cut and the broker's side of its connection ended (as
RabbitMQ ends it when heartbeats stop): the unacknowledged delivery goes back to the queue and
the other worker may receive it. The worker still records the answer through the database; the
path is healed. Expected: one charge, the intent SUCCEEDED.

Effects are counted in the provider's own ledger, never the ledger's.
"""

from __future__ import annotations

import functools
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psutil
from django.conf import settings
from django.db import connection

from console.lab.cluster import (
    HarnessError,
    LocalCluster,
    Process,
    database_url,
    stop_processes,
    wait_until,
)
from console.lab.crashlab.config import arguments_for
from console.lab.crashlab.partition_drill import PartitionNet, PartitionUnavailable
from operations.models import TERMINAL_STATUSES, Attempt, AuditEvent, Intent, Outcome
from operations.services import intent_submit

TENANT = "partition-drill"
PRINCIPAL = "agent:partition-drill"
#: The workers' lease and provider timeout (seconds): the provider deadline is then
#: ``min(timeout, lease / 2)`` = 3 s (``operations.engine.protocol.provider_deadline_seconds``).
LEASE_SECONDS = 6
PROVIDER_TIMEOUT_SECONDS = 3.0
#: How long the provider holds its success answer (db-cut) or delays applying (broker-cut),
#: seconds: time to cut the path after the effect (or the request) is seen, inside the deadline.
HOLD_SECONDS = 1.5
#: How long the provider holds the takeover attempt's answer (db-cut), seconds, inside the
#: deadline: the healed worker's late write lands meanwhile (``PartitionNet.rto_max_ms``).
SECOND_HOLD_SECONDS = 2.5
#: How long a namespaced worker may take to stop on SIGTERM at teardown before its process
#: group is SIGKILLed, seconds.
WORKER_GRACE_SECONDS = 2.0
#: Bound of every wait of the drill, seconds.
WAIT_SECONDS = 40.0
SCENARIOS = ("db-cut", "broker-cut")
ENDED = {*TERMINAL_STATUSES, Intent.Status.SUCCEEDED}


@dataclass
class PartitionResult:
    """One scenario's evidence.

    Attributes:
        effects: charges the provider's ledger holds for the scenario's reference.
        fenced_late_writes: the intent's ``stale_write_refused`` audit events (ids in ``evidence``).
        ended_by: ``second attempt`` / ``lookup`` / ``first attempt`` / ``operator`` (the
            outcome's source and attempt), ``-`` when the intent has no outcome.
        fences_at_provider: the fencing tokens the provider received, in order.
    """

    scenario: str
    intent_id: str = ""
    effects: int = 0
    fenced_late_writes: int = 0
    final_status: str = ""
    ended_by: str = "-"
    fences_at_provider: list[int] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def violations(self) -> list[str]:
        """What breaks the invariant or the case's expectation; empty when it held."""
        found = []
        if self.effects != 1:
            found.append(f"{self.effects} effects at the provider (expected exactly 1)")
        if self.final_status != Intent.Status.SUCCEEDED:
            found.append(f"intent ended {self.final_status or 'nowhere'} (expected SUCCEEDED)")
        if self.scenario == "db-cut":
            late = self.evidence.get("stale_write_refused", [])
            refused = [event["data"].get("attempt_no") for event in late]
            if 1 not in refused:
                found.append("the cut-off worker's late write was not recorded as refused by the fence")
            if any(number != 1 for number in refused):
                found.append(f"writes of attempts {refused} were refused: the late write got through")
            answers = [e["data"].get("provider_answer", {}).get("result") for e in late]
            if 1 in refused and Attempt.Result.SUCCEEDED not in answers:
                found.append(f"the refused late write carried {answers}, not the provider's success")
            if self.ended_by not in {"second attempt", "lookup"}:
                found.append(f"ended by {self.ended_by} (expected the second attempt or a look-up)")
        return found


def partition_table(results: list[PartitionResult]) -> str:
    """The drill's results as a Markdown table, one row per scenario."""
    lines = [
        "| scenario | effects at provider | fenced late writes recorded | final status | ended by "
        "| fences seen by provider | violations |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        fences = ", ".join(str(f) for f in r.fences_at_provider) or "-"
        problems = "; ".join(r.violations()) or "none"
        lines.append(
            f"| {r.scenario} | {r.effects} | {r.fenced_late_writes} | {r.final_status} | {r.ended_by} "
            f"| {fences} | {problems} |"
        )
    return "\n".join(lines)


def _swap_address(url: str, host: str, port: int) -> str:
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"))


def service_ports(sandbox_url: str) -> dict[str, int]:
    """The loopback TCP ports of the three services a worker uses, from this process's settings.

    Raises:
        PartitionUnavailable: the database is not reached over TCP on 127.0.0.1 (a socket
            directory, the embedded PostgreSQL), or the broker is not RabbitMQ or Redis on it.
    """
    conf = connection.settings_dict
    if str(conf.get("HOST") or "") not in {"127.0.0.1", "localhost"}:
        raise PartitionUnavailable("the partition drill needs DATABASE_URL on 127.0.0.1 over TCP")
    broker = urlsplit(settings.CELERY_BROKER_URL)
    if broker.scheme not in {"amqp", "pyamqp", "redis"} or broker.hostname not in {"127.0.0.1", "localhost"}:
        raise PartitionUnavailable(
            "the partition drill needs CELERY_BROKER_URL: RabbitMQ or Redis on 127.0.0.1"
        )
    default_port = 6379 if broker.scheme == "redis" else 5672
    return {
        "db": int(conf.get("PORT") or 5432),
        "broker": broker.port or default_port,
        "provider": urlsplit(sandbox_url).port or 80,
    }


class PartitionDrill:
    """Run the scenarios on ``cluster`` (its sandbox started, its queue used here).

    The cluster's environment is given the drill's lease and provider timeout; its beat is
    started by the drill. Workers are started inside ``net`` and stopped before it is torn down.

    Args:
        cluster: where the workers and beat run.
        net: the namespaces (``add_namespace`` is called for ``a`` and ``b``).
    """

    def __init__(self, cluster: LocalCluster, net: PartitionNet) -> None:
        self.cluster = cluster
        self.net = net
        self.provider = httpx.Client(base_url=cluster.sandbox_url, timeout=10)
        self.workers: dict[str, Process] = {}

    def __enter__(self) -> PartitionDrill:
        self.cluster.env["EFFECT_LEDGER_LEASE_SECONDS"] = str(LEASE_SECONDS)
        self.cluster.env["EFFECT_LEDGER_PROVIDER_TIMEOUT_SECONDS"] = str(PROVIDER_TIMEOUT_SECONDS)
        for label in ("a", "b"):
            self.net.add_namespace(label)
        try:
            self.cluster.start_beat()
            for label in ("a", "b"):
                self.workers[label] = self.cluster.start_worker(
                    f"partition-{label}",
                    wrap=functools.partial(self.net.command, label),
                    env=self._env(label),
                )
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        # Before the namespaces go: nothing left running in them (a worker whose database path
        # is cut may hang in its warm shutdown, so its group is SIGKILLed after a short grace).
        stop_processes(list(self.workers.values()), grace=WORKER_GRACE_SECONDS)
        self.provider.close()

    def _env(self, label: str) -> dict[str, str]:
        db_host, db_port = self.net.address(label, "db")
        broker_host, broker_port = self.net.address(label, "broker")
        provider_host, provider_port = self.net.address(label, "provider")
        return {
            "DATABASE_URL": database_url(host=db_host, port=db_port),
            "CELERY_BROKER_URL": _swap_address(settings.CELERY_BROKER_URL, broker_host, broker_port),
            "SANDBOX_PROVIDER_URL": f"http://{provider_host}:{provider_port}",
        }

    # --- scenarios ---------------------------------------------------------------------------

    def run(self, scenario: str) -> PartitionResult:
        """Run one of ``SCENARIOS`` and return its evidence.

        Raises:
            ValueError: an unknown scenario.
            HarnessError: a step did not happen in time (the worker never claimed, the
                provider never saw the request).
        """
        steps = {"db-cut": self._db_cut, "broker-cut": self._broker_cut}
        if scenario not in steps:
            raise ValueError(f"unknown partition scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
        started = time.monotonic()
        reference = f"{scenario}-{uuid.uuid4().hex[:10]}"
        result = steps[scenario](reference)
        result.seconds = round(time.monotonic() - started, 1)
        return result

    def _db_cut(self, reference: str) -> PartitionResult:
        self._fault("hold_answer", reference, HOLD_SECONDS)  # the first attempt: applied, success held
        self._fault("hold_answer", reference, SECOND_HOLD_SECONDS)  # the second: in flight a while
        intent = self._submit(reference)
        wait_until(lambda: self._effects(reference) > 0, WAIT_SECONDS, "the charge at the provider", 0.02)
        label = self._claimer(intent)
        self.net.cut(label, "db")  # the answer is still held: the worker cannot record it
        try:
            # Healed once the lease expired and the takeover's attempt is at the provider: the
            # late write lands while that attempt is RUNNING, where only the fence tells them apart.
            wait_until(
                lambda: any((r["fence"] or 0) > 1 for r in self._requests(reference)),
                WAIT_SECONDS,
                "the takeover's attempt at the provider",
                0.02,
            )
        finally:
            self.net.heal(label, "db")
        notes = [
            self._wait(lambda: self._late_writes(intent) > 0, "the late write to reach the database"),
            self._wait(lambda: self._status(intent) in ENDED, "the intent to end"),
        ]
        result = self._result("db-cut", intent, reference, partitioned=label)
        result.evidence["notes"] = [note for note in notes if note]
        chain = dict(AuditEvent.objects.filter(intent_id=intent.id).values_list("event", "seq"))
        result.evidence["late_write_before_second_answer"] = chain.get("stale_write_refused", 0) < chain.get(
            "succeeded", 0
        )
        return result

    def _broker_cut(self, reference: str) -> PartitionResult:
        self._fault("delay_after_effect", reference, HOLD_SECONDS)
        intent = self._submit(reference)
        wait_until(lambda: bool(self._requests(reference)), WAIT_SECONDS, "the request at the provider", 0.02)
        label = self._claimer(intent)
        self.net.cut(label, "broker")
        try:
            wait_until(
                lambda: self._status(intent) == Intent.Status.SUCCEEDED, WAIT_SECONDS, "the answer recorded"
            )
            self.net.drop_connections(label, "broker")  # the broker requeues what it had not acked
            time.sleep(2 * HOLD_SECONDS)  # a redelivery, if any, reaches the other worker
        finally:
            self.net.heal(label, "broker")
        result = self._result("broker-cut", intent, reference, partitioned=label)
        other = "b" if label == "a" else "a"
        result.evidence["duplicate_deliveries_at_other_worker"] = len(
            re.findall(r"succeeded in [0-9.]+s: 'duplicate'", self.workers[other].output())
        )
        return result

    # --- helpers -------------------------------------------------------------------------------

    def _wait(self, predicate: Callable[[], bool], what: str) -> str:
        """Wait (bounded) for what the verdict judges; on a timeout return a note, never raise:
        the row then shows the violation."""
        try:
            wait_until(predicate, WAIT_SECONDS, what, 0.1)
        except HarnessError as exc:
            return str(exc)
        return ""

    def _fault(self, mode: str, reference: str, seconds: float) -> None:
        body = {
            "product": "payments",
            "mode": mode,
            "delay_seconds": seconds,
            "match": {"reference": reference},
        }
        self.provider.post("/_sandbox/faults", json=body).raise_for_status()

    def _submit(self, reference: str) -> Intent:
        return intent_submit(
            tenant=TENANT,
            principal=PRINCIPAL,
            client_key=reference,
            action="payments.charge",
            arguments=arguments_for("payments", reference, 1),
            reference=reference,
        ).intent

    def _status(self, intent: Intent) -> str:
        return Intent.objects.values_list("status", flat=True).get(id=intent.id)

    def _claimer(self, intent: Intent) -> str:
        """Which namespace's worker holds the claim (its pool process's pid is in the owner)."""
        owner = Intent.objects.values_list("lease_owner", flat=True).get(id=intent.id)
        pid = int(owner.rsplit(":", 1)[-1].split("/")[0]) if owner else 0
        for label, process in self.workers.items():
            with_children = [
                process.popen.pid,
                *(c.pid for c in psutil.Process(process.popen.pid).children(True)),
            ]
            if pid in with_children:
                return label
        raise PartitionUnavailable(f"no drill worker holds the claim (owner {owner!r})")

    def _requests(self, reference: str) -> list[dict[str, Any]]:
        response = self.provider.get("/_sandbox/requests", params={"product": "payments"})
        response.raise_for_status()
        return [r for r in response.json()["requests"] if r.get("reference") == reference]

    def _effects(self, reference: str) -> int:
        response = self.provider.get("/ledger", params={"product": "payments", "reference": reference})
        response.raise_for_status()
        return sum(1 for e in response.json()["effects"] if e.get("kind") != "refund")

    def _late_writes(self, intent: Intent) -> int:
        return AuditEvent.objects.filter(intent_id=intent.id, event="stale_write_refused").count()

    def _result(self, scenario: str, intent: Intent, reference: str, *, partitioned: str) -> PartitionResult:
        outcome = Outcome.objects.filter(intent_id=intent.id).select_related("attempt").order_by("id").last()
        ended_by = "-"
        if outcome is not None:
            if outcome.source == Outcome.Source.PROVIDER and outcome.attempt is not None:
                number = outcome.attempt.attempt_no
                ended_by = {1: "first attempt", 2: "second attempt"}.get(number, f"attempt {number}")
            else:
                ended_by = {"reconciler": "lookup"}.get(outcome.source, outcome.source)
        refused = list(
            AuditEvent.objects.filter(intent_id=intent.id, event="stale_write_refused").values("id", "data")
        )
        attempts = list(
            Attempt.objects.filter(intent_id=intent.id)
            .order_by("attempt_no")
            .values("attempt_no", "fence", "result")
        )
        return PartitionResult(
            scenario=scenario,
            intent_id=str(intent.id),
            effects=self._effects(reference),
            fenced_late_writes=len(refused),
            final_status=self._status(intent),
            ended_by=ended_by,
            fences_at_provider=[r["fence"] for r in self._requests(reference)],
            evidence={
                "partitioned_worker": partitioned,
                "stale_write_refused": refused,
                "attempts": attempts,
            },
        )


def run_partition_drill(scenarios: tuple[str, ...] = SCENARIOS) -> list[PartitionResult]:
    """Start a sandbox, beat and two namespaced workers, run ``scenarios``, tear everything down.

    Raises:
        PartitionUnavailable: the machine cannot run it (``unavailable_reason``, the settings).
        HarnessError: a process did not start or a step did not happen in time.
    """
    cluster = LocalCluster(relay_period=0.5, reconcile_period=1.0)
    try:
        cluster.start_sandbox()
        cluster.use_queue_here()
        with PartitionNet(service_ports(cluster.sandbox_url)) as net, PartitionDrill(cluster, net) as drill:
            return [drill.run(scenario) for scenario in scenarios]
    finally:
        cluster.stop()
