"""C29 (issue 36): the archiver killed with SIGKILL and run again loses nothing and archives
each intent once, while an agent submits through the web process and a worker executes.

Real processes: gunicorn, a Celery worker, the sandbox provider, and ``manage.py archive`` as a
child process in its own session (SIGKILLed with its process group). The settled intents are a
few dozen made through the services (the provider called for real, rejections by a person) and
copies of them (``bulk_copies``): every row copied with its identity renewed (id, keys,
reference, request hash, provider reference) and every audit chain re-hashed link by link with
``operations.audit.trail.event_hash``, so the copies' chains verify as the originals' do
(``audit_verify``). Making 10,000 through the services takes about 30 ms each (five minutes);
the copies take seconds.

``EFFECT_LEDGER_C29_INTENTS``: how many settled intents (10,000 by default).
``EFFECT_LEDGER_C29_SEED``: the seed of the kills' random delays (printed; set it to replay a run).
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
import socket
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from console.lab.cluster import Process, database_url
from operations.archive import files
from operations.archive.records import INTENT_TABLES
from operations.audit.chain_checks import audit_verify
from operations.audit.keys import signing_key_create
from operations.audit.signing import audit_checkpoint_create
from operations.audit.trail import GENESIS, event_hash
from operations.engine.protocol import execute_intent
from operations.idempotency import derive_provider_key, request_hash, sha256_hex
from operations.models import ArchivedIntent, ArchiveSegment, Intent
from operations.policies.rules import Policy, policy_for
from operations.services import intent_cancel, intent_reject
from operations.services.business import business_key
from operations.workers import outbox
from tests.factories import UserFactory, charge_arguments, make_agent, submit
from tests.support.workers import Cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

BASE_DIR = Path(__file__).resolve().parents[2]
INTENTS = int(os.environ.get("EFFECT_LEDGER_C29_INTENTS", "10000"))
SEED = int(os.environ.get("EFFECT_LEDGER_C29_SEED") or random.SystemRandom().randrange(1 << 30))
#: Intents per segment file and per delete transaction of the archiver under test: several
#: segments, many batches, so a kill has many places to land.
SEGMENT_INTENTS, DELETE_BATCH = 1500, 100
EMAIL = {"to": "ada@example.test", "subject": "Your receipt", "body": "Thanks"}
#: The ``application_name`` of the archiver's database session (libpq ``PGAPPNAME``): how the
#: test sees the session of a killed archiver end.
ARCHIVER_APP = "c29-archiver"


# --- processes ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def archive_dir(tmp_path: Path, settings: Any) -> Path:
    """The archive under ``tmp_path`` and a signing key for its manifests (here, and in every
    process ``archivers`` starts)."""
    key = tmp_path / "keys" / "audit.pem"
    signing_key_create(key)
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "ARCHIVE_DIR": str(tmp_path / "archive"),
        "AUDIT_SIGNING_KEY_FILE": str(key),
    }
    return tmp_path / "archive"


class Archivers:
    """Starts ``manage.py archive`` (or another command) as child processes, each in its own
    session so that SIGKILL reaches its whole group; kills what is left at the end of the test."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.started: list[Process] = []

    def start(self, name: str, command: str = "archive") -> Process:
        process = Process(name, [sys.executable, str(BASE_DIR / "manage.py"), command], self.env)
        self.started.append(process)
        return process

    def stop(self) -> None:
        for process in self.started:
            process.kill_group()


@pytest.fixture
def archivers(archive_dir: Path, settings: Any) -> Iterator[Archivers]:
    """Archivers on the test database and this test's archive: segments of ``SEGMENT_INTENTS``,
    delete batches of ``DELETE_BATCH`` (the test may change ``env`` before starting one)."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "EFFECT_LEDGER_ARCHIVE_DIR": str(archive_dir),
        "EFFECT_LEDGER_AUDIT_SIGNING_KEY_FILE": settings.EFFECT_LEDGER["AUDIT_SIGNING_KEY_FILE"],
        "EFFECT_LEDGER_AUDIT_CHECKPOINT_FILE": settings.EFFECT_LEDGER["AUDIT_CHECKPOINT_FILE"],
        "EFFECT_LEDGER_ARCHIVE_SEGMENT_INTENTS": str(SEGMENT_INTENTS),
        "EFFECT_LEDGER_ARCHIVE_DELETE_BATCH": str(DELETE_BATCH),
        "PGAPPNAME": ARCHIVER_APP,
        "PYTHONUNBUFFERED": "1",
    }
    started = Archivers(env)
    try:
        yield started
    finally:
        started.stop()


def finished(process: Process, timeout: float = 300) -> int:
    """Wait for ``process`` to end; its exit code."""
    wait_for(lambda: not process.alive(), timeout, f"{process.name} to end")
    process.kill_group()  # nothing left of it; closes its log
    return int(process.popen.returncode)


def archiver_sessions() -> int:
    """Database sessions of archivers on the test database (alive or killed, until PostgreSQL
    has ended them)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()",
            [ARCHIVER_APP],
        )
        return int(cursor.fetchone()[0])


