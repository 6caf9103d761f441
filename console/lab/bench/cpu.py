"""CPU accounting of the benchmark's processes: user + system CPU milliseconds each group of
process trees spent between two samples, read from ``/proc`` by psutil.

A tree is a root pid and its descendants. Its CPU at a sample is the sum, over every process of
the tree alive at that moment, of ``user + system + children_user + children_system``
(``psutil.Process.cpu_times``): the kernel adds a child's CPU (and that of the children it
reaped) to its parent's ``children_*`` when the parent reaps it, so a process that ran and
exited between the two samples (a PostgreSQL backend whose connection closed, a recycled pool
child, a gunicorn worker restarted) is still counted, through the live ancestor that reaped it,
without sampling often. Each process is counted once: alive it shows its own times, reaped they
are in its reaper's. Not counted: a descendant reaped by a process outside the tree (orphaned to
init) and, if the root itself exits before the second sample, everything since the first (the
group is then marked incomplete). A child ending in the microseconds between reading it and its
parent may be missed or counted twice; the error is that child's CPU, once.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

WEB = "web (gunicorn master and workers)"
CELERY = "Celery workers (with pool children)"
BEAT = "beat"
SANDBOX = "sandbox provider"
POSTGRES = "PostgreSQL server (postmaster and children, every database)"
BROKER = "broker"
LOAD = "load generator (the bench process, its threads only)"


@dataclass(frozen=True)
class Group:
    """Process trees measured together under ``name``.

    Attributes:
        pids: the roots (their descendants are found at each sample).
        ours: the ledger's (or the bare task's) own processes, summed into the ratio; the
            shared infrastructure (provider, database, broker, load generator) is not.
        descendants: count the roots' descendants and reaped children; False counts a process
            alone (the bench process, whose children are the cluster's own processes).
    """

    name: str
    pids: tuple[int, ...]
    ours: bool = True
    descendants: bool = True


def tree_cpu_seconds(pid: int, *, descendants: bool = True) -> float:
    """User + system CPU seconds ``pid`` has used since it started; with ``descendants``, plus
    every live descendant's and every reaped child's (see the module's docstring).

    Raises:
        psutil.NoSuchProcess: ``pid`` is gone.
    """
    root = psutil.Process(pid)
    times = root.cpu_times()
    if not descendants:
        return float(times.user + times.system)
    total = times.user + times.system + times.children_user + times.children_system
    for child in root.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            t = child.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return float(total)


def wait_until_quiet(pid: int, *, below: float = 0.05, window: float = 1.0, timeout: float = 60.0) -> bool:
    """Wait until the tree of ``pid`` used less than ``below`` cores (CPU seconds per second)
    over ``window`` seconds: a process done starting up (importing, connecting). Returns False
    after ``timeout`` seconds, or when the process is gone, without raising."""
    deadline = time.monotonic() + timeout
    try:
        last = tree_cpu_seconds(pid)
        while time.monotonic() < deadline:
            time.sleep(window)
            now = tree_cpu_seconds(pid)
            if now - last < below * window:
                return True
            last = now
    except psutil.NoSuchProcess:
        pass
    return False


def _tree_size(pid: int, descendants: bool) -> int:
    with contextlib.suppress(psutil.NoSuchProcess):
        return 1 + (len(psutil.Process(pid).children(recursive=True)) if descendants else 0)
    return 0


class Meter:
    """CPU of ``groups`` between ``start()`` and ``stop()``.

    ``stop()`` returns ``{"seconds": wall seconds between the samples, "groups": {name:
    {"cpu_ms": CPU milliseconds, "processes": processes in the trees at the end, "ours": bool,
    "complete": False when a root exited in between (its CPU since start is then missing)}}}``.
    """

    def __init__(self, groups: Iterable[Group]) -> None:
        self.groups = [g for g in groups if g.pids]
        self._before: dict[tuple[str, int], float] = {}
        self._began = 0.0

    def _sample(self) -> dict[tuple[str, int], float]:
        seen = {}
        for group in self.groups:
            for pid in group.pids:
                with contextlib.suppress(psutil.NoSuchProcess):
                    seen[group.name, pid] = tree_cpu_seconds(pid, descendants=group.descendants)
        return seen

    def start(self) -> None:
        """Take the first sample."""
        self._began = time.monotonic()
        self._before = self._sample()

    def stop(self) -> dict[str, Any]:
        """Take the second sample; the difference per group (shape in the class docstring)."""
        after, seconds = self._sample(), time.monotonic() - self._began
        out: dict[str, Any] = {}
        for group in self.groups:
            keys = [(group.name, pid) for pid in group.pids]
            both = [k for k in keys if k in self._before and k in after]
            out[group.name] = {
                "cpu_ms": round(1000 * sum(after[k] - self._before[k] for k in both), 1),
                "processes": sum(_tree_size(pid, group.descendants) for pid in group.pids),
                "ours": group.ours,
                "complete": len(both) == len(keys),
            }
        return {"seconds": round(seconds, 3), "groups": out}


def per_unit(reading: dict[str, Any], units: int) -> dict[str, Any]:
    """``reading`` (``Meter.stop``) with ``ms_per_unit`` (CPU ms per intent or per effect) and
    ``cores`` (CPU seconds per wall second) added to each group, and the sum of our own
    groups as ``ours_ms_per_unit``; ``units`` is the intents or effects done in between."""
    wall = max(reading["seconds"], 1e-9)
    groups = {
        name: {**g, "ms_per_unit": round(g["cpu_ms"] / max(units, 1), 2),
               "cores": round(g["cpu_ms"] / 1000 / wall, 2)}
        for name, g in reading["groups"].items()
    }  # fmt: skip
    ours = sum(g["cpu_ms"] for g in groups.values() if g["ours"])
    return {**reading, "units": units, "groups": groups, "ours_ms_per_unit": round(ours / max(units, 1), 2)}


def postmaster_pid(backend_pid: int) -> int | None:
    """The PostgreSQL postmaster serving the backend ``backend_pid`` (``SELECT pg_backend_pid()``),
    or None when that pid is not a postgres process of this machine (a remote server)."""
    try:
        backend = psutil.Process(backend_pid)
        parent = backend.parent()
        if (
            parent is None
            or not backend.name().startswith("postgres")
            or not parent.name().startswith("postgres")
        ):
            return None
        return int(parent.pid)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def broker_group(broker_url: str) -> Group | None:
    """The local broker server of ``broker_url`` as a shared group: RabbitMQ's ``beam.smp``
    (amqp) or ``redis-server``; None when none runs here (or another transport)."""
    scheme = broker_url.split("://", 1)[0]
    name, label = {"amqp": ("beam.smp", "RabbitMQ (beam.smp)"), "pyamqp": ("beam.smp", "RabbitMQ (beam.smp)"),
                   "redis": ("redis-server", "Redis")}.get(scheme, ("", ""))  # fmt: skip
    if not name:
        return None
    pids = [proc.pid for proc in psutil.process_iter(["name"]) if proc.info["name"] == name]
    return Group(f"{BROKER}: {label}", tuple(pids), ours=False) if pids else None


def shared_groups(*, sandbox_pid: int | None, backend_pid: int | None, broker_url: str) -> list[Group]:
    """The shared infrastructure, reported beside our processes and kept out of the ratio: the
    sandbox provider, the PostgreSQL server (from one of its backends' pids), the broker and the
    load generator (this process, without its children)."""
    groups = [Group(LOAD, (os.getpid(),), ours=False, descendants=False)]
    if sandbox_pid is not None:
        groups.insert(0, Group(SANDBOX, (sandbox_pid,), ours=False))
    postmaster = postmaster_pid(backend_pid) if backend_pid is not None else None
    if postmaster is not None:
        groups.insert(-1, Group(POSTGRES, (postmaster,), ours=False))
    broker = broker_group(broker_url)
    if broker is not None:
        groups.insert(-1, broker)
    return groups


def own_groups(
    *, web: Sequence[int] = (), celery: Sequence[int] = (), beat: Sequence[int] = ()
) -> list[Group]:
    """Our processes by role (roots' pids): gunicorn masters, Celery worker main processes, beat."""
    return [Group(WEB, tuple(web)), Group(CELERY, tuple(celery)), Group(BEAT, tuple(beat))]
