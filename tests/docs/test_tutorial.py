"""The tutorial (docs/tutorial.md), run: its commands in order against a real quick start.

What is run: every ``console`` fenced block's ``$ `` lines (a command continues on the next lines
while it ends with ``\\``, has an open quote or an open parenthesis), in one bash session, so
variables set by one command (``CHARGE=$(...)``) are there for the next, as in a terminal. The
lines under a command are its expected output: they must appear in the command's output in that
order (a line ``...`` skips any number of lines, ``…`` inside a line matches any text). A command
that only reads (no ``-X POST``, not ``manage.py``) is run again, for up to a minute, until its
output matches: a person reading the page takes that long too.

What differs on a test machine, and only that (``Tutorial.substitute``):

- ``python manage.py quickstart`` runs in the background (the tutorial's "first terminal") with
  ``--port``, ``--sandbox-port`` and ``--mcp-port`` on free ports, and the ports in every later
  command and expected line (8000, 8765) are replaced by those;
- ``export TOKEN=...`` gets the token that quick start printed;
- the database is a throwaway one on ``DATABASE_URL``'s server (or, without ``DATABASE_URL``, the
  embedded PostgreSQL in a temporary data directory, as on a fresh clone), the broker kombu's
  filesystem transport in that directory (as on a fresh clone). ``EFFECT_LEDGER_SANDBOX`` is
  removed from the environment the commands see (the tests' conftest sets it; a reader's shell
  does not have it), except that on a server database it is set to 1: the reader's embedded mode
  has the sandbox on by default, a ``DATABASE_URL`` has it off.

The browser step ("Approve it in the browser") is done with Playwright and the machine's
Chromium when there is one, else by posting the approval page's own form. The test also
asserts the end states through the API itself: the charge SUCCEEDED after the approval, the
email UNKNOWN after the fault, then SUCCEEDED after the resolution with exactly one email at the
provider, and the resolution on the intent's console page.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"
CHROMIUM = Path("/usr/bin/chromium")
BROWSER_SECTION = "Approve it in the browser"
QUICKSTART = "python manage.py quickstart"
TUTORIAL_PORTS = {"web": 8000, "sandbox": 8765}

pytestmark = pytest.mark.integration


# --- the tutorial, parsed --------------------------------------------------------------------


@dataclass
class Step:
    section: str
    command: str
    expected: list[str]


def _incomplete(command: str) -> bool:
    if command.rstrip().endswith("\\"):
        return True
    if command.count("(") > command.count(")"):
        return True
    try:
        shlex.split(command)
    except ValueError:  # an open quote
        return True
    return False


def tutorial_steps(text: str) -> list[Step]:
    """The commands of the ``console`` blocks, in order, with their expected output."""
    steps: list[Step] = []
    section = ""
    in_block = False
    for line in text.splitlines():
        if not in_block and line.startswith("## "):
            section = line[3:].strip()
        if line.startswith("```"):
            in_block = (not in_block) and line.strip() == "```console"
            continue
        if not in_block:
            continue
        if steps and _incomplete(steps[-1].command) and not steps[-1].expected:
            steps[-1].command += "\n" + line
        elif line.startswith("$ "):
            steps.append(Step(section, line[2:], []))
        elif steps and line.strip():
            steps[-1].expected.append(line)
    return steps


def output_matches(expected: list[str], output: str) -> bool:
    """Whether the expected lines appear in ``output``'s lines in order (``...`` skips lines;
    ``…`` matches any text within a line; surrounding blanks are ignored)."""
    lines = [line.strip() for line in output.splitlines()]
    position = 0
    for want in expected:
        if want.strip() == "...":
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in want.strip().split("…")) + r"\Z")
        while position < len(lines) and not pattern.match(lines[position]):
            position += 1
        if position == len(lines):
            return False
        position += 1
    return True


def test_the_tutorial_parses_into_the_steps_the_runner_expects() -> None:
    steps = tutorial_steps(TUTORIAL.read_text(encoding="utf-8"))
    commands = [step.command for step in steps]
    assert commands[0] == QUICKSTART
    assert any(command.startswith("export TOKEN=") for command in commands)
    assert any(step.section.endswith(BROWSER_SECTION) for step in steps)
    assert all(not _incomplete(command) for command in commands), commands


# --- the instance the tutorial runs against --------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Reader(threading.Thread):
    """Collects a process's output lines as they come."""

    def __init__(self, stream: Any) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.lines: queue.Queue[str] = queue.Queue()
        self.all: list[str] = []

    def run(self) -> None:
        for line in iter(self.stream.readline, ""):
            self.all.append(line.rstrip("\n"))
            self.lines.put(line.rstrip("\n"))


class Shell:
    """One bash session, as the tutorial's second terminal: each command's output and status."""

    def __init__(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env=env,
            start_new_session=True,
        )
        self.reader = Reader(self.process.stdout)
        self.reader.start()

    def run(self, command: str, timeout: float = 120.0) -> tuple[int, str]:
        marker = f"__tutorial_step_{uuid.uuid4().hex}__"
        assert self.process.stdin is not None
        self.process.stdin.write(f"{command}\necho; echo {marker} $?\n")
        self.process.stdin.flush()
        out: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.reader.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no end of {command!r} within {timeout} s; output:\n" + "\n".join(out)
                ) from None
            if line.startswith(marker):
                return int(line.split()[-1]), "\n".join(out)
            out.append(line)

    def close(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)