def lease_expired() -> None:
    """Stand for the wait until a killed archiver's lease expires (``LEASE_SECONDS``, 60 s):
    the lease row is moved into the past, nothing else."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE operations_lease SET expires_at = statement_timestamp() - interval '1 second' "
            "WHERE name = 'archive'"
        )


@pytest.fixture
def web(cluster: Cluster, archive_dir: Path) -> Iterator[str]:
    """One gunicorn process on the test database, publishing to the cluster's queue."""
    port = free_port()
    env = {**cluster.env, "EFFECT_LEDGER_ARCHIVE_DIR": str(archive_dir)}
    command = [
        sys.executable,
        "-m",
        "gunicorn",
        "console.wsgi:application",
        "-b",
        f"127.0.0.1:{port}",
        "-w",
        "2",
    ]
    server = Process("web", command, env)
    try:
        wait_for(lambda: "Listening at: " in server.output() or not server.alive(), 30, "gunicorn")
        assert server.alive(), server.output()[-2000:]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop(timeout=5)


class Agent(threading.Thread):
    """An agent submitting a charge through the web process every ``period`` seconds until
    stopped; ``answers`` holds (status code, intent id) of each."""

    def __init__(self, url: str, token: str, period: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=15)
        self.period = period
        self.stopped = threading.Event()
        self.answers: list[tuple[int, str]] = []

    def run(self) -> None:
        n = 0
        while not self.stopped.is_set():
            body = {
                "action": "payments.charge",
                "arguments": charge_arguments(100 + n),
                "reference": f"live-{n}",
            }
            try:
                answer = self.client.post(
                    "/api/v1/intents", json=body, headers={"Idempotency-Key": f"live-{n}"}
                )
                self.answers.append((answer.status_code, str(answer.json().get("intent_id", answer.text))))
            except (httpx.HTTPError, ValueError) as exc:
                self.answers.append((0, repr(exc)))
            n += 1
            self.stopped.wait(self.period)

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=30)
        self.client.close()


# --- settled intents in bulk --------------------------------------------------------------------

#: The tables a copied intent has rows in (besides its own row and its audit events).
COPIED_TABLES = ("operations_outboxmessage", "operations_attempt", "operations_outcome")


def _rows(table: str, column: str, ids: list[uuid.UUID]) -> dict[str, list[dict[str, Any]]]:
    """Every row of ``table`` whose ``column`` is one of ``ids``, as ``to_jsonb`` renders it,
    by that id, in ``id`` order."""
    found: dict[str, list[dict[str, Any]]] = defaultdict(list)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {column}, to_jsonb(t)::text FROM {table} t WHERE {column} = ANY(%s) ORDER BY id", [ids]
        )
        for key, row in cursor.fetchall():
            found[str(key)].append(json.loads(row))
    return found


def _insert(table: str, rows: list[dict[str, Any]]) -> None:
    """Insert ``rows`` (dicts with the same keys, values as ``to_jsonb`` renders them)."""
    if not rows:
        return
    columns = ", ".join(rows[0])
    with connection.cursor() as cursor:
        for start in range(0, len(rows), 1000):
            cursor.execute(
                f"INSERT INTO {table} ({columns}) SELECT {columns} FROM jsonb_populate_recordset(NULL::{table}, %s::jsonb)",
                [json.dumps(rows[start : start + 1000])],
            )


@functools.cache
def _policy(action: str) -> Policy:
    return policy_for(action)


