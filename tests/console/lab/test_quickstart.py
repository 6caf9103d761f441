"""quickstart's supervised processes: the environment they start with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from console.lab.management.commands import quickstart

OPTIONS = {"port": 8410, "sandbox_port": 8865, "workers": 1, "mcp_port": 8866}


class _Supervisord:
    """Stands in for the supervisord process: records the environment it was started with."""

    started: list[dict[str, str]] = []

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.started.append(env)
        self.returncode = 0

    def wait(self) -> int:
        return 0


def supervised_environment(tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment quickstart's ``_run`` hands supervisord (and so every program) on
    ``OPTIONS``; nothing is started."""
    settings.DATA_DIR = str(tmp_path)
    _Supervisord.started = []
    monkeypatch.setattr(quickstart.subprocess, "Popen", _Supervisord)
    monkeypatch.setattr(quickstart.signal, "signal", lambda *args: None)
    with pytest.raises(SystemExit) as exited:
        quickstart.Command()._run(OPTIONS)
    assert exited.value.code == 0
    (env,) = _Supervisord.started
    return env


def test_quickstart_on_another_port_links_notices_to_that_port(
    tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: no public address set
    monkeypatch.delenv("EFFECT_LEDGER_PUBLIC_URL", raising=False)
    # when: quickstart --port 8410
    env = supervised_environment(tmp_path, settings, monkeypatch)
    # then: the worker and beat build deep links to the console it runs
    assert env["EFFECT_LEDGER_PUBLIC_URL"] == "http://127.0.0.1:8410"


def test_quickstart_keeps_a_public_address_the_user_set(
    tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given
    monkeypatch.setenv("EFFECT_LEDGER_PUBLIC_URL", "https://ledger.example.test")
    # when
    env = supervised_environment(tmp_path, settings, monkeypatch)
    # then
    assert env["EFFECT_LEDGER_PUBLIC_URL"] == "https://ledger.example.test"


def test_quickstart_hands_its_webhook_networks_to_the_processes_it_starts(
    tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: embedded mode's loopback default in this process (quickstart itself has no
    # DATABASE_URL in the environment, the processes it starts do)
    settings.EFFECT_LEDGER = {
        **settings.EFFECT_LEDGER,
        "WEBHOOK_ALLOWED_NETWORKS": ["127.0.0.0/8", "::1/128"],
    }
    # when
    env = supervised_environment(tmp_path, settings, monkeypatch)
    # then: the web and worker processes allow the same networks (a third reviewer's loopback
    # receiver was refused: they saw DATABASE_URL and took the production default, none)
    assert env["EFFECT_LEDGER_WEBHOOK_ALLOWED_NETWORKS"] == "127.0.0.0/8,::1/128"


def test_i19_quickstart_points_the_sandboxs_events_at_its_web_process(tmp_path: Path) -> None:
    # when
    programs = quickstart.Command()._programs(OPTIONS, tmp_path)

    # then: the sandbox POSTs its signed events to the ledger it runs beside
    assert programs["sandbox"].endswith(
        "sandbox_provider --port 8865 --events-url http://127.0.0.1:8410/providers/"
    )


def test_i39_7_quickstart_prints_each_notice_at_the_senders_next_pass(
    tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: no interval set
    monkeypatch.delenv("EFFECT_LEDGER_NOTIFY_INTERVAL_SECONDS", raising=False)
    # when
    env = supervised_environment(tmp_path, settings, monkeypatch)
    # then: no rate limit per recipient here (the tutorial's "about 15 s" holds for a second
    # notice too; the production default of 300 s would hold it up to five minutes)
    assert env["EFFECT_LEDGER_NOTIFY_INTERVAL_SECONDS"] == "0"
    # and a value the user set is kept
    monkeypatch.setenv("EFFECT_LEDGER_NOTIFY_INTERVAL_SECONDS", "60")
    assert (
        supervised_environment(tmp_path, settings, monkeypatch)["EFFECT_LEDGER_NOTIFY_INTERVAL_SECONDS"]
        == "60"
    )
