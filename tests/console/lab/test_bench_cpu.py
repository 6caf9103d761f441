"""CPU accounting of the benchmark's process trees (console/lab/bench/cpu.py), its table in the
report and the flame graphs per process (issue 37, "Measure CPU, not only rate").

The trees are real processes that burn a known amount of CPU (a loop on ``time.process_time``,
so the amount is CPU time whatever the machine's load); the bands are wide, nothing is timed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from django.db import connection

from console.lab.bench import cpu, flame, report

BURN = "import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass\n"

# Waits for "go", then starts a child burning 0.3 s of CPU and either waits for it (it exits
# and is reaped) or burns 0.3 s itself and leaves it running once it has burnt its share; then
# says "done" and waits for stdin to close.
PARENT = """
import subprocess, sys, time
child_exits = sys.argv[1] == "exits"
print("ready", flush=True)
sys.stdin.readline()
child_code = {burn!r} + ("" if child_exits else "print('burnt', flush=True)\\ntime.sleep(60)\\n")
child = subprocess.Popen([sys.executable, "-c", child_code], stdout=subprocess.PIPE, text=True)
if child_exits:
    child.wait()
else:
    exec({own!r})
    child.stdout.readline()
print("done", flush=True)
sys.stdin.read()
child.kill()
child.wait()
"""


@pytest.fixture
def tree(request: pytest.FixtureRequest) -> Iterator[subprocess.Popen[str]]:
    script = PARENT.format(burn=BURN.format(seconds=0.3), own=BURN.format(seconds=0.3))
    process = subprocess.Popen(
        [sys.executable, "-c", script, request.param],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, so the child goes with it
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    yield process
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _run(process: subprocess.Popen[str]) -> dict[str, dict[str, object]]:
    """The CPU of ``process``'s tree and of ``process`` alone while it does its work."""
    assert process.stdin is not None and process.stdout is not None
    meter = cpu.Meter(
        [cpu.Group("tree", (process.pid,)), cpu.Group("alone", (process.pid,), descendants=False)]
    )
    meter.start()
    process.stdin.write("go\n")
    process.stdin.flush()
    assert process.stdout.readline().strip() == "done"
    groups: dict[str, dict[str, object]] = meter.stop()["groups"]
    return groups


@pytest.mark.parametrize("tree", ["lives"], indirect=True)
def test_i37_a_tree_counts_the_root_and_its_live_child(tree: subprocess.Popen[str]) -> None:
    # given a parent that will burn 0.3 s of CPU and a child that burns 0.3 s and stays alive
    # when
    groups = _run(tree)

    # then the tree has both (0.6 s and two interpreters' start-up), the root alone only its own
    assert 500 <= groups["tree"]["cpu_ms"] <= 2000  # type: ignore[operator]
    assert 200 <= groups["alone"]["cpu_ms"] <= 500  # type: ignore[operator]
    assert groups["tree"]["processes"] == 2
    assert groups["tree"]["complete"] is True


@pytest.mark.parametrize("tree", ["exits"], indirect=True)
def test_i37_a_child_that_exited_between_samples_is_counted_through_its_parent(
    tree: subprocess.Popen[str],
) -> None:
    # given a parent that only starts a child, which burns 0.3 s of CPU and exits before the
    # second sample (the parent reaps it)
    # when
    groups = _run(tree)

    # then the tree still has the child's CPU (children_user/children_system), the root alone not
    assert 200 <= groups["tree"]["cpu_ms"] <= 2000  # type: ignore[operator]
    assert groups["alone"]["cpu_ms"] < 150  # type: ignore[operator]
    assert groups["tree"]["processes"] == 1


def test_i37_a_root_that_exits_between_samples_marks_its_group_incomplete() -> None:
    # given a root that is alive at the first sample
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    meter = cpu.Meter([cpu.Group("gone", (process.pid,))])
    meter.start()

    # when it exits before the second
    process.communicate(b"")
    reading = meter.stop()

    # then its CPU since the first sample is unknown, and the reading says so
    assert reading["groups"]["gone"] == {"cpu_ms": 0, "processes": 0, "ours": True, "complete": False}