def _renewed(
    template: dict[str, Any], n: int, outcomes: list[dict[str, Any]], outbox_rows: list[dict[str, Any]]
) -> dict[str, str]:
    """What copy ``n`` of ``template`` (its intent row) changes: every value that identifies the
    intent, each derived the way ``intent_submit`` derives it."""
    tenant, principal, action = template["tenant"], template["principal"], template["action"]
    client_key, reference = f"c29-copy-{n:05d}", f"c29-copy-order-{n:05d}"
    provider_key = derive_provider_key(
        tenant=tenant,
        principal=principal,
        client_key=client_key,
        action=action,
        action_version=template["action_version"],
    )
    changes = {
        template["id"]: str(uuid.uuid4()),
        template["client_key"]: client_key,
        template["reference"]: reference,
        template["idempotency_key"]: provider_key,
        sha256_hex(template["idempotency_key"].encode()): sha256_hex(provider_key.encode()),
        template["request_hash"]: request_hash(
            tenant=tenant,
            action=action,
            action_version=template["action_version"],
            arguments=template["arguments"],
            reference=reference,
            fingerprint_version=template["fingerprint_version"],
        ),
    }
    if template["business_key"]:
        changes[template["business_key"]] = business_key(
            tenant=tenant,
            action=action,
            reference=reference,
            arguments=template["arguments"],
            policy=_policy(action),
        )
    for outcome in outcomes:
        if outcome["provider_reference"]:
            changes[outcome["provider_reference"]] = f"{outcome['provider_reference'][:-6]}{n:06d}"
    for row in outbox_rows:
        changes[row["id"]] = str(uuid.uuid4())
    return changes


def bulk_copies(templates: list[uuid.UUID], count: int) -> list[uuid.UUID]:
    """Write ``count`` copies of the settled intents ``templates`` (round robin) with every row
    about them (``COPIED_TABLES``, the audit chain): identities renewed (``_renewed``), attempt
    ids new, each chain re-hashed from its first event with ``event_hash``. Returns their ids.

    Templates must have rows in no other table of ``INTENT_TABLES`` (checked).
    """
    intents = {key: rows[0] for key, rows in _rows("operations_intent", "id", templates).items()}
    rows = {table: _rows(table, "intent_id", templates) for table in COPIED_TABLES}
    events = _rows("operations_auditevent", "intent_id", templates)
    with connection.cursor() as cursor:
        for table in set(INTENT_TABLES) - set(COPIED_TABLES):
            cursor.execute(f"SELECT count(*) FROM {table} WHERE intent_id = ANY(%s)", [templates])
            assert cursor.fetchone()[0] == 0, f"a template has rows in {table}: not copied here"
        attempts_needed = sum(
            len(rows["operations_attempt"][str(templates[n % len(templates)])]) for n in range(count)
        )
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence('operations_attempt', 'id')) FROM generate_series(1, %s)",
            [attempts_needed],
        )
        attempt_ids = iter(row[0] for row in cursor.fetchall())
    new: dict[str, list[dict[str, Any]]] = defaultdict(list)
    ids = []
    for n in range(count):
        key = str(templates[n % len(templates)])
        changes = _renewed(
            intents[key], n, rows["operations_outcome"][key], rows["operations_outboxmessage"][key]
        )
        pattern = re.compile("|".join(re.escape(old) for old in sorted(changes, key=len, reverse=True)))

        def renew(
            row: dict[str, Any], changes: dict[str, str] = changes, pattern: re.Pattern[str] = pattern
        ) -> dict[str, Any]:
            renewed: dict[str, Any] = json.loads(pattern.sub(lambda m: changes[m.group()], json.dumps(row)))
            return renewed

        intent = renew(intents[key])
        ids.append(uuid.UUID(intent["id"]))
        new["operations_intent"].append(intent)
        new["operations_outboxmessage"].extend(renew(row) for row in rows["operations_outboxmessage"][key])
        attempt_of = {}
        for row in rows["operations_attempt"][key]:
            attempt = renew(row)
            attempt_of[row["id"]] = attempt["id"] = next(attempt_ids)
            new["operations_attempt"].append(attempt)
        for row in rows["operations_outcome"][key]:
            outcome = renew(row)
            del outcome["id"]
            outcome["attempt_id"] = attempt_of.get(row["attempt_id"])
            new["operations_outcome"].append(outcome)
        previous = GENESIS
        for row in events[key]:
            event = renew(row)
            del event["id"]
            # hashed as the verifier reads it back: the stored time's isoformat()
            created_at = datetime.fromisoformat(event["created_at"]).astimezone(UTC).isoformat()
            event["prev_hash"] = previous
            event["hash"] = previous = event_hash(
                intent_id=event["intent_id"],
                seq=event["seq"],
                event=event["event"],
                from_status=event["from_status"],
                to_status=event["to_status"],
                actor=event["actor"],
                reason=event["reason"],
                data=event["data"],
                created_at=created_at,
                prev_hash=event["prev_hash"],
            )
            new["operations_auditevent"].append(event)
    with transaction.atomic():
        for table in ("operations_intent", *COPIED_TABLES, "operations_auditevent"):
            _insert(table, new[table])
    return ids


