"""``manage.py bench``: measure Effect Ledger end to end, against a bare-Celery baseline, the
database's commit ceiling, the console and the reconciler at scale, and the API (issue 7); or,
with ``--growth`` / ``--archive-growth``, what an intent costs the disk and what archiving 90 %
of the intents does to the console's and the API's p95 (issue 36)."""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from console.lab import enable_sandbox

# Counters of the benchmark's processes go to their own folder, never into a quickstart's.
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="el-bench-metrics-"))


class Command(BaseCommand):
    """Run every phase against scratch databases (created and dropped on the same server)."""

    help = "Benchmark Effect Ledger (see docs/explanation/performance.md)."

    def add_arguments(self, parser: CommandParser) -> None:
        """Declare the options; defaults are issue 7's figures."""
        parser.add_argument("--intents", type=int, default=5000, help="intents at full load (default 5000)")
        parser.add_argument("--workers", type=int, default=2, help="Celery worker processes (default 2)")
        parser.add_argument("--clients", type=int, default=8, help="concurrent HTTP clients (default 8)")
        parser.add_argument(
            "--api-workers",
            type=int,
            default=4,
            help="gunicorn worker processes (default 4: two per core here, measured, see docs/explanation/performance.md)",
        )
        parser.add_argument(
            "--api-worker-class",
            default="sync",
            help="gunicorn worker class: sync or gthread:THREADS (default sync, see docs/explanation/performance.md)",
        )
        parser.add_argument(
            "--api-compare",
            default="",
            help="also measure the API with these worker classes, comma-separated (gthread:2,gthread:4)",
        )
        parser.add_argument(
            "--bare-pools",
            default="prefork:1,threads:2,threads:4,threads:8",
            help="Celery pools tried for the bare baseline, pool:concurrency[:prefetch], comma-separated;"
            " the fastest is the baseline (default prefork:1,threads:2,threads:4,threads:8)",
        )
        parser.add_argument(
            "--ledger-pool",
            default="threads:4",
            help="Celery pool of the ledger's workers, pool:concurrency[:prefetch] (default threads:4,"
            " measured, see docs/explanation/performance.md)",
        )
        parser.add_argument(
            "--flame",
            metavar="DIR",
            help="only record py-spy flame graphs of a gunicorn worker, a Celery worker and beat into DIR",
        )
        parser.add_argument(
            "--flame-seconds", type=float, default=20.0, help="seconds recorded per flame graph"
        )
        parser.add_argument(
            "--growth",
            action="store_true",
            help="only measure the growth: bytes per intent per table at --growth-intents intents (issue 36)",
        )
        parser.add_argument(
            "--growth-intents", type=int, default=100_000, help="intents of --growth (default 100000)"
        )
        parser.add_argument(
            "--archive-growth",
            action="store_true",
            help="only time the console and the API at --console-rows intents before and after archiving"
            " 90 %% of them, with the database's and the archive's sizes (issue 36)",
        )
        parser.add_argument("--api-seconds", type=float, default=8.0, help="seconds per API run (default 8)")
        parser.add_argument("--console-rows", type=int, default=1_000_000, help="intents bulk-loaded")
        parser.add_argument("--skip-console-scale", action="store_true",
                            help="small data set instead of 1,000,000 rows (smoke test)")  # fmt: skip
        parser.add_argument("--database", default="effect_ledger_bench", help="scratch database name")
        parser.add_argument("--keep", action="store_true", help="keep the scratch databases")
        parser.add_argument("--json", dest="json_path", help="write the results as JSON here")
        parser.add_argument("--markdown", dest="markdown_path", help="write the Markdown report here")

    def handle(self, *args: Any, **options: Any) -> None:
        """Run the benchmark, print the Markdown report, write the files asked for."""
        enable_sandbox()
        from console.lab.bench import report, runner
        from console.lab.bench.choices import CeleryPool, WebWorkers

        if options["flame"]:
            from console.lab.bench import flame

            for line in flame.record(out_dir=options["flame"], seconds=options["flame_seconds"],
                                     database_name=options["database"]):  # fmt: skip
                self.stdout.write(line)
            return
        bench = runner.Options(
            intents=options["intents"],
            workers=options["workers"],
            clients=options["clients"],
            api_workers=options["api_workers"],
            api_seconds=options["api_seconds"],
            console_rows=options["console_rows"],
            database=options["database"],
            keep=options["keep"],
            api_web=WebWorkers.parse(options["api_worker_class"]),
            api_compare=tuple(WebWorkers.parse(t) for t in options["api_compare"].split(",") if t),
            bare_pools=tuple(CeleryPool.parse(t) for t in options["bare_pools"].split(",") if t),
            ledger_pool=CeleryPool.parse(options["ledger_pool"]),
        )
        if options["skip_console_scale"]:
            bench.console_rows, bench.unknown_small, bench.unknown_large = 2000, 20, 200
            bench.reconcile_batch, bench.page_repeat, bench.ceiling_seconds = 10, 3, 1.0
        command = "python manage.py bench " + " ".join(shlex.quote(a) for a in sys.argv[2:] if a)
        if options["growth"] or options["archive_growth"]:
            from console.lab.bench import growth

            bench.growth_intents = options["growth_intents"]
            results = growth.run(bench, growth_phase=options["growth"], archive_phase=options["archive_growth"],
                                 log=runner.log)  # fmt: skip
            markdown = report.render_growth(results, command)
        else:
            results = runner.run(bench)
            markdown = report.render(results, command)
        self.stdout.write(markdown)
        if options["json_path"]:
            with open(options["json_path"], "w") as out:
                json.dump(results, out, indent=2, default=str)
        if options["markdown_path"]:
            with open(options["markdown_path"], "w") as out:
                out.write(markdown)
