"""On-CPU flame graphs (py-spy) of each process of the ledger: one gunicorn worker under
``POST /api/v1/intents``; then, side by side, one Celery worker (``-P solo``) executing those
intents against the sandbox provider and ``celery beat`` (which schedules the outbox relay, the
reconciler and the other periodic jobs the worker runs).

``manage.py bench --flame DIR`` writes ``DIR/api.svg``, ``DIR/worker.svg``, ``DIR/beat.svg``
(flame graphs), ``DIR/*.speedscope.json`` (https://www.speedscope.app) and ``DIR/*.txt``
(collapsed stacks), and prints each process's CPU over its recording and its top frames. Same
scratch databases as the benchmark, dropped at the end. py-spy attaches to the running process
(``--nonblocking``: the target is never paused, so the three recordings of one process, and
those of two processes, can run side by side); it needs ptrace permission on it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from django.conf import settings
from django.core.management import call_command
from django.db import connection

from console.lab.bench import cpu, database, e2e, services
from console.lab.bench.load import closed_loop
from console.lab.cluster import HarnessError, LocalCluster
from console.lab.sandbox_provider.database import sandbox_database_name

RATE = 200  # samples per second
FORMATS = {"flamegraph": ".svg", "speedscope": ".speedscope.json", "raw": ".txt"}
#: the recordings, by file name: what each process is
PROCESSES = {
    "api": "gunicorn worker, POST /api/v1/intents",
    "worker": "Celery worker (-P solo) executing the intents and the periodic jobs",
    "beat": "celery beat, scheduling the outbox relay and the periodic jobs",
}
NO_SAMPLES = "No stack counts found"  # py-spy's flamegraph writer, when nothing ran on CPU


def py_spy() -> str:
    """The py-spy executable beside this interpreter (the venv's), else the one on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if not found:
        raise HarnessError("py-spy is not installed (pip install -e '.[test]')")
    return found


def _sample(pid: int, out: Path, seconds: float) -> list[subprocess.Popen[bytes]]:
    """Start one ``py-spy record`` per format on ``pid`` for ``seconds``."""
    return [
        subprocess.Popen(
            [
                py_spy(),
                "record",
                "--pid",
                str(pid),
                "-r",
                str(RATE),
                "-d",
                str(int(seconds)),
                "--nonblocking",
                "-F",
                "-f",
                fmt,
                "-o",
                f"{out}{suffix}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        for fmt, suffix in FORMATS.items()
    ]


def _wait(recorders: list[subprocess.Popen[bytes]]) -> None:
    """Wait for the recorders; a flame graph of a process that never ran on CPU (an idle beat)
    is not a failure: its ``.txt`` is then empty."""
    for recorder in recorders:
        _, err = recorder.communicate(timeout=120)
        if recorder.returncode != 0 and NO_SAMPLES not in err.decode(errors="replace"):
            raise HarnessError(f"py-spy failed: {err.decode(errors='replace')[-1000:]}")


def _child_pid(pid: int) -> int:
    """The only child of ``pid`` (a gunicorn master's worker)."""
    children = psutil.Process(pid).children()
    if len(children) != 1:
        raise HarnessError(f"expected one worker under {pid}, found {len(children)}")
    return int(children[0].pid)


def top_frames(
    collapsed: Path, *, count: int = 12
) -> tuple[list[tuple[str, float, float]], list[tuple[str, float, float]]]:
    """(frame, self share, total share) in percent of all samples of a py-spy ``raw`` file (one
    ``frame;frame;... samples`` line per stack; a frame counts once per stack for its total):
    the ``count`` frames with the most total samples below the process's own scaffolding
    (frames in 85 % or more of the samples: the server's or the worker's main loop), and the
    ``count`` with the most self samples."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in collapsed.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        samples += int(n)
        own[frames[-1]] += int(n)
        for frame in set(frames):
            total[frame] += int(n)
    if not samples:
        return [], []

    def row(frame: str) -> tuple[str, float, float]:
        return frame, round(100 * own[frame] / samples, 1), round(100 * total[frame] / samples, 1)

    below = [f for f, t in total.most_common() if t < 0.85 * samples][:count]
    return [row(f) for f in below], [row(f) for f, _ in own.most_common(count)]


def summary(
    out_dir: Path, seconds: float, cpu_used: dict[str, tuple[float, float]] | None = None
) -> Iterator[str]:
    """The top-frames tables of each recording of ``PROCESSES`` found in ``out_dir`` (``api.txt``,
    ``worker.txt``, ``beat.txt``), as Markdown, each headed by the process's CPU over its
    recording when ``cpu_used`` has it (name -> (user + system CPU ms, wall seconds measured),
    ``console.lab.bench.cpu``)."""
    for name, what in PROCESSES.items():
        collapsed = out_dir / f"{name}.txt"
        if not collapsed.exists():
            continue
        by_total, by_self = top_frames(collapsed)
        ms, wall = (cpu_used or {}).get(name, (None, 0.0))
        used = (
            f"; {ms:,.0f} CPU ms in {wall:.1f} s = {ms / 1000 / wall:.2f} cores"
            if ms is not None and wall
            else ""
        )
        yield f"\n{name} ({what}): {out_dir / name}.svg (on-CPU, {RATE} samples/s, {seconds:.0f} s{used})\n"
        if not by_self:
            yield "no on-CPU samples"
            continue
        yield "| by total: frame | self % | total % |\n|---|---|---|"
        yield from (f"| `{frame}` | {mine} | {total} |" for frame, mine, total in by_total)
        yield "\n| by self: frame | self % | total % |\n|---|---|---|"
        yield from (f"| `{frame}` | {mine} | {total} |" for frame, mine, total in by_self)


def _used(reading: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """``cpu.Meter.stop``'s reading as name -> (CPU ms, wall seconds)."""
    return {name: (g["cpu_ms"], reading["seconds"]) for name, g in reading["groups"].items()}


def record(*, out_dir: str, seconds: float, database_name: str) -> Iterator[str]:
    """Record the flame graphs of ``PROCESSES`` into ``out_dir``; yield progress and the top-frames
    tables."""
    target_dir = Path(out_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    user_db = str(connection.settings_dict["NAME"])
    bench_db, sandbox_db = f"{database_name}_flame", sandbox_database_name(f"{database_name}_flame")
    for name in (bench_db, sandbox_db):
        database.recreate_database(name, admin_db=user_db)
    database.use_database(bench_db)
    cluster: LocalCluster | None = None
    try:
        call_command("migrate", verbosity=0)
        from operations.api.authentication import agent_create

        _, token = agent_create(name="flame", tenant="acme")
        cluster = LocalCluster(relay_period=2.0, reconcile_period=5.0)
        sandbox_url = services.start_sandbox(cluster, dsn=database.server_dsn(sandbox_db))
        settings.SANDBOX_PROVIDER_URL = sandbox_url
        cluster.use_queue_here()
        gunicorn, api_url = services.start_gunicorn(cluster, workers=1)
        target = e2e.Target(api_url, token, bench_db, sandbox_db, sandbox_url)
        send = e2e._charge_sender(target, f"flame-{uuid.uuid4().hex[:6]}")
        closed_loop(send, total=40, clients=2)  # warm up
        yield f"recording the gunicorn worker for {seconds:.0f} s (2 closed-loop clients)"
        api = _child_pid(gunicorn.popen.pid)
        meter = cpu.Meter([cpu.Group("api", (api,))])
        meter.start()
        recorders = _sample(api, target_dir / "api", seconds)
        load = threading.Thread(target=closed_loop, args=(send,), kwargs={"total": None, "clients": 2,
                                "duration": seconds + 1.0}, daemon=True)  # fmt: skip
        load.start()
        _wait(recorders)
        spent = _used(meter.stop())
        load.join()
        yield "recording a Celery worker (-P solo) executing the submitted intents, and beat, side by side"
        beat = cluster.start_beat()  # first: it starts up while the worker gets ready
        worker = cluster.start_worker("flame-w", pool="solo")
        cpu.wait_until_quiet(beat.popen.pid)  # its start-up (imports) is not what it costs
        meter = cpu.Meter([cpu.Group("worker", (worker.popen.pid,)), cpu.Group("beat", (beat.popen.pid,))])
        meter.start()
        recorders = [*_sample(worker.popen.pid, target_dir / "worker", seconds),
                     *_sample(beat.popen.pid, target_dir / "beat", seconds)]  # fmt: skip
        # keep the worker busy: the backlog of the API phase, topped up at the same rate
        load = threading.Thread(target=closed_loop, args=(send,), kwargs={"total": None, "clients": 1,
                                "duration": seconds}, daemon=True)  # fmt: skip
        load.start()
        _wait(recorders)
        spent |= _used(meter.stop())
        load.join()
        yield from summary(target_dir, seconds, spent)
    finally:
        if cluster is not None:
            cluster.stop()
        database.use_database(user_db)
        time.sleep(0.5)
        for name in (bench_db, sandbox_db):
            database.drop_database(name, admin_db=user_db)
        os.environ.pop("SANDBOX_PROVIDER_URL", None)