def aged(ids: list[uuid.UUID], day: datetime, rng: random.Random) -> None:
    """Settled (last changed) at a random time of the UTC ``day``: past the 90 days' retention."""
    offsets = [rng.uniform(0, 86399) for _ in ids]
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE operations_intent i SET updated_at = %s + make_interval(secs => u.secs) "
            "FROM unnest(%s::uuid[], %s::float8[]) AS u(id, secs) WHERE i.id = u.id",
            [day, ids, offsets],
        )
        assert cursor.rowcount == len(ids)


def a_day_long_ago() -> datetime:
    """Midnight UTC starting the day 100 days ago: past the default 90 days' retention all day."""
    return (timezone.now() - timedelta(days=100)).replace(hour=0, minute=0, second=0, microsecond=0)


def executed(intent: Intent) -> Intent:
    execute_intent(intent.id)
    intent.refresh_from_db()
    return intent


# --- the invariants -----------------------------------------------------------------------------


@dataclass
class ArchiveView:
    """What the test knows of the archive: the intent ids in each committed segment file (read
    once: a committed file never changes)."""

    records: dict[str, set[str]] = field(default_factory=dict)

    def ids_in(self, name: str) -> set[str]:
        if name not in self.records:
            self.records[name] = {record["intent"]["id"] for record in files.records_read_file(name)}
        return self.records[name]


def nothing_lost(originals: set[str], view: ArchiveView) -> Counter[str]:
    """Check, in one snapshot, that each of ``originals`` is live or archived in its segment's
    file (never neither), never both live and archived, and indexed ``pending`` or
    ``superseded`` only while live. Returns how many are live, pending, archived."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        cursor.execute("SELECT id::text FROM operations_intent WHERE id = ANY(%s::uuid[])", [list(originals)])
        live = {row[0] for row in cursor.fetchall()}
        cursor.execute(
            "SELECT a.intent_id::text, a.state, s.file_name FROM operations_archivedintent a "
            "JOIN operations_archivesegment s ON s.id = a.segment_id WHERE a.intent_id = ANY(%s::uuid[])",
            [list(originals)],
        )
        index = {intent_id: (state, name) for intent_id, state, name in cursor.fetchall()}
    archived = {i for i, (state, _) in index.items() if state == ArchivedIntent.State.ARCHIVED}
    assert not originals - live - archived, (
        f"{len(originals - live - archived)} intents neither live nor archived"
    )
    assert not live & archived, f"{len(live & archived)} intents both live and archived"
    indexed_only = {i for i, (state, _) in index.items() if state != ArchivedIntent.State.ARCHIVED} - live
    assert not indexed_only, f"{len(indexed_only)} intents pending or superseded without their live rows"
    missing = [i for i in archived if i not in view.ids_in(index[i][1])]
    assert not missing, f"{len(missing)} archived intents not in their segment's file, e.g. {missing[:3]}"
    counts = Counter(state for state, _ in index.values())
    counts["live"] = len(live)
    return counts


def uncommitted_files(archive_dir: Path) -> list[str]:
    """Segment files and manifests (and ``.partial`` files) no committed segment names: what a
    run killed before its segment's commit left (set aside by the next run)."""
    committed = set(ArchiveSegment.objects.values_list("file_name", flat=True))
    committed |= {name.removesuffix(files.DATA_SUFFIX) + files.MANIFEST_SUFFIX for name in committed}
    return [
        path.relative_to(archive_dir).as_posix()
        for path in archive_dir.glob("*/intents-*")
        if path.relative_to(archive_dir).as_posix() not in committed
    ]


def segment_files(archive_dir: Path) -> list[Path]:
    """Every segment data file of the archive (what ``files_set_aside`` moved away excluded)."""
    return [
        path for path in archive_dir.rglob(f"*{files.DATA_SUFFIX}") if files.SET_ASIDE_DIR not in path.parts
    ]


# --- the kills ----------------------------------------------------------------------------------

PROGRESS = re.compile(r"^segment (\d+) \(.*\): (\d+) archived.*, (\d+) to go$", re.M)