def test_i37_wait_until_quiet_returns_once_a_process_is_done_starting_up() -> None:
    # given a process that burns 0.3 s of CPU, then idles; and one that exits
    busy = subprocess.Popen([sys.executable, "-c", BURN.format(seconds=0.3) + "time.sleep(30)\n"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    try:
        # when / then
        assert cpu.wait_until_quiet(busy.pid, window=0.5, timeout=30) is True
        assert cpu.wait_until_quiet(gone.pid, window=0.5, timeout=30) is False
    finally:
        busy.kill()
        busy.wait()


@pytest.mark.django_db
def test_i37_the_postgresql_server_is_found_from_a_backend_of_this_connection() -> None:
    # given this test's connection to the local server
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]

    # when
    postmaster = cpu.postmaster_pid(backend)
    groups = cpu.shared_groups(sandbox_pid=None, backend_pid=backend, broker_url="memory://")

    # then it is the backend's parent, a postgres process, shared (not ours)
    assert postmaster is not None and psutil.Process(backend).ppid() == postmaster
    assert psutil.Process(postmaster).name().startswith("postgres")
    assert [(g.name, g.pids, g.ours) for g in groups] == [
        (cpu.POSTGRES, (postmaster,), False),
        (cpu.LOAD, (psutil.Process().pid,), False),
    ]


def _reading(groups: dict[str, tuple[float, bool]], seconds: float) -> dict[str, object]:
    return {
        "seconds": seconds,
        "groups": {
            name: {"cpu_ms": ms, "processes": 1, "ours": ours, "complete": True}
            for name, (ms, ours) in groups.items()
        },
    }


def test_i37_the_report_prints_cpu_ms_per_intent_per_process_group() -> None:
    # given the CPU of a full-load run of 100 intents and of a bare run of 100 effects
    full = cpu.per_unit(
        _reading(
            {cpu.WEB: (500.0, True), cpu.CELERY: (400.0, True), cpu.BEAT: (100.0, True),
             cpu.POSTGRES: (800.0, False), cpu.LOAD: (300.0, False)},
            seconds=2.0,
        ),
        100,
    )  # fmt: skip
    bare = cpu.per_unit(_reading({cpu.CELERY: (250.0, True), cpu.POSTGRES: (100.0, False)}, 1.0), 100)
    results = {"full": {"cpu": full}, "bare": {"cpu": bare, "chosen": "threads:8:1"}}

    # when
    lines = report.cpu_table(results)

    # then one row per group, our own summed and divided, the shared ones apart and after
    text = "\n".join(lines)
    assert lines[0].startswith("CPU ms per intent")
    assert "| process group | ledger ms/intent | bare ms/effect | ledger cores | bare cores |" in lines
    assert f"| {cpu.WEB} | 5.0 | - | 0.25 | - |" in lines
    assert f"| {cpu.CELERY} | 4.0 | 2.5 | 0.2 | 0.25 |" in lines
    assert "| **own processes** | **10.0** | **2.5** | | |" in lines
    assert "| ledger / bare, own processes | 4.0 | | | |" in lines
    assert text.index("shared infrastructure") < text.index(f"| {cpu.POSTGRES} | 8.0 | 1.0 |")
    assert text.index("shared infrastructure") < text.index(f"| {cpu.LOAD} | 3.0 | - |")


def test_i37_the_report_has_no_cpu_table_for_results_without_cpu() -> None:
    # given results of a run before issue 37 / when / then
    assert report.cpu_table({"full": {}, "bare": {}}) == []


def test_i37_flame_summary_has_a_table_per_process_beat_included(tmp_path: Path) -> None:
    # given the collapsed stacks of the three recordings
    (tmp_path / "api.txt").write_text("main;serve;post 30\nmain;serve;read 10\n")
    (tmp_path / "worker.txt").write_text("main;loop;execute_intent 40\n")
    (tmp_path / "beat.txt").write_text("main;tick;apply_async 5\n")

    # when
    text = "\n".join(flame.summary(tmp_path, 10.0, {"beat": (120.0, 10.0)}))

    # then each has its heading and top frames; beat's heading has its CPU over the recording
    for name in ("api", "worker", "beat"):
        assert f"\n{name} (" in text
    assert "120 CPU ms in 10.0 s = 0.01 cores" in text
    assert "| `apply_async` | 100.0 | 100.0 |" in text


def test_i37_the_report_warns_when_the_bare_run_lasted_under_a_second() -> None:
    # given a bare run of 0.588 s, then one of 3 s (found by the newcomer: no warning was given)
    reading = {cpu.CELERY: (250.0, True)}
    full = cpu.per_unit(_reading({cpu.WEB: (500.0, True)}, 2.0), 100)
    short = {"full": {"cpu": full}, "bare": {"cpu": cpu.per_unit(_reading(reading, 0.588), 100)}}
    long = {"full": {"cpu": full}, "bare": {"cpu": cpu.per_unit(_reading(reading, 3.0), 100)}}
    # when / then
    assert "The bare run lasted 0.588 s, under a second" in report.cpu_table(short)[0]
    assert "under a second" not in report.cpu_table(long)[0]
