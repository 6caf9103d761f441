"""``manage.py quickstart``: the whole product on its embedded defaults, as one supervised group.

Starts (or reuses) the embedded PostgreSQL under ``./.data/pg`` when ``DATABASE_URL`` is unset,
migrates, creates an operator account and a demo agent token on the first run (printing both
once), then runs the web server, a Celery worker, Celery beat and the sandbox provider under
honcho. Ctrl-C stops them all; a second run reuses the data.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from operations.authentication import agent_create
from operations.models import Agent


class Command(BaseCommand):
    help = "Run Effect Ledger locally: web, worker, beat and the sandbox provider."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8000, help="console and API port (default 8000)")
        parser.add_argument("--sandbox-port", type=int, default=8765)
        parser.add_argument("--workers", type=int, default=2, help="Celery worker processes")
        parser.add_argument("--no-run", action="store_true", help="set up only; do not start the processes")

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        self._create_accounts()
        if options["no_run"]:
            return
        self._run(options)

    def _create_accounts(self) -> None:
        users = get_user_model()
        if not users.objects.filter(username="operator").exists():
            password = secrets.token_urlsafe(12)
            user = users.objects.create_superuser("operator", "operator@localhost", password)
            user.groups.set(Group.objects.filter(name__in=["viewer", "operator", "approver", "admin"]))
            self.stdout.write(self.style.SUCCESS(f"operator account: operator / {password}  (shown once)"))
        else:
            self.stdout.write("operator account exists (reset: python manage.py changepassword operator)")
        if not Agent.objects.filter(tenant="demo", name="demo-agent").exists():
            _, token = agent_create(name="demo-agent", tenant="demo")
            self.stdout.write(self.style.SUCCESS(f"demo agent token (tenant demo): {token}  (shown once)"))
        else:
            self.stdout.write(
                "demo agent exists (new token: python manage.py create_agent NAME --tenant demo)"
            )

    def _run(self, options: dict[str, Any]) -> None:
        from honcho.manager import Manager

        data_dir = Path(settings.DATA_DIR)
        metrics_dir = data_dir / "metrics"
        shutil.rmtree(metrics_dir, ignore_errors=True)  # multiprocess counters start at zero
        metrics_dir.mkdir(parents=True, exist_ok=True)
        sandbox_url = f"http://127.0.0.1:{options['sandbox_port']}"
        env = {
            **os.environ,
            "DATABASE_URL": settings.DATABASE_URL,
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "SANDBOX_PROVIDER_URL": sandbox_url,
            "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
            "PYTHONUNBUFFERED": "1",
        }
        python = sys.executable
        manage = str(Path(settings.BASE_DIR) / "manage.py")
        processes = {
            "web": f"{python} -m gunicorn console.wsgi -b 127.0.0.1:{options['port']} -w 2 --access-logfile -",
            "worker": f"{python} -m celery -A console worker -l INFO -c {options['workers']} -n worker@%h",
            "beat": f"{python} -m celery -A console beat -l INFO -s {data_dir / 'celerybeat-schedule'}",
            "sandbox": f"{python} {manage} sandbox_provider --port {options['sandbox_port']}",
        }
        manager = Manager()
        for name, command in processes.items():
            manager.add_process(name, command, env=env, cwd=str(settings.BASE_DIR))
        self.stdout.write(
            self.style.SUCCESS(f"console: http://127.0.0.1:{options['port']}/  (Ctrl-C stops everything)")
        )
        self.stdout.write(f"API: http://127.0.0.1:{options['port']}/api/v1/intents  docs: /api/docs/")
        manager.loop()
        sys.exit(manager.returncode)