def _progress_lines(process: Process) -> list[tuple[int, int]]:
    return [(int(segment), int(left)) for segment, _, left in PROGRESS.findall(process.output())]


def _written_since(archive: Path, started: float) -> bool:
    """Whether a ``.partial`` segment file was opened since ``started`` (a stale one a killed run
    left stays until the next run sets it aside)."""
    for path in archive.glob(f"*/*{files.PARTIAL}"):
        try:
            if path.stat().st_mtime >= started:
                return True
        except FileNotFoundError:  # renamed to its name meanwhile
            continue
    return False


#: Where a kill aims (each then waits a random delay): ``writing`` once this run opens a
#: ``.partial`` segment file; ``deleting`` once a delete batch of the run has committed;
#: ``between`` once a segment's last batch has; ``anytime`` from the start.
AIMS: dict[str, Callable[[Process, Path, float], bool]] = {
    "writing": lambda process, archive, started: _written_since(archive, started),
    "deleting": lambda process, archive, started: bool(_progress_lines(process)),
    "between": lambda process, archive, started: any(left == 0 for _, left in _progress_lines(process)),
    "anytime": lambda process, archive, started: True,
}
#: Seconds (low, high) of the random delay after each aim is reached.
DELAYS = {"writing": (0.0, 0.4), "deleting": (0.0, 0.5), "between": (0.0, 0.05), "anytime": (0.3, 4.0)}


def killed(
    process: Process, archive_dir: Path, aim: str, rng: random.Random, started: float
) -> tuple[float, bool]:
    """Wait for ``aim`` (``AIMS``), then a random delay, then SIGKILL the archiver's process
    group. ``started``: ``time.time()`` when it was started. Returns (the delay, whether it was
    still running when killed)."""
    wait_for(
        lambda: AIMS[aim](process, archive_dir, started) or not process.alive(),
        120,
        f"the archiver to be {aim}",
        0.005,
    )
    delay = rng.uniform(*DELAYS[aim])
    time.sleep(delay)
    alive = process.alive()
    process.kill_group()
    return delay, alive


# --- C29 ----------------------------------------------------------------------------------------


@dataclass
class KeptRequest:
    """A request the agent submitted under a key it keeps: the body, the intent, the API's answer
    once executed."""

    body: dict[str, Any]
    intent_id: str = ""
    answer: dict[str, Any] = field(default_factory=dict)


def agent_requests_executed(client: httpx.Client) -> dict[str, KeptRequest]:
    """Charges (one declined) and an email submitted through the web process, executed by the
    worker at the provider; by Idempotency-Key."""
    kept = {
        f"c29-known-{n}": KeptRequest(
            {"action": "payments.charge", "arguments": charge_arguments(2000 + n), "reference": f"known-{n}"}
        )
        for n in range(6)
    }
    kept["c29-known-declined"] = KeptRequest(
        {
            "action": "payments.charge",
            "arguments": charge_arguments(customer="cus_declined"),
            "reference": "known-declined",
        }
    )
    kept["c29-known-email"] = KeptRequest(
        {"action": "email.send", "arguments": EMAIL, "reference": "known-email"}
    )
    for key, request in kept.items():
        answer = client.post("/api/v1/intents", json=request.body, headers={"Idempotency-Key": key})
        assert answer.status_code == 201, answer.text
        request.intent_id = answer.json()["intent_id"]
    ids = [request.intent_id for request in kept.values()]
    wait_for(
        lambda: (
            set(Intent.objects.filter(id__in=ids).values_list("status", flat=True)) <= {"SUCCEEDED", "FAILED"}
        ),
        60,
        "the worker to execute the agent's intents",
    )
    for request in kept.values():
        request.answer = client.get(f"/api/v1/intents/{request.intent_id}").json()
    assert [r.answer["status"] for r in kept.values()] == ["SUCCEEDED"] * 6 + ["FAILED", "SUCCEEDED"]
    return kept


