"""Production workers register the product's tasks only; the lab's come only when asked for.

The registry is listed in a fresh interpreter: ``shared_task`` adds a task to every app once its
module is imported, so this test process (which imports the lab elsewhere) cannot tell.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid

import pytest
from django.conf import settings

from console.celery import app
from console.lab.cluster import HarnessError, Process, wait_until
from tests.support.workers import requires_real_broker

PRODUCT_TASKS = {"operations.execute_intent", "operations.relay_outbox", "reconciliation.reconcile"}

# What a worker does at start-up (celery.loaders.base.init_worker): import the default modules,
# which runs Django's autodiscovery of <app>.tasks and the system checks (they load the URLconf).
LIST_TASKS = """
import json, sys
import django
django.setup()
from console.celery import app
if sys.argv[1:] == ["--lab"]:
    from console.lab import LAB_TASK_MODULES
    app.conf.include = [*app.conf.include, *LAB_TASK_MODULES]  # what ``worker --include`` does
app.loader.import_default_modules()
print(json.dumps({name: task.run.__module__ for name, task in app.tasks.items()}))
"""


def registered_tasks(*args: str) -> dict[str, str]:
    """Task name -> module of its function, as a worker built like production's registers them."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings"}
    completed = subprocess.run(
        [sys.executable, "-c", LIST_TASKS, *args],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    tasks: dict[str, str] = json.loads(completed.stdout.strip().splitlines()[-1])
    return tasks


def lab_tasks(tasks: dict[str, str]) -> set[str]:
    return {
        name for name, module in tasks.items() if module.startswith("console.lab") or name.startswith("lab.")
    }


def test_production_worker_registers_no_lab_task() -> None:
    # when
    tasks = registered_tasks()
    # then
    assert lab_tasks(tasks) == set()
    assert {"bench.bare_charge", "crashlab.naive_execute", "lab.run_drill"}.isdisjoint(tasks)
    assert set(tasks) >= PRODUCT_TASKS


def test_a_worker_started_with_the_lab_tasks_registers_them() -> None:
    # when: the lab's workers are started with --include of LAB_TASK_MODULES
    tasks = registered_tasks("--lab")
    # then
    assert {"bench.bare_charge", "crashlab.naive_execute", "lab.run_drill"} <= lab_tasks(tasks)
    assert set(tasks) >= PRODUCT_TASKS


@pytest.mark.integration
@requires_real_broker
def test_production_worker_process_registers_no_lab_task() -> None:
    # given: a worker started the way production starts one (no --include), on a queue of its own
    node = f"prod-{uuid.uuid4().hex[:8]}"
    command = [
        sys.executable, "-m", "celery", "-A", "console", "worker", "-l", "INFO", "-c", "1",
        "-n", f"{node}@%h", "-Q", f"test-{node}", "--without-gossip", "--without-mingle",
    ]  # fmt: skip
    worker = Process(node, command, {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings"})
    try:
        try:
            wait_until(lambda: " ready." in worker.output() or not worker.alive(), 60, "the worker")
        except HarnessError:
            pytest.fail(worker.output()[-2000:])
        assert worker.alive(), worker.output()[-2000:]
        # when: celery inspect registered
        replies = app.control.inspect(destination=[f"{node}@{socket.gethostname()}"], timeout=10).registered()
        # then
        assert replies, "the worker did not answer inspect registered"
        (registered,) = replies.values()
        names = {entry.split(" ")[0] for entry in registered}
        assert names >= PRODUCT_TASKS
        assert not {name for name in names if name.startswith(("lab.", "crashlab.", "bench."))}
    finally:
        worker.kill_group()
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(f"test-{node}")
