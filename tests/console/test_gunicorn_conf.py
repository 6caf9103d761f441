"""Issue 12, item 3: gunicorn run with the project's settings never believes a client's
``X-Forwarded-Proto`` unless told to (a real gunicorn process)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serve(tmp_path: Path, **env: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", "python:console.gunicorn_conf", "console.wsgi",
         "-b", f"127.0.0.1:{port}", "-w", "1", "--no-control-socket"],
        cwd=ROOT,
        env={**os.environ, "EFFECT_LEDGER_HTTPS": "1", "EFFECT_LEDGER_DATA_DIR": str(tmp_path), **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            return process, url
        except httpx.HTTPError:
            time.sleep(0.2)
    process.kill()
    raise AssertionError("gunicorn did not start")


@pytest.mark.parametrize(
    "header", [{"X-Forwarded-Proto": "https"}, {"X-Forwarded-Ssl": "on"}, {"X-Forwarded-Protocol": "ssl"}]
)
def test_i12_3_a_spoofed_forwarded_proto_from_localhost_is_not_believed(
    tmp_path: Path, header: dict[str, str]
) -> None:
    process, url = _serve(tmp_path)
    try:
        # when: a client on the same host (where gunicorn trusts forwarders by default) claims https
        response = httpx.get(f"{url}/login/", headers=header, follow_redirects=False)
        # then: still plain http to Django: redirected, no HSTS
        assert response.status_code == 301
        assert "strict-transport-security" not in response.headers
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_i12_3_with_trust_on_the_proxy_header_is_believed(tmp_path: Path) -> None:
    process, url = _serve(tmp_path, EFFECT_LEDGER_TRUST_X_FORWARDED_PROTO="1")
    try:
        response = httpx.get(f"{url}/login/", headers={"X-Forwarded-Proto": "https"}, follow_redirects=False)
        assert response.status_code == 200
        assert "strict-transport-security" in response.headers
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_i15_workers_are_gthread_with_threads_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # A ?wait= request holds its thread for up to 30 s: a sync worker would serve nothing else meanwhile.
    import importlib

    import console.gunicorn_conf as conf

    monkeypatch.delenv("EFFECT_LEDGER_WEB_THREADS", raising=False)
    assert (importlib.reload(conf).worker_class, conf.threads) == ("gthread", 8)
    monkeypatch.setenv("EFFECT_LEDGER_WEB_THREADS", "3")
    assert importlib.reload(conf).threads == 3
    monkeypatch.setenv("EFFECT_LEDGER_WEB_THREADS", "0")
    with pytest.raises(ValueError, match="EFFECT_LEDGER_WEB_THREADS"):
        importlib.reload(conf)
    monkeypatch.delenv("EFFECT_LEDGER_WEB_THREADS")
    importlib.reload(conf)