def settled_through_the_services() -> tuple[list[Intent], list[Intent]]:
    """Settled intents made here through the services (nothing handed to the broker: call with
    ``outbox._publish`` silenced): the templates of ``bulk_copies`` (charges and emails executed
    at the provider, declined charges, cancelled ones), and gated charges a person rejected
    (their approval notices are rows no copy has)."""
    templates = [
        executed(submit(arguments=charge_arguments(1000 + n), reference=f"c29-tpl-{uuid.uuid4().hex}"))
        for n in range(24)
    ]
    templates += [
        executed(submit(action="email.send", arguments=EMAIL, reference=f"c29-tpl-{uuid.uuid4().hex}"))
        for _ in range(6)
    ]
    declined = charge_arguments(customer="cus_declined")
    templates += [
        executed(submit(arguments=declined, reference=f"c29-tpl-{uuid.uuid4().hex}")) for _ in range(6)
    ]
    for _ in range(6):
        ready = submit(reference=f"c29-tpl-{uuid.uuid4().hex}")
        templates.append(intent_cancel(intent_id=ready.id, actor="agent:agent-1", reason="not needed"))
    assert Counter(t.status for t in templates) == {"SUCCEEDED": 30, "FAILED": 6, "CANCELLED": 6}
    approver = UserFactory(username="alice", groups=["approver"])
    rejected = []
    for n in range(4):
        gated = submit(arguments=charge_arguments(900_000 + n), reference=f"c29-rejected-{n}")
        rejected.append(
            intent_reject(
                intent_id=gated.id, user=approver, request_hash=gated.request_hash, reason="too much"
            )
        )
    return templates, rejected


def open_and_holding(sandbox: Any) -> dict[uuid.UUID, str]:
    """Intents the archiver must leave alone, by id, with their status: READY (its message never
    handed to the broker), AWAITING_APPROVAL, UNKNOWN (the provider applied it and the answer
    was lost), HELD behind a SUCCEEDED charge of the same order (that one stays too)."""
    ready = submit(reference="c29-open-ready")
    awaiting = submit(arguments=charge_arguments(950_000), reference="c29-open-awaiting")
    sandbox.inject("crash_after_effect", product="email")
    unknown = executed(submit(action="email.send", arguments=EMAIL, reference="c29-open-unknown"))
    blocker = executed(submit(arguments=charge_arguments(3000), reference="c29-order-held"))
    held = submit(arguments=charge_arguments(3000), reference="c29-order-held")
    held.refresh_from_db()
    assert held.held_behind_id == blocker.id
    kept = {i.id: i.status for i in (ready, awaiting, unknown, held, blocker)}
    assert list(kept.values()) == ["READY", "AWAITING_APPROVAL", "UNKNOWN", "HELD", "SUCCEEDED"]
    return kept


#: Where the kills of the C29 run aim, in order (``AIMS``).
KILLS = ("writing", "deleting", "between", "anytime", "writing", "deleting")


def archived_through_kills(
    archivers: Archivers, archive_dir: Path, originals: set[str], rng: random.Random
) -> list[tuple[str, float, dict[str, int], int]]:
    """Run the archiver and SIGKILL it at each of ``KILLS``, checking ``nothing_lost`` after
    each, then once more to the end. Returns (aim, delay, counts, uncommitted files) per kill."""
    view = ArchiveView()
    kills = []
    for n, aim in enumerate(KILLS):
        started = time.time()
        run = archivers.start(f"archive-{n}")
        delay, alive = killed(run, archive_dir, aim, rng, started)
        if not alive:  # it finished first: nothing left to kill
            assert run.popen.returncode == 0, run.output()[-3000:]
            break
        wait_for(lambda: archiver_sessions() == 0, 60, "PostgreSQL to end the killed archiver's session")
        # after every kill: nothing is lost, nothing is both deleted and unarchived
        counts = nothing_lost(originals, view)
        left = uncommitted_files(archive_dir)
        kills.append((aim, round(delay, 3), dict(counts), len(left)))
        print(
            f"C29: kill {n} ({aim}, +{delay:.3f} s, {time.time() - started:.1f} s after its start): {dict(counts)}, {len(left)} uncommitted files"
        )
        if n == 0:
            # a run right after a kill is refused: the killed run's lease stands until it expires
            refused = archivers.start("archive-refused")
            assert finished(refused) == 2 and "another archiver holds the archive lease" in refused.output()
        lease_expired()
    last = archivers.start("archive-last")
    assert finished(last) == 0, last.output()[-3000:]
    print(last.output()[-300:])
    nothing_lost(originals, view)
    return kills