@dataclass
class Instance:
    env: dict[str, str]
    web: int
    sandbox: int
    process: subprocess.Popen[str]
    reader: Reader

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.web}"

    def printed(self, pattern: str) -> str:
        for line in self.reader.all:
            found = re.search(pattern, line)
            if found:
                return found.group(1)
        raise AssertionError(
            f"quickstart printed nothing like {pattern!r}:\n" + "\n".join(self.reader.all[-50:])
        )


@pytest.fixture
def instance_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of the tutorial's two terminals: a throwaway database, a fresh data folder."""
    import psycopg

    env = {
        key: value
        for key, value in os.environ.items()
        if key
        not in {
            "CELERY_BROKER_URL",
            "EFFECT_LEDGER_SANDBOX",
            "PROMETHEUS_MULTIPROC_DIR",
            "DJANGO_SETTINGS_MODULE",
        }
    }
    env.update(
        EFFECT_LEDGER_DATA_DIR=str(tmp_path / "data"),
        PYTHONPATH=str(ROOT),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
    )
    base = os.environ.get("DATABASE_URL")
    database = f"el_tutorial_{uuid.uuid4().hex[:10]}"
    if base:
        server, _, query = base.partition("?")
        admin = server.rsplit("/", 1)[0] + "/postgres" + (f"?{query}" if query else "")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{database}"')
        env["DATABASE_URL"] = server.rsplit("/", 1)[0] + f"/{database}" + (f"?{query}" if query else "")
        # The reader runs in embedded mode (no DATABASE_URL), where the sandbox is on by default
        # (console/settings_ledger.py); a server database turns that default off, so say it.
        env["EFFECT_LEDGER_SANDBOX"] = "1"
    yield env
    if base:
        with psycopg.connect(admin, autocommit=True) as conn:
            for name in (database, f"{database}_sandbox"):
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def quickstart(instance_env: dict[str, str]) -> Iterator[Instance]:
    """``python manage.py quickstart`` on free ports, stopped (the whole group) afterwards."""
    web, sandbox, mcp = _free_port(), _free_port(), _free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "quickstart",
            "--port",
            str(web),
            "--sandbox-port",
            str(sandbox),
            "--mcp-port",
            str(mcp),
            "--workers",
            "1",
        ],
        cwd=ROOT,
        env=instance_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    reader = Reader(process.stdout)
    reader.start()
    instance = Instance(instance_env, web, sandbox, process, reader)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, "quickstart exited:\n" + "\n".join(reader.all)
            assert time.monotonic() < deadline, "quickstart not up in 180 s:\n" + "\n".join(reader.all[-40:])
            try:
                if (
                    httpx.get(f"{instance.url}/healthz", timeout=2).status_code == 200
                    and httpx.get(f"http://127.0.0.1:{sandbox}/ledger", timeout=2).status_code == 200
                ):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield instance
    finally:
        process.send_signal(signal.SIGTERM)  # quickstart stops supervisord, which stops the rest
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=40)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


# --- the browser step ------------------------------------------------------------------------


