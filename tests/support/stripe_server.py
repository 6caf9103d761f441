"""localstripe (PyPI: a stateful fake Stripe server written by others) as a real process on
loopback, and the shipped Stripe declaration (``docs/providers/stripe.json``) pointed at it.

``localstripe_server`` (session scope) starts ``python -m tests.support.stripe_server`` on a free
loopback port; ``localstripe`` (function scope) empties it (``DELETE /_config/data``), creates a
customer with a card and points ``STRIPE_SECRET_KEY`` at a test key. The process is started here
rather than through ``localstripe``'s own ``start()``, which binds ``::`` (every interface) and
loads and writes ``/tmp/localstripe.pickle`` (state shared with any other run on the machine):
this one listens on 127.0.0.1 only and keeps its state in memory.

What localstripe does, and real Stripe does not: it ignores ``Idempotency-Key`` (a repeated key
makes a second charge) and sends no events for charges. The tests declare what it does
(``"deduplicates": false``), as ``manage.py provider_probe`` finds.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.processes import stop_process

BASE_DIR = Path(__file__).resolve().parents[2]
#: The Stripe declaration a user copies.
STRIPE_DECLARATION = BASE_DIR / "docs" / "providers" / "stripe.json"
#: The base URL the shipped declaration names (real Stripe).
STRIPE_API = "https://api.stripe.com"
#: localstripe takes any secret key that starts with ``sk_`` (its auth middleware).
TEST_SECRET_KEY = "sk_test_effect_ledger_localstripe"
READY_PREFIX = "localstripe listening on "
START_TIMEOUT_SECONDS = 30.0


def stripe_declaration(base_url: str, **changes: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The shipped ``docs/providers/stripe.json`` with its ``https://api.stripe.com`` prefix
    replaced by ``base_url`` (in every action's ``url`` and ``lookup.url``), and each action's
    entry updated with ``changes[action]`` (top-level keys replaced, e.g.
    ``{"keys": {"header": "Idempotency-Key", "deduplicates": False}}``).

    The settings file is read verbatim (``EFFECT_LEDGER_GENERIC_HTTP_FILE``, console/settings_ledger.py),
    so the base URL cannot be a parameter of the file: the tests rewrite it here, never the
    product.
    """
    declared: dict[str, dict[str, Any]] = json.loads(STRIPE_DECLARATION.read_text())
    for action, entry in declared.items():
        entry["url"] = entry["url"].replace(STRIPE_API, base_url, 1)
        if "lookup" in entry:
            entry["lookup"]["url"] = entry["lookup"]["url"].replace(STRIPE_API, base_url, 1)
        entry.update(changes.get(action, {}))
    return declared


class LocalStripe:
    """A running localstripe process and a client of its API (a test secret key).

    Attributes:
        url: ``http://127.0.0.1:PORT``.
        process: its ``subprocess.Popen``.
    """

    def __init__(self, url: str, process: subprocess.Popen[str], log_path: Path) -> None:
        self.url = url
        self.process = process
        self.log_path = log_path
        self.client = httpx.Client(
            base_url=url, timeout=10.0, headers={"Authorization": f"Bearer {TEST_SECRET_KEY}"}
        )

    def flush(self) -> None:
        """Forget every object (``DELETE /_config/data``)."""
        self.client.delete("/_config/data").raise_for_status()

    def customer_with_card(self) -> str:
        """Create a customer whose default source is a Visa test card; returns ``cus_...``."""
        card = {"card[number]": "4242424242424242", "card[exp_month]": "12", "card[exp_year]": "2040",
                "card[cvc]": "123"}  # fmt: skip
        token = self.client.post("/v1/tokens", data=card)
        token.raise_for_status()
        customer = self.client.post("/v1/customers", data={"source": token.json()["id"]})
        customer.raise_for_status()
        customer_id: str = customer.json()["id"]
        return customer_id

    def charges(self, customer: str | None = None) -> list[dict[str, Any]]:
        """Every charge localstripe holds (of ``customer``), newest first."""
        params = {"limit": "100", **({"customer": customer} if customer else {})}
        response = self.client.get("/v1/charges", params=params)
        response.raise_for_status()
        charges: list[dict[str, Any]] = response.json()["data"]
        return charges

    def refunds(self, charge: str) -> list[dict[str, Any]]:
        """Every refund of ``charge``."""
        response = self.client.get("/v1/refunds", params={"charge": charge, "limit": "100"})
        response.raise_for_status()
        refunds: list[dict[str, Any]] = response.json()["data"]
        return refunds

    def stop(self) -> None:
        """SIGTERM the process and wait for it (SIGKILL after 10 seconds)."""
        self.client.close()
        stop_process(self.process)


def start_localstripe() -> LocalStripe:
    """Start ``python -m tests.support.stripe_server`` and wait for its readiness line.

    Raises:
        RuntimeError: it exited or did not announce itself within 30 seconds (with its output).
    """
    log = tempfile.NamedTemporaryFile(prefix="localstripe-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.stripe_server"],
        cwd=BASE_DIR,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    lines: list[str] = []
    ready = threading.Event()

    def drain() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if line.startswith(READY_PREFIX):
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not ready.wait(0.1) and time.monotonic() < deadline:
        pass
    url = next((line[len(READY_PREFIX) :].strip() for line in lines if line.startswith(READY_PREFIX)), None)
    if url is None:
        process.kill()
        process.wait(timeout=5)
        log.close()
        raise RuntimeError(f"localstripe did not start:\n{Path(log.name).read_text()[-4000:]}")
    return LocalStripe(url, process, Path(log.name))


@pytest.fixture(scope="session")
def localstripe_server() -> Iterator[LocalStripe]:
    """One localstripe process for the session, on a free loopback port."""
    server = start_localstripe()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def localstripe(localstripe_server: LocalStripe, monkeypatch: pytest.MonkeyPatch) -> LocalStripe:
    """The session's localstripe, emptied, with ``STRIPE_SECRET_KEY`` set to a test key (the
    secret the declaration names)."""
    localstripe_server.flush()
    monkeypatch.setenv("STRIPE_SECRET_KEY", TEST_SECRET_KEY)
    return localstripe_server


def _serve() -> None:  # pragma: no cover - runs in the child process
    """Serve localstripe's aiohttp app on 127.0.0.1, a kernel-chosen port, state in memory."""
    import localstripe.resources
    from aiohttp import web

    # localstripe writes its whole store to /tmp/localstripe.pickle on every change; a test
    # server keeps it in memory (and never shares it with another run).
    localstripe.resources.Store.dump_to_disk = lambda self: None  # type: ignore[method-assign]
    # its webhook sender says on this logger whether each delivery was answered 2xx (stderr: the log)
    import logging

    from localstripe.server import app

    sender = logging.getLogger("aiohttp.access")
    sender.setLevel(logging.INFO)
    sender.addHandler(logging.StreamHandler())
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    print(f"{READY_PREFIX}http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    web.run_app(app, sock=sock, print=None, access_log=None)


if __name__ == "__main__":
    _serve()
