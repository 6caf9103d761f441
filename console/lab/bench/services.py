"""The processes the benchmark starts beside ``LocalCluster``'s: the sandbox provider on its own
database (so its commits never count as the ledger's) and gunicorn serving the API."""

from __future__ import annotations

import socket
import sys

import httpx

from console.lab.bench.profile import BENCH_RATE
from console.lab.cluster import BASE_DIR, HarnessError, LocalCluster, Process, wait_until


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_sandbox(cluster: LocalCluster, *, dsn: str) -> str:
    """Start ``manage.py sandbox_provider --dsn <dsn>`` for ``cluster``; return its URL."""
    command = [sys.executable, str(BASE_DIR / "manage.py"), "sandbox_provider", "--host", "127.0.0.1",
               "--port", "0", "--dsn", dsn]  # fmt: skip
    process = Process("bench-sandbox", command, cluster.env)
    cluster.processes.append(process)
    marker = "sandbox provider listening on "
    wait_until(lambda: marker in process.output() or not process.alive(), 30, "the sandbox provider")
    if not process.alive():
        raise HarnessError(f"sandbox provider exited:\n{process.output()[-2000:]}")
    line = next(line for line in process.output().splitlines() if marker in line)
    cluster.sandbox_url = line.split(marker, 1)[1].strip()
    cluster.env["SANDBOX_PROVIDER_URL"] = cluster.sandbox_url
    return cluster.sandbox_url


def start_gunicorn(
    cluster: LocalCluster, *, workers: int, worker_class: str = "sync", threads: int = 1
) -> tuple[Process, str]:
    """Serve ``console.wsgi`` with ``console.lab.bench.settings`` (real routes plus
    ``/bench/trivial``, the rate limits on) on ``workers`` processes of ``worker_class`` (``sync``, or ``gthread``
    with ``threads`` threads each); return the process and its base URL."""
    port = free_port()
    # The rate limits on, as deployed, at a rate the load never reaches: their cost is measured.
    env = {**cluster.env, "DJANGO_SETTINGS_MODULE": "console.lab.bench.settings",
           "EFFECT_LEDGER_RATE_AGENT": BENCH_RATE, "EFFECT_LEDGER_RATE_TENANT": BENCH_RATE}  # fmt: skip
    command = [sys.executable, "-m", "gunicorn", "console.wsgi:application", "-b", f"127.0.0.1:{port}",
               "-w", str(workers), "-k", worker_class, "--threads", str(threads), "--backlog", "2048",
               "--log-level", "warning", "--no-control-socket"]  # fmt: skip
    process = Process("bench-gunicorn", command, env)
    cluster.processes.append(process)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if not process.alive():
            return True
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, 60, "gunicorn", interval=0.2)
    if not process.alive():
        raise HarnessError(f"gunicorn exited:\n{process.output()[-2000:]}")
    return process, url
