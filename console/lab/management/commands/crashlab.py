"""``manage.py crashlab``: reproduce the reference crash table against the real system.

    python manage.py crashlab [--ops 100] [--boundaries none,before-effect,after-effect,timeout]
                              [--strategies retry,record-after,record-before,ledger] [--no-variants]
                              [--no-drill] [--drill-intents N] [--no-restore] [--restore-intents N]
                              [--json PATH] [--markdown PATH]
    python manage.py crashlab --drill-only [--drill-intents N]   # only the duplicate drill
    python manage.py crashlab --restore-only [--restore-intents N] [--restore-by-command]   # only the restore drill
    python manage.py crashlab --failover [--failover-intents N] [--restore-by-command]   # only the failover drill
    python manage.py crashlab --acceptance [--json PATH]
    python manage.py crashlab --partition [--json PATH]   # the partition drill (C28; root, ip netns)
    python manage.py crashlab --judge PATH     # re-judge a saved --json report

Exit status 0 when every check passes, 1 otherwise; 143 after SIGTERM, which every mode answers by
tearing down what it started (``termination.terminate_as_exit``). The modes exclude each other, and
options a mode would ignore or an output file that cannot be written are refused before anything
starts (``check_options``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from console.lab import enable_sandbox
from console.lab.crashlab.config import BOUNDARIES, STRATEGIES, LabConfig
from console.lab.crashlab.report import markdown_table
from console.lab.crashlab.runner import CrashLab
from console.lab.crashlab.termination import terminate_as_exit
from console.lab.crashlab.verdict import judge, rows_from_json
from console.lab.models import DrillRun
from console.lab.services import drill_run_not_run


def _csv(value: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    items = tuple(v.strip() for v in value.split(",") if v.strip())
    unknown = [v for v in items if v not in allowed]
    if unknown or not items:
        raise CommandError(
            f"unknown {what}: {', '.join(unknown) or '(none)'}; choose from {', '.join(allowed)}"
        )
    return items


#: The modes that each run one thing of their own: at most one per run.
MODES = ("partition", "failover", "acceptance", "drill_only", "restore_only", "judge")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_output(option: str, value: str | None) -> None:
    """Refuse an output path that cannot be written, before the run (not after it printed a result).

    Raises:
        CommandError: ``value`` is a directory, or its folder is missing or not writable.
    """
    if not value:
        return
    path = Path(value)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise CommandError(f"{option} {value}: is a directory, not a file")
    if not folder.is_dir():
        raise CommandError(f"{option} {value}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise CommandError(f"{option} {value}: not writable")


def check_options(options: dict[str, Any]) -> None:
    """Refuse, before anything starts, options that would be ignored or fail only at the end.

    Rules: at most one of ``MODES``; a drill's intent count only where that drill runs
    (``--drill-intents``: the matrix's duplicate drill or ``--drill-only``; ``--restore-intents``:
    the matrix's restore drill or ``--restore-only``; ``--failover-intents``: ``--failover``);
    ``--markdown`` only where a table is written (not ``--partition``, ``--acceptance``,
    ``--judge``), ``--json`` not with ``--judge``; output folders that exist and are writable.

    Raises:
        CommandError: naming the options at fault.
    """
    modes = [_flag(name) for name in MODES if options.get(name)]
    if len(modes) > 1:
        raise CommandError(f"{' and '.join(modes)} exclude each other: choose one mode")
    mode = modes[0] if modes else "the crash matrix"
    skip_variants = bool(options.get("no_variants"))
    runs = {
        "drill_intents": options.get("drill_only")
        or (not modes and not (options.get("no_drill") or skip_variants)),
        "restore_intents": options.get("restore_only")
        or (not modes and not (options.get("no_restore") or skip_variants)),
        "failover_intents": options.get("failover"),
    }
    for name, used in runs.items():
        if options.get(name) is not None and not used:
            drill = {"drill_intents": "duplicate"}.get(name, name.split("_")[0])
            raise CommandError(
                f"{_flag(name)} sets the {drill} drill's size, but {mode} "
                f"(with these options) runs no {drill} drill"
            )
    if options.get("markdown") and modes and modes[0] in ("--partition", "--acceptance", "--judge"):
        raise CommandError(f"--markdown is not written by {modes[0]} (use --json)")
    if options.get("json") and options.get("judge"):
        raise CommandError("--json is not written by --judge (it re-reads a saved report)")
    _check_output("--json", options.get("json"))
    _check_output("--markdown", options.get("markdown"))


class Command(BaseCommand):
    help = "Kill real workers at the worst moment and count effects at the sandbox provider."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--ops", type=int, default=100, help="operations per cell (multiple of 10)")
        parser.add_argument("--boundaries", default=",".join(BOUNDARIES))
        parser.add_argument("--strategies", default=",".join(STRATEGIES))
        parser.add_argument(
            "--no-variants",
            action="store_true",
            help="skip the email and reservations rows (the duplicate and restore drills too)",
        )
        parser.add_argument("--no-drill", action="store_true", help="skip the duplicate drill")
        parser.add_argument(
            "--drill-only", action="store_true", help="run only the duplicate drill, not the matrix"
        )
        parser.add_argument(
            "--drill-intents",
            type=int,
            default=None,
            help="duplicate drill intents per provider (default: --ops / 10)",
        )
        parser.add_argument("--no-restore", action="store_true", help="skip the restore drill")
        parser.add_argument(
            "--restore-only", action="store_true", help="run only the restore drill, not the matrix"
        )
        parser.add_argument(
            "--restore-intents",
            type=int,
            default=None,
            help="restore drill intents per provider kind and batch (default: --ops / 10, at least 3)",
        )
        parser.add_argument(
            "--restore-by-command",
            action="store_true",
            help="restore and failover drills: workers that do not recover by themselves; "
            "the drill runs manage.py recover",
        )
        parser.add_argument(
            "--failover",
            action="store_true",
            help="run only the failover drill: a private primary and streaming replica, the replica "
            "cut off, the primary stopped hard, the replica promoted (needs the PostgreSQL server binaries)",
        )
        parser.add_argument(
            "--failover-intents",
            type=int,
            default=None,
            help="failover drill intents per provider kind and batch (default: --ops / 10, at least 3)",
        )
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument(
            "--acceptance",
            action="store_true",
            help="run the acceptance gate (seven checks and the restore drill)",
        )
        parser.add_argument(
            "--partition",
            action="store_true",
            help="run only the partition drill: workers in network namespaces, their database and broker paths "
            "cut and healed mid-call (needs root and ip netns)",
        )
        parser.add_argument("--judge", metavar="PATH", help="re-judge a saved --json report; runs nothing")
        parser.add_argument("--json", metavar="PATH")
        parser.add_argument("--markdown", metavar="PATH")
        parser.add_argument("--requested-by", default="cli")

    def handle(self, *args: Any, **options: Any) -> None:
        check_options(options)
        # Every mode tears down what it started in a finally or __exit__: on SIGTERM too.
        with terminate_as_exit():
            self._handle(options)

    def _handle(self, options: dict[str, Any]) -> None:
        enable_sandbox()
        if options["judge"]:
            self._judge(Path(options["judge"]))
            return
        from console.lab.cluster import HarnessError, require_real_broker

        try:
            require_real_broker("the crash lab")
        except HarnessError as exc:
            raise CommandError(str(exc)) from exc
        # The lab submits its hundreds of intents through the API in this process: it measures
        # the ledger, not the API's rate limits (operations/api/throttling.py), so they are off here.
        settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "RATE_AGENT": None, "RATE_TENANT": None}
        if options["partition"]:
            self._partition(options["json"])
            return
        if options["acceptance"]:
            from console.lab.crashlab.acceptance import run_acceptance

            passed = run_acceptance(
                stdout=self.stdout, json_path=options["json"], requested_by=options["requested_by"]
            )
            if not passed:
                raise SystemExit(1)
            return
        ops = options["ops"]
        if ops < 10 or ops % 10:
            raise CommandError(
                "--ops must be a positive multiple of 10 (every tenth first attempt is interrupted)"
            )
        if options["drill_intents"] is not None and options["drill_intents"] < 1:
            raise CommandError("--drill-intents must be at least 1")
        if options["restore_intents"] is not None and options["restore_intents"] < 3:
            raise CommandError(
                "--restore-intents must be at least 3 (done, held, just submitted at the dump)"
            )
        if options["failover_intents"] is not None and options["failover_intents"] < 3:
            raise CommandError(
                "--failover-intents must be at least 3 (done, held, just submitted at the cut)"
            )
        only = options["drill_only"] or options["restore_only"] or options["failover"]
        config = LabConfig(
            ops=ops,
            boundaries=() if only else _csv(options["boundaries"], BOUNDARIES, "boundary"),
            strategies=() if only else _csv(options["strategies"], STRATEGIES, "strategy"),
            variants=not options["no_variants"] and not only,
            workers=options["workers"],
            drill=options["drill_only"] or not (only or options["no_drill"] or options["no_variants"]),
            drill_intents=options["drill_intents"],
            restore=options["restore_only"] or not (only or options["no_restore"] or options["no_variants"]),
            restore_intents=options["restore_intents"],
            restore_by_command=options["restore_by_command"],
            failover=options["failover"],
            failover_intents=options["failover_intents"],
        )
        drill = DrillRun.objects.create(
            kind=DrillRun.Kind.CRASHLAB,
            started_at=timezone.now(),
            requested_by=options["requested_by"],
            parameters={
                "ops": ops,
                "boundaries": config.boundaries,
                "strategies": config.strategies,
                "duplicate_drill_intents": config.intents_per_drill_provider if config.drill else 0,
                "restore_drill_intents": config.intents_per_restore_batch if config.restore else 0,
                "failover_drill_intents": config.intents_per_failover_batch if config.failover else 0,
            },
        )
        started = time.monotonic()
        lab = CrashLab(config)
        try:
            lab.__enter__()
        except BaseException as exc:
            lab.__exit__(type(exc), exc, exc.__traceback__)
            if not isinstance(exc, Exception):  # SIGTERM (SystemExit) or Ctrl-C while starting
                DrillRun.objects.filter(id=drill.id).update(
                    finished_at=timezone.now(), passed=False, error=repr(exc)[:2000]
                )
                raise
            # Its sandbox or workers would not start: an environment problem, not a safety
            # verdict; recorded as not run (console.lab.services.drill_run_not_run).
            drill_run_not_run(
                kind=DrillRun.Kind.CRASHLAB,
                requested_by=options["requested_by"],
                reason=f"the crash lab could not set up its cluster: {exc}",
                started_at=drill.started_at,
                run_id=drill.id,
            )
            raise CommandError(f"not run: {exc}") from exc
        try:
            rows = lab.run()
        except BaseException as exc:  # SIGTERM (SystemExit) too: the run is recorded as ended
            DrillRun.objects.filter(id=drill.id).update(
                finished_at=timezone.now(), passed=False, error=repr(exc)[:2000]
            )
            raise
        finally:
            lab.__exit__(None, None, None)
        passed = judge(rows)
        seconds = round(time.monotonic() - started, 1)
        table = markdown_table(rows, ops)
        self.stdout.write(table)
        self.stdout.write(f"took {seconds} s; result={'PASS' if passed else 'FAIL'}")
        report = {"ops": ops, "seconds": seconds, "passed": passed, "rows": [row.as_dict() for row in rows]}
        DrillRun.objects.filter(id=drill.id).update(
            finished_at=timezone.now(), passed=passed, result=report, markdown=table
        )
        if options["json"]:
            Path(options["json"]).write_text(json.dumps(report, indent=2))
        if options["markdown"]:
            Path(options["markdown"]).write_text(table)
        if not passed:
            raise SystemExit(1)

    def _partition(self, json_path: str | None) -> None:
        """The partition drill (``console.lab.crashlab.partition_scenarios``): its table, exit 1
        on a violation; a machine that cannot run it is a CommandError naming why."""
        from dataclasses import asdict

        from console.lab.cluster import HarnessError
        from console.lab.crashlab.partition_drill import PartitionUnavailable, unavailable_reason
        from console.lab.crashlab.partition_scenarios import partition_table, run_partition_drill

        reason = unavailable_reason()
        if reason:
            raise CommandError(f"not run: {reason}")
        try:
            results = run_partition_drill()
        except (PartitionUnavailable, HarnessError) as exc:
            raise CommandError(f"the partition drill did not complete: {exc}") from exc
        violations = [f"{r.scenario}: {v}" for r in results for v in r.violations()]
        self.stdout.write(partition_table(results))
        for line in violations:
            self.stdout.write(f"VIOLATION {line}")
        self.stdout.write(f"result={'FAIL' if violations else 'PASS'}")
        if json_path:
            report = {"passed": not violations, "results": [asdict(r) for r in results]}
            Path(json_path).write_text(json.dumps(report, indent=2, default=str))
        if violations:
            raise SystemExit(1)

    def _judge(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text())
            rows = rows_from_json(data)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CommandError(f"cannot read a crash-lab report from {path}: {exc}") from exc
        passed = judge(rows)
        self.stdout.write(markdown_table(rows, int(data.get("ops", 0))))
        self.stdout.write(f"result={'PASS' if passed else 'FAIL'}")
        if not passed:
            raise SystemExit(1)
