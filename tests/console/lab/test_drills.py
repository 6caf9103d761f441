"""The Drills page lists crash-lab and acceptance evidence; only admins can start a drill."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from console.lab.drills import drill_command
from console.lab.models import DrillRun
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def row(strategy: str, effects: int, missing: int, problems: list[str]) -> dict[str, Any]:
    return {"strategy": strategy, "provider": "payments", "boundary": "after-effect", "ops": 20, "effects": effects,
            "missing": missing, "duplicates": effects - 20 + missing, "requests": effects, "kills": 2,
            "problems": problems}  # fmt: skip


def test_drills_page_shows_tables_and_checks(viewer_client: Client) -> None:
    # given
    DrillRun.objects.create(
        kind="crashlab", started_at=timezone.now(), finished_at=timezone.now(), passed=False,
        result={"rows": [row("retry", 22, 0, []), row("ledger", 21, 0, ["21 effects for 20 operations"])]},
    )  # fmt: skip
    DrillRun.objects.create(
        kind="acceptance", started_at=timezone.now(), finished_at=timezone.now(), passed=True,
        result={"checks": [{"name": "two deliveries, one effect", "passed": True, "detail": "1 effect"}],
                "metrics": {"safe_effects": 1}},
    )  # fmt: skip
    # when
    response = viewer_client.get("/drills/")
    # then
    body = response.content.decode()
    assert response.status_code == 200
    assert "21 effects for 20 operations" in body and "FAIL" in body
    assert "two deliveries, one effect" in body and "safe_effects" in body
    assert "Run the acceptance gate" not in body  # viewers cannot start drills


def test_only_admins_can_start_a_drill(
    viewer_client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks() as callbacks:
        response = viewer_client.post("/drills/start", {"kind": "acceptance"}, follow=True)
    assert "Only admins of every tenant can start a drill." in response.content.decode()
    assert callbacks == []


def test_admin_starting_an_unknown_kind_is_refused(db: Any, django_capture_on_commit_callbacks: Any) -> None:
    client = Client()
    client.force_login(UserFactory(groups=["admin"]))
    with django_capture_on_commit_callbacks() as callbacks:
        response = client.post("/drills/start", {"kind": "delete-production"}, follow=True)
    assert "unknown drill kind" in response.content.decode()
    assert callbacks == []


def test_admin_start_queues_the_drill_after_commit(
    db: Any, django_capture_on_commit_callbacks: Any, settings: Any
) -> None:
    settings.CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:5672//"  # a broker drills survive
    client = Client()
    client.force_login(UserFactory(groups=["admin"]))
    with django_capture_on_commit_callbacks() as callbacks:
        response = client.post("/drills/start", {"kind": "crashlab"}, follow=True)
    assert response.content.decode().count("queued") == 1  # shown once, not twice
    assert len(callbacks) == 1  # the task is sent only once the request's transaction commits


def test_a_drill_is_refused_on_the_filesystem_broker_before_anything_is_queued(
    db: Any, django_capture_on_commit_callbacks: Any, settings: Any
) -> None:
    # given: quickstart's default broker, which a drill's killed workers do not survive
    settings.CELERY_BROKER_URL = "filesystem://"
    client = Client()
    client.force_login(UserFactory(groups=["admin"]))
    # when
    with django_capture_on_commit_callbacks() as callbacks:
        response = client.post("/drills/start", {"kind": "acceptance"}, follow=True)
    # then: the reason is shown, nothing is queued, no run is recorded
    body = response.content.decode()
    assert "filesystem transport does not survive" in body and "CELERY_BROKER_URL" in body
    assert callbacks == []
    assert not DrillRun.objects.exists()


def test_drill_commands_target_the_lab_only() -> None:
    assert drill_command(kind="acceptance", requested_by="user:a")[-1] == "--acceptance"
    assert drill_command(kind="crashlab", requested_by="user:a")[-2:] == ["--ops", "20"]


def test_a_refused_drill_is_recorded_with_its_reason(db: Any, monkeypatch: Any) -> None:
    # given: the drill's command refuses to run (here: an unknown argument makes it exit 2)
    import console.lab.drills as drills

    original = drills.drill_command
    monkeypatch.setattr(drills, "drill_command", lambda **kwargs: [*original(**kwargs), "--no-such-flag"])
    # when
    code = drills.run_drill("crashlab", "user:admin")
    # then: not run, with the reason; never a FAIL (issue 16 item 7)
    run = DrillRun.objects.get()
    assert code != 0 and run.passed is None and run.outcome == "not_run"
    assert "no-such-flag" in run.not_run_reason and run.finished_at is not None


# --- issue 16 item 7: drills the broker cannot run are disabled; a run that could not start is
# "not run", never "FAIL".


def admin_client() -> Client:
    client = Client()
    client.force_login(UserFactory(groups=["admin"]))
    return client


def test_i16_7_drills_page_under_the_default_broker_disables_the_buttons_with_the_reason(
    db: Any, settings: Any
) -> None:
    # given: quickstart's default broker (CELERY_BROKER_URL unset: kombu's filesystem transport)
    settings.CELERY_BROKER_URL = "filesystem://"
    # when
    body = admin_client().get("/drills/").content.decode()
    # then: both buttons are disabled and the page says why
    assert body.count("disabled") == 2
    assert 'id="drills-unavailable"' in body and "filesystem transport does not survive" in body
    assert "CELERY_BROKER_URL" in body


def test_i16_7_drills_page_under_a_real_broker_enables_the_buttons(db: Any, settings: Any) -> None:
    settings.CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:5672//"
    body = admin_client().get("/drills/").content.decode()
    assert "Run the acceptance gate" in body and "disabled" not in body
    assert 'id="drills-unavailable"' not in body


def test_i16_7_posting_a_drill_under_the_default_broker_is_refused_with_nothing_queued(
    db: Any, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    # given
    settings.CELERY_BROKER_URL = "filesystem://"
    client = admin_client()
    # when: a drill is posted anyway (a stale page, a hand-made request), for both kinds
    with django_capture_on_commit_callbacks() as callbacks:
        responses = [
            client.post("/drills/start", {"kind": kind}, follow=True) for kind in ("acceptance", "crashlab")
        ]
    # then: refused with the reason, nothing queued, nothing recorded (no FAIL, no "not run")
    for response in responses:
        assert response.status_code == 200
        assert "cannot run here" in response.content.decode()
    assert callbacks == []
    assert not DrillRun.objects.exists()


def test_i16_7_a_drill_command_that_cannot_start_is_not_run(db: Any, monkeypatch: Any) -> None:
    # given: the drill's command does not exist (the interpreter moved, a broken install)
    import console.lab.drills as drills

    monkeypatch.setattr(drills, "drill_command", lambda **kwargs: ["/nonexistent/python", "manage.py"])
    # when
    code = drills.run_drill("acceptance", "user:admin")
    # then
    run = DrillRun.objects.get()
    assert code != 0 and run.outcome == "not_run" and run.passed is None
    assert "could not start" in run.not_run_reason


def test_i16_7_a_drill_refused_by_the_broker_check_is_shown_as_not_run(
    db: Any, settings: Any, monkeypatch: Any, viewer_client: Client
) -> None:
    # given: the worker ran the real command under the filesystem broker (it refuses at once)
    import console.lab.drills as drills

    settings.CELERY_BROKER_URL = "filesystem://"
    monkeypatch.setenv("CELERY_BROKER_URL", "filesystem://")  # the command's own settings
    code = drills.run_drill("acceptance", "user:admin")
    # when
    body = viewer_client.get("/drills/").content.decode()
    # then: "not run" with the reason, and no FAIL anywhere
    run = DrillRun.objects.get()
    assert code != 0 and run.outcome == "not_run"
    assert "filesystem transport does not survive" in run.not_run_reason
    assert "not run" in body and "FAIL" not in body and "filesystem transport does not survive" in body


#: A RabbitMQ URL for tests whose lab never reaches the broker: they pass the check that refuses
#: kombu's filesystem transport, on a machine with no broker too (the README's test command).
UNUSED_REAL_BROKER = "amqp://guest:guest@127.0.0.1:1//"


def test_i16_7_a_crash_lab_whose_cluster_cannot_start_is_not_run(
    db: Any, monkeypatch: Any, settings: Any
) -> None:
    # given: the lab's sandbox provider exits at start (here: its command is made to fail), past
    # the broker check (a real broker named: nothing reaches it)
    from django.core.management import CommandError, call_command

    settings.CELERY_BROKER_URL = UNUSED_REAL_BROKER
    from console.lab.cluster import HarnessError
    from console.lab.crashlab import runner

    def sandbox_exits(self: Any, **kwargs: Any) -> str:
        raise HarnessError("sandbox provider exited:\naddress already in use")

    monkeypatch.setattr(runner.LocalCluster, "start_sandbox", sandbox_exits)
    # when
    with pytest.raises(CommandError, match="not run"):
        call_command("crashlab", "--ops", "10", "--requested-by", "user:admin")
    # then
    run = DrillRun.objects.get()
    assert run.outcome == "not_run" and run.passed is None and "address already in use" in run.not_run_reason


def test_i16_7_a_real_fail_is_still_fail(
    db: Any, monkeypatch: Any, viewer_client: Client, settings: Any
) -> None:
    # given: a crash lab whose ledger row shows a duplicate (a safety violation), measured by a
    # lab whose cluster is replaced by the numbers it would have counted (past the broker
    # check: a real broker named, never reached)
    from django.core.management import call_command

    settings.CELERY_BROKER_URL = UNUSED_REAL_BROKER
    from console.lab.crashlab import verdict
    from console.lab.management.commands import crashlab as command

    class DuplicatingLab:
        def __init__(self, config: Any) -> None:
            self.config = config

        def __enter__(self) -> DuplicatingLab:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def run(self) -> list[verdict.Row]:
            return [verdict.Row(strategy="ledger", boundary="after-effect", provider="payments", ops=10,
                                interrupted=1, effects=11, missing=0, duplicates=1, active=11, requests=11,
                                kills=1)]  # fmt: skip

    monkeypatch.setattr(command, "CrashLab", DuplicatingLab)
    # when
    with pytest.raises(SystemExit):
        call_command("crashlab", "--ops", "10", "--boundaries", "after-effect", "--strategies", "ledger",
                     "--no-variants", "--requested-by", "user:admin")  # fmt: skip
    body = viewer_client.get("/drills/").content.decode()
    # then: FAIL, not "not run"
    run = DrillRun.objects.get()
    assert run.passed is False and run.outcome == "fail" and run.not_run_reason == ""
    assert "FAIL" in body and "not run" not in body