def test_c29_archiving_a_day_of_settled_intents_killed_at_random_points_loses_nothing_and_archives_each_once(
    cluster: Cluster, sandbox: Any, web: str, archive_dir: Path, archivers: Archivers, monkeypatch: Any
) -> None:
    rng = random.Random(SEED)
    print(f"\nC29: EFFECT_LEDGER_C29_SEED={SEED} EFFECT_LEDGER_C29_INTENTS={INTENTS}")
    began = time.monotonic()
    cluster.worker("w1", concurrency=2)
    _, token = make_agent()
    client = httpx.Client(base_url=web, headers={"Authorization": f"Bearer {token}"}, timeout=15)
    # given: requests the agent submitted through the web process under keys it keeps, executed
    kept_requests = agent_requests_executed(client)
    # and: intents settled through the services, and copies of some up to INTENTS in all
    monkeypatch.setattr(outbox, "_publish", lambda *args, **kwargs: None)
    templates, rejected = settled_through_the_services()
    real = [uuid.UUID(r.intent_id) for r in kept_requests.values()] + [i.id for i in (*templates, *rejected)]
    copies = bulk_copies([t.id for t in templates], max(0, INTENTS - len(real)))
    settled_ids = real + copies
    # and: open intents, and a settled one an open one is held behind
    kept = open_and_holding(sandbox)
    monkeypatch.undo()
    # and: all of them last changed on one UTC day about 100 days ago, their chains intact and
    # signed in a checkpoint
    aged([*settled_ids, *kept], a_day_long_ago(), rng)
    assert list(audit_verify()) == []  # the copies' chains too
    assert audit_checkpoint_create() is not None
    print(
        f"C29: {len(settled_ids)} settled intents ({len(real)} through the services) set up in {time.monotonic() - began:.1f} s"
    )
    originals = {str(i) for i in (*settled_ids, *kept)}
    agent = Agent(web, token)
    agent.start()
    try:
        # when: the archiver runs while the agent submits and the worker executes, killed with
        # SIGKILL at random points, run again after each kill, then to the end
        archiving = time.monotonic()
        kills = archived_through_kills(archivers, archive_dir, originals, rng)
        print(f"C29: archived through {len(kills)} kills in {time.monotonic() - archiving:.1f} s")
    finally:
        agent.stop()
    # then: nothing lost after any kill (checked in archived_through_kills), and in the end every
    # settled intent archived, none of them live, each in exactly one segment file of the
    # archive (what was set aside aside)
    assert len(kills) >= 3, f"the archiver finished before most kills: {kills}"
    states = ArchivedIntent.objects.filter(intent_id__in=settled_ids).values_list("state", flat=True)
    assert Counter(states) == {"archived": len(settled_ids)}
    assert not Intent.objects.filter(id__in=settled_ids).exists()
    assert set(ArchiveSegment.objects.values_list("state", flat=True)) == {"complete"}
    names = sorted(path.relative_to(archive_dir).as_posix() for path in segment_files(archive_dir))
    assert names == sorted(ArchiveSegment.objects.values_list("file_name", flat=True))
    found = Counter(record["intent"]["id"] for name in names for record in files.records_read_file(name))
    assert found == Counter({str(i): 1 for i in settled_ids})
    # and: the open ones, and the settled one an open one is held behind, live and unchanged
    assert dict(Intent.objects.filter(id__in=kept).values_list("id", "status")) == kept
    assert not ArchivedIntent.objects.filter(intent_id__in=kept).exists()
    # and: the live chains and the archive verify against the checkpoint signed before archiving
    verifier = archivers.start("verify-audit", command="verify_audit")
    assert finished(verifier) == 0, verifier.output()[-3000:]
    print(f"C29: {verifier.output()[-600:]}")
    # and: the agent was served all along, and the worker executed what it submitted
    assert agent.answers and {code for code, _ in agent.answers} == {201}, agent.answers[-5:]
    submitted = [intent_id for _, intent_id in agent.answers]
    wait_for(
        lambda: not Intent.objects.filter(id__in=submitted).exclude(status="SUCCEEDED").exists(),
        60,
        "the agent's charges",
    )
    print(
        f"C29: the agent submitted {len(submitted)} intents meanwhile; {time.monotonic() - began:.1f} s in all"
    )
    # when: the agent retries one of its archived requests under the same key
    request = kept_requests["c29-known-3"]
    effects, requests = len(sandbox.ledger()), sandbox.request_count()
    again = client.post("/api/v1/intents", json=request.body, headers={"Idempotency-Key": "c29-known-3"})
    # then: the archived answer, replayed; nothing reached the provider
    assert again.status_code == 201, again.text
    archived = ArchivedIntent.objects.select_related("segment").get(intent_id=request.intent_id)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["Effect-Ledger-Archived"] == archived.segment.file_name
    replayed = again.json()
    assert (replayed["intent_id"], replayed["status"]) == (request.intent_id, "SUCCEEDED")
    assert (
        replayed["outcome"] == request.answer["outcome"]
        and replayed["request_hash"] == request.answer["request_hash"]
    )
    assert not Intent.objects.filter(id=request.intent_id).exists()
    assert (len(sandbox.ledger()), sandbox.request_count()) == (effects, requests)
    client.close()