def approve_in_browser(instance: Instance, intent_id: str, password: str) -> str:
    """Sign in as ``operator``, open the charge from the Approvals inbox and press "Approve this
    payload". Returns how it was done."""
    playwright_ok = CHROMIUM.exists()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        playwright_ok = False
    if playwright_ok:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=str(CHROMIUM), args=["--headless", "--no-sandbox", "--disable-gpu"]
            )
            page = browser.new_page(viewport={"width": 1366, "height": 900})
            page.goto(f"{instance.url}/approvals/")
            page.fill("#id_username", "operator")
            page.fill("#id_password", password)
            page.click("button[type=submit]")
            page.click(f"a[href='/approvals/{intent_id}/']")
            page.fill("#approve-reason", "tutorial: the customer asked for it")
            page.click("button.approve")
            page.wait_for_selector("text=approved by operator", timeout=15_000)
            browser.close()
        return "chromium"
    with httpx.Client(base_url=instance.url, follow_redirects=True, timeout=15) as client:
        login = client.get("/login/?next=/approvals/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text)
        assert token, login.text
        signed_in = client.post(
            "/login/",
            data={
                "username": "operator",
                "password": password,
                "next": "/approvals/",
                "csrfmiddlewaretoken": token.group(1),
            },
            headers={"Referer": f"{instance.url}/login/"},
        )
        assert f"/approvals/{intent_id}/" in signed_in.text, "the charge is not in the Approvals inbox"
        page = client.get(f"/approvals/{intent_id}/")
        assert "Approve this payload" in page.text
        request_hash = re.search(r'name="request_hash" value="([0-9a-f]{64})"', page.text)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert request_hash and token
        answer = client.post(
            f"/approvals/{intent_id}/approve",
            data={
                "request_hash": request_hash.group(1),
                "reason": "tutorial: the customer asked for it",
                "csrfmiddlewaretoken": token.group(1),
            },
            headers={"Referer": f"{instance.url}/approvals/{intent_id}/"},
        )
        assert answer.status_code == 200, answer.text[:2000]
    return "form post (no Chromium)"


# --- the run ---------------------------------------------------------------------------------


def _intent(instance: Instance, token: str, intent_id: str) -> dict[str, Any]:
    answer = httpx.get(
        f"{instance.url}/api/v1/intents/{intent_id}", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def wait_for_status(
    instance: Instance, token: str, intent_id: str, status: str, seconds: float = 90
) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while True:
        intent = _intent(instance, token, intent_id)
        if intent["status"] == status:
            return intent
        assert time.monotonic() < deadline, f"{intent_id} is {intent['status']}, not {status}: {intent}"
        time.sleep(0.5)


class Tutorial:
    def __init__(self, instance: Instance) -> None:
        self.instance = instance
        self.token = instance.printed(r"demo agent token \(tenant demo\): (\S+)")
        self.password = instance.printed(r"console account: operator / (\S+)")

    def substitute(self, text: str) -> str:
        text = text.replace(f"127.0.0.1:{TUTORIAL_PORTS['web']}", f"127.0.0.1:{self.instance.web}")
        text = text.replace(f"127.0.0.1:{TUTORIAL_PORTS['sandbox']}", f"127.0.0.1:{self.instance.sandbox}")
        return re.sub(r"^export TOKEN=\S+$", f"export TOKEN={self.token}", text)


def _reads_only(command: str) -> bool:
    return "-X POST" not in command and "manage.py" not in command and "=" not in command.split()[0]


def test_the_tutorial_runs(quickstart: Instance) -> None:
    steps = tutorial_steps(TUTORIAL.read_text(encoding="utf-8"))
    tutorial = Tutorial(quickstart)
    assert output_matches(
        [tutorial.substitute(line) for line in steps[0].expected], "\n".join(quickstart.reader.all)
    ), "quick start did not print what the tutorial shows:\n" + "\n".join(quickstart.reader.all[:30])
    shell = Shell(quickstart.env)
    approved_by = ""
    try:
        for step in steps[1:]:
            if step.section.endswith(BROWSER_SECTION) and not approved_by:
                charge = shell.run("echo $CHARGE")[1].strip()
                assert wait_for_status(quickstart, tutorial.token, charge, "AWAITING_APPROVAL")
                approved_by = approve_in_browser(quickstart, charge, tutorial.password)
                # then: the charge ends SUCCEEDED, approved by the operator
                intent = wait_for_status(quickstart, tutorial.token, charge, "SUCCEEDED")
                assert intent["outcome"]["provider_reference"].startswith("ch_")
                assert "operator" in str(intent["resolution"])
            command = tutorial.substitute(step.command)
            expected = [tutorial.substitute(line) for line in step.expected]
            deadline = time.monotonic() + (60 if _reads_only(command) else 0)
            while True:
                status, output = shell.run(command)
                assert status == 0, f"{command}\nexited {status}:\n{output}"
                if output_matches(expected, output) or time.monotonic() >= deadline:
                    break
                time.sleep(1)
            assert output_matches(expected, output), f"{command}\nprinted:\n{output}\nnot:\n" + "\n".join(
                expected
            )
            if "_sandbox/faults" not in command and command.startswith("EMAIL=$("):
                email = shell.run("echo $EMAIL")[1].strip()
                # then: the provider's silence makes it UNKNOWN, and it stays so
                wait_for_status(quickstart, tutorial.token, email, "UNKNOWN")
        assert approved_by, f"no section {BROWSER_SECTION!r} in the tutorial"
        # then: the email, resolved absent, was sent again once and SUCCEEDED
        email = shell.run("echo $EMAIL")[1].strip()
        intent = wait_for_status(quickstart, tutorial.token, email, "SUCCEEDED")
        assert intent["resolution"], intent
        ledger = httpx.get(
            f"http://127.0.0.1:{quickstart.sandbox}/ledger",
            params={"product": "email", "reference": "tutorial-welcome-1"},
            timeout=10,
        ).json()
        assert len(ledger["effects"]) == 1, ledger
        # and the audit trail on the intent's console page shows the operator's decision
        with httpx.Client(base_url=quickstart.url, follow_redirects=True, timeout=15) as client:
            login = client.get("/login/")
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text)
            assert token
            client.post(
                "/login/",
                data={
                    "username": "operator",
                    "password": tutorial.password,
                    "next": "/",
                    "csrfmiddlewaretoken": token.group(1),
                },
                headers={"Referer": f"{quickstart.url}/login/"},
            )
            page = client.get(f"/intents/{email}/")
            assert page.status_code == 200
            assert (
                "the provider&#x27;s ledger has no such email" in page.text
                or "the provider's ledger has no such email" in page.text
            )
    finally:
        shell.close()
    print(f"tutorial approved by: {approved_by}")
