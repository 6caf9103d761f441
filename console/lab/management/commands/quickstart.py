"""``manage.py quickstart``: the whole product on its embedded defaults, as one supervised group.

Starts (or reuses) the embedded PostgreSQL under ``./.data/pg`` when ``DATABASE_URL`` is unset,
migrates, creates the console account ``operator`` (operator and approver; its notices go to
``operator@localhost``, printed as plain text in the worker's output by the default email
backend, each within about 15 s: no rate limit per recipient here), a separate ``admin``
for the Django admin site and a demo agent token on the first run (printing each secret
once) and the sandbox provider's own database (``effect_ledger_sandbox``), then runs the web
server, a Celery worker, Celery beat, the sandbox provider (its signed events going to the web
server's ``/providers/<source>/events``) and, with the ``agents`` extra
installed, the MCP server for agents (streamable HTTP, ``--mcp-port``) under supervisord, which
restarts any of them that exits. Ctrl-C stops them all; a second run reuses the data.

It lives in the lab, not the product: it runs the lab's sandbox provider and a worker that also
registers the lab's tasks (so the console's Drills page can start a drill); production runs
gunicorn, workers and beat itself, on the product's tasks only.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from console.accounts import console_user_create
from console.agents.cli import DEFAULT_HTTP_PORT
from console.lab import LAB_TASK_MODULES, enable_sandbox
from console.lab.sandbox_provider.database import (
    default_dsn,
    dsn_from_settings_dict,
    ensure_database,
    sandbox_database_name,
)
from operations.api.authentication import agent_create
from operations.audit.keys import signing_key_create, signing_key_path
from operations.models import Agent

#: The quickstart operator's address: approval and escalation notices go to it; with the
#: default email backend (``console.email_backend``) they are printed in this terminal.
OPERATOR_EMAIL = "operator@localhost"

#: The quick start's ``NOTIFY_INTERVAL_SECONDS`` (unless the environment sets it): no rate limit
#: per recipient, so each notice is printed at the sender's next pass, within about
#: ``NOTIFY_PERIOD_SECONDS`` (15 s) as the tutorial says; notices of one pass are still one
#: digest. The production default (300 s) holds a second notice up to five minutes.
QUICKSTART_NOTIFY_INTERVAL_SECONDS = "0"

_PRINTING_BACKENDS = {
    "console.email_backend.TerminalEmailBackend",
    "django.core.mail.backends.console.EmailBackend",
}


def _mail_note() -> str:
    if settings.EMAIL_BACKEND in _PRINTING_BACKENDS:
        return "printed in this terminal, in the worker's output, within about 15 s"
    return f"sent by {settings.EMAIL_BACKEND}"


class Command(BaseCommand):
    help = "Run Effect Ledger locally: web, worker, beat and the sandbox provider."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8000, help="console and API port (default 8000)")
        parser.add_argument(
            "--sandbox-port", type=int, default=8765, help="the sandbox provider's port (default 8765)"
        )
        parser.add_argument("--workers", type=int, default=2, help="Celery worker processes")
        parser.add_argument(
            "--mcp-port",
            type=int,
            default=DEFAULT_HTTP_PORT,
            help=f"the MCP server's streamable HTTP port (default {DEFAULT_HTTP_PORT}; needs the agents extra)",
        )
        parser.add_argument("--no-run", action="store_true", help="set up only; do not start the processes")

    def handle(self, *args: Any, **options: Any) -> None:
        enable_sandbox()
        call_command("migrate", interactive=False, verbosity=0)
        self._create_accounts()
        self._create_audit_signing_key()
        self._create_sandbox_database()
        if options["no_run"]:
            return
        self._run(options)

    def _create_accounts(self) -> None:
        """The console account ``operator`` (roles operator and approver on every tenant, not a
        superuser; email ``OPERATOR_EMAIL``, so the notices reach someone) and a separate ``admin`` for the Django admin site, each password printed once."""
        users = get_user_model()
        for name, roles, django_admin, email, purpose in (
            ("operator", ["operator", "approver"], False, OPERATOR_EMAIL, "console account"),
            ("admin", ["admin"], True, "", "Django admin account (/admin/)"),
        ):
            if users.objects.filter(username=name).exists():
                self.stdout.write(f"{purpose} {name} exists (reset: python manage.py changepassword {name})")
                # An operator made by an earlier quickstart without an address: give it one.
                if email and users.objects.filter(username=name, email="").update(email=email):
                    self.stdout.write(f"  its notices now go to {email}: {_mail_note()}")
                continue
            _, password = console_user_create(
                username=name, roles=roles, all_tenants=True, django_admin=django_admin, email=email
            )
            self.stdout.write(self.style.SUCCESS(f"{purpose}: {name} / {password}  (shown once)"))
            if email:
                self.stdout.write(f"  its notices (approvals, escalations) go to {email}: {_mail_note()}")
        if not Agent.objects.filter(tenant="demo", name="demo-agent").exists():
            _, token = agent_create(name="demo-agent", tenant="demo")
            self.stdout.write(self.style.SUCCESS(f"demo agent token (tenant demo): {token}  (shown once)"))
        else:
            self.stdout.write(
                "demo agent exists (new token: python manage.py create_agent NAME --tenant demo)"
            )

    def _create_audit_signing_key(self) -> None:
        """The Ed25519 key audit checkpoints are signed with, in the data directory (0600)."""
        path = signing_key_path()
        if signing_key_create(path):
            self.stdout.write(f"audit signing key created: {path} (manage.py audit_checkpoint --public-key)")

    def _create_sandbox_database(self) -> None:
        """The sandbox provider's own database beside the ledger's (``<ledger>_sandbox``, on the
        embedded server too), unless ``SANDBOX_DATABASE_URL`` names another: the provider stands
        for the outside world, which a restore of the ledger's database does not roll back."""
        if settings.SANDBOX_DATABASE_URL:
            return
        if ensure_database(
            default_dsn(connection.settings_dict), admin_dsn=dsn_from_settings_dict(connection.settings_dict)
        ):
            name = sandbox_database_name(str(connection.settings_dict["NAME"]))
            self.stdout.write(f"sandbox provider database created: {name}")

    def _run(self, options: dict[str, Any]) -> None:
        data_dir = Path(settings.DATA_DIR)
        metrics_dir = data_dir / "metrics"
        shutil.rmtree(metrics_dir, ignore_errors=True)  # multiprocess counters start at zero
        metrics_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "DATABASE_URL": settings.DATABASE_URL,
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "SANDBOX_PROVIDER_URL": f"http://127.0.0.1:{options['sandbox_port']}",
            "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
            "PYTHONUNBUFFERED": "1",
            # The console's address in the notices' deep links (docs/reference/console.md, "Notifications to approvers and operators"): the
            # port it runs on here, unless the user named the address people reach it by.
            "EFFECT_LEDGER_PUBLIC_URL": os.environ.get("EFFECT_LEDGER_PUBLIC_URL")
            or f"http://127.0.0.1:{options['port']}",
            # Each notice at the sender's next pass (QUICKSTART_NOTIFY_INTERVAL_SECONDS).
            "EFFECT_LEDGER_NOTIFY_INTERVAL_SECONDS": os.environ.get("EFFECT_LEDGER_NOTIFY_INTERVAL_SECONDS")
            or QUICKSTART_NOTIFY_INTERVAL_SECONDS,
            # Agents' webhook receivers on this machine (docs/reference/webhooks.md): the
            # processes get DATABASE_URL, so they would not take the embedded default themselves.
            "EFFECT_LEDGER_WEBHOOK_ALLOWED_NETWORKS": ",".join(
                settings.EFFECT_LEDGER["WEBHOOK_ALLOWED_NETWORKS"]
            ),
        }
        running = _running_supervisor(data_dir)
        if running:
            raise CommandError(
                f"a previous quickstart group is still running (supervisord pid {running}); "
                f"stop it first: kill -TERM {running}"
            )
        config = data_dir / "supervisord.conf"
        config.write_text(supervisor_config(data_dir, self._programs(options, data_dir)))
        self.stdout.write(
            self.style.SUCCESS(f"console: http://127.0.0.1:{options['port']}/  (Ctrl-C stops everything)")
        )
        self.stdout.write(f"API: http://127.0.0.1:{options['port']}/api/v1/intents  docs: /api/docs/")
        self.stdout.write(
            f"sandbox provider: http://127.0.0.1:{options['sandbox_port']}  "
            f"(its signed events go to {events_base_url(options['port'])})"
        )
        if mcp_available():
            self.stdout.write(
                f"MCP (streamable HTTP): http://127.0.0.1:{options['mcp_port']}/mcp  "
                "(send Authorization: Bearer <agent token>)"
            )
        else:
            self.stdout.write("MCP server not started: pip install -e '.[agents]' to add it")
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "supervisor.supervisord", "-n", "-c", str(config)], env=env
        )

        def stop(signum: int, frame: Any) -> None:
            supervisor.send_signal(signal.SIGTERM)  # supervisord stops every program, then exits

        # Explicit handlers: Ctrl-C (SIGINT) and SIGTERM both stop the group, even where the
        # shell started us with SIGINT ignored.
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        supervisor.wait()
        sys.exit(supervisor.returncode or 0)

    def _programs(self, options: dict[str, Any], data_dir: Path) -> dict[str, str]:
        python = sys.executable
        manage = str(Path(settings.BASE_DIR) / "manage.py")
        # kombu's filesystem transport is not safe with prefork pool children killed mid-task (a
        # dead child can leave the pool's queue lock held): use threads there; prefork with a
        # real broker (RabbitMQ, Redis).
        pool = "threads" if settings.CELERY_BROKER_URL.startswith("filesystem://") else "prefork"
        return {
            "web": (
                f"{python} -m gunicorn -c python:console.gunicorn_conf console.wsgi "
                f"-b 127.0.0.1:{options['port']} -w 2 --no-control-socket --access-logfile -"
            ),
            "worker": f"{python} -m celery -A console worker -l INFO -P {pool} -c {max(2, options['workers'] * 2)}"
            f" -n worker@%%h --include {','.join(LAB_TASK_MODULES)}",
            "beat": f"{python} -m celery -A console beat -l INFO -s {data_dir / 'celerybeat-schedule'}",
            # The sandbox tells the ledger it runs beside about every effect (signed events to
            # the web process's /providers/<source>/events, docs/explanation/evidence.md).
            "sandbox": f"{python} {manage} sandbox_provider --port {options['sandbox_port']}"
            f" --events-url {events_base_url(options['port'])}",
            # The MCP server for agents, on the public API like an agent's machine; it holds no
            # token (each MCP request's Authorization header is forwarded).
            **(
                {
                    "mcp": f"{python} -m console.agents.mcp_server --transport http "
                    f"--port {options['mcp_port']} --url http://127.0.0.1:{options['port']}"
                }
                if mcp_available()
                else {}
            ),
        }