def test_c29_a_run_killed_while_its_delete_batch_holds_row_locks_deletes_nothing(
    sandbox: Any, archive_dir: Path, archivers: Archivers, monkeypatch: Any
) -> None:
    # given: 30 settled intents past retention, deleted 10 to a transaction; another session
    # holds their outbox rows locked, so the archiver's first batch, its intents locked
    # FOR UPDATE, waits inside its DELETE
    monkeypatch.setattr(outbox, "_publish", lambda *args, **kwargs: None)
    intents = [
        executed(submit(arguments=charge_arguments(100 + n), reference=f"lock-{n}")) for n in range(20)
    ]
    intents += [
        intent_cancel(intent_id=submit(reference=f"lock-c-{n}").id, actor="agent:agent-1") for n in range(10)
    ]
    ids = [intent.id for intent in intents]
    aged(ids, a_day_long_ago(), random.Random(SEED))
    rows_before = rows_about(ids)
    archivers.env["EFFECT_LEDGER_ARCHIVE_DELETE_BATCH"] = "10"
    dsn = database_url()
    with psycopg.connect(dsn) as holder, psycopg.connect(dsn, autocommit=True) as probe:
        holder.execute("SELECT 1 FROM operations_outboxmessage WHERE intent_id = ANY(%s) FOR UPDATE", [ids])
        run = archivers.start("archive-locked")
        wait_for(
            lambda: archiver_waits_for_a_lock(probe) or not run.alive(), 60, "the archiver's delete to wait"
        )
        assert run.alive(), run.output()[-3000:]
        unlocked = probe.execute(
            "SELECT id FROM operations_intent WHERE id = ANY(%s) FOR UPDATE SKIP LOCKED", [ids]
        )
        assert len(set(ids) - {row[0] for row in unlocked.fetchall()}) == 10  # its batch, locked
        # when: it is killed with SIGKILL while it holds them
        run.kill_group()
        # then: its session still waits, its transaction open: nothing of it is seen
        assert archiver_sessions() == 1
        assert nothing_lost({str(i) for i in ids}, ArchiveView()) == Counter({"pending": 30, "live": 30})
        # when: the other session lets go: the dead client's DELETE runs, and its transaction
        # ends with its connection
        holder.rollback()
        wait_for(lambda: archiver_sessions() == 0, 60, "PostgreSQL to end the killed archiver's session")
    # then: nothing was deleted; every row is there, every intent indexed pending
    assert rows_about(ids) == rows_before
    assert set(ArchivedIntent.objects.filter(intent_id__in=ids).values_list("state", flat=True)) == {
        "pending"
    }
    # when: run again once the killed run's lease has expired
    lease_expired()
    again = archivers.start("archive-again")
    # then: every intent archived, once, in the one segment file
    assert finished(again) == 0, again.output()[-3000:]
    assert not Intent.objects.filter(id__in=ids).exists()
    states = ArchivedIntent.objects.filter(intent_id__in=ids).values_list("state", flat=True)
    assert Counter(states) == {"archived": 30}
    (name,) = [path.relative_to(archive_dir).as_posix() for path in segment_files(archive_dir)]
    found = Counter(record["intent"]["id"] for record in files.records_read_file(name))
    assert found == Counter({str(i): 1 for i in ids})


def archiver_waits_for_a_lock(probe: psycopg.Connection[Any]) -> bool:
    """Whether an archiver's session on the test database waits for a lock."""
    row = probe.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND datname = current_database() "
        "AND wait_event_type = 'Lock'",
        [ARCHIVER_APP],
    ).fetchone()
    return bool(row and row[0])


def rows_about(ids: list[uuid.UUID]) -> dict[str, int]:
    """Rows naming the intents ``ids``, per table (the intents' own rows included)."""
    counts = {}
    with connection.cursor() as cursor:
        for table in (*INTENT_TABLES, "operations_auditevent"):
            cursor.execute(f"SELECT count(*) FROM {table} WHERE intent_id = ANY(%s)", [ids])
            counts[table] = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM operations_intent WHERE id = ANY(%s)", [ids])
        counts["operations_intent"] = cursor.fetchone()[0]
    return counts
