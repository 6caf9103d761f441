"""The acceptance gate: its checks (``gate.Gate``) run against real worker processes and the
sandbox provider, printing PASS/FAIL per check, ``result=PASS`` at the end, and metrics, and
recording a ``DrillRun``.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from django.utils import timezone

from console.lab.crashlab.gate import Check, Gate
from console.lab.crashlab.network_watch import NetworkWatch
from console.lab.models import DrillRun
from console.lab.services import drill_run_not_run


class Writer(Protocol):
    """Anything with ``write(str)`` (a file, ``sys.stdout``, a management command's stdout)."""

    def write(self, text: str) -> Any: ...


def run_acceptance(*, stdout: Writer, json_path: str | None = None, requested_by: str = "cli") -> bool:
    """Run the gate, print PASS/FAIL per check and ``result=...``, record a ``DrillRun``.

    Returns True when every check (eight) passes.
    """
    watch = NetworkWatch()
    sys.addaudithook(watch.hook)
    watch.active = True
    drill = DrillRun.objects.create(
        kind=DrillRun.Kind.ACCEPTANCE, started_at=timezone.now(), requested_by=requested_by
    )
    checks: list[Check] = []
    gate = Gate(watch)
    try:
        gate.__enter__()
    except BaseException as exc:
        if not isinstance(exc, Exception):  # SIGTERM (SystemExit) or Ctrl-C while starting
            gate.__exit__(type(exc), exc, exc.__traceback__)
            raise
        # The sandbox or a worker would not start: no check ran, so no verdict; recorded as
        # not run with the reason, never as a FAIL (console.lab.services.drill_run_not_run).
        gate.__exit__(type(exc), exc, exc.__traceback__)
        watch.active = False
        drill_run_not_run(
            kind=DrillRun.Kind.ACCEPTANCE,
            requested_by=requested_by,
            reason=f"the acceptance gate could not set up its cluster: {exc}",
            started_at=drill.started_at,
            run_id=drill.id,
        )
        stdout.write(f"result=NOT RUN ({exc})\n")
        return False
    try:
        steps: list[Callable[[], Check]] = [
            gate.danger_window, gate.two_deliveries, gate.stale_worker, gate.outbox_redispatch,
            gate.compensation, gate.restore, gate.terminal, gate.network,
        ]  # fmt: skip
        for step in steps:
            watch.sample(gate.cluster.pids())
            try:
                check = step()
            except Exception as exc:  # a check that cannot finish fails, with its reason
                check = Check((step.__doc__ or step.__name__).split(".")[0], False, f"error: {exc!r}"[:500])
            checks.append(check)
            stdout.write(f"{'PASS' if check.passed else 'FAIL'}  {check.name}: {check.detail}\n")
    finally:
        gate.__exit__(None, None, None)
    watch.active = False
    passed = all(c.passed for c in checks) and len(checks) == len(steps)
    metrics: dict[str, Any] = {}
    for check in checks:
        metrics.update(check.metrics)
    stdout.write(json.dumps(metrics, sort_keys=True) + "\n")
    stdout.write(f"result={'PASS' if passed else 'FAIL'}\n")
    report = {
        "passed": passed,
        "checks": [c.__dict__ for c in checks],
        "metrics": metrics,
        "host": socket.gethostname(),
    }
    DrillRun.objects.filter(id=drill.id).update(finished_at=timezone.now(), passed=passed, result=report)
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2))
    return passed