def events_base_url(port: int) -> str:
    """Where quickstart's sandbox provider sends its events: the web process on ``port``,
    e.g. ``http://127.0.0.1:8000/providers/`` (``<source>/events`` is appended per product)."""
    return f"http://127.0.0.1:{port}/providers/"


def mcp_available() -> bool:
    """Whether the ``mcp`` SDK (the ``agents`` extra) is installed."""
    return importlib.util.find_spec("mcp") is not None


def _running_supervisor(data_dir: Path) -> int | None:
    """The pid of a supervisord still running from an earlier quickstart in ``data_dir``."""
    import psutil

    try:
        pid = int((data_dir / "supervisord.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        return pid if "supervisord" in " ".join(psutil.Process(pid).cmdline()) else None
    except psutil.Error:
        return None


def supervisor_config(data_dir: Path, programs: dict[str, str]) -> str:
    """A supervisord configuration running ``programs`` in the foreground, each restarted when
    it exits (a killed worker comes back; the others keep running)."""
    sections = [
        "[supervisord]",
        "nodaemon=true",
        f"logfile={data_dir / 'supervisord.log'}",
        f"pidfile={data_dir / 'supervisord.pid'}",
        f"childlogdir={data_dir}",
        "",
        "[unix_http_server]",
        f"file={data_dir / 'supervisor.sock'}",
        "",
        "[rpcinterface:supervisor]",
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
        "",
        "[supervisorctl]",
        f"serverurl=unix://{data_dir / 'supervisor.sock'}",
    ]
    for name, command in programs.items():
        sections += [
            "",
            f"[program:{name}]",
            f"command={command}",
            f"directory={settings.BASE_DIR}",
            "autorestart=true",
            "startsecs=1",
            "startretries=100",
            "stopasgroup=true",
            "killasgroup=true",
            "stopwaitsecs=20",
            "redirect_stderr=true",
            "stdout_logfile=/dev/stdout",
            "stdout_logfile_maxbytes=0",
        ]
    return "\n".join(sections) + "\n"
